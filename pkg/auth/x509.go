package auth

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"
)

// DefaultReloadInterval is how often, at most, a CA file is read again to
// see whether it changed.
const DefaultReloadInterval = time.Second

// CertOptions configures a CertAuthenticator.
type CertOptions struct {
	// CAFile holds the PEM CA certificates that sign client certificates
	// (--client-ca-file). It is read again when it changes, so the CA
	// rotates without a restart; a change that does not parse is logged and
	// the last good CAs stay in use.
	CAFile string
	// ReloadInterval is how often, at most, CAFile is read again; zero
	// means DefaultReloadInterval.
	ReloadInterval time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil means time.Now (tests set it).
	Now func() time.Time
}

// CertAuthenticator verifies client certificates against a CA file and
// names their user as Kubernetes does: the subject's common name is the
// user, its organizations are the groups.
type CertAuthenticator struct {
	o CertOptions

	mu        sync.Mutex
	lastCheck time.Time
	pem       []byte
	pool      *x509.CertPool
}

// NewCertAuthenticator reads o.CAFile and returns the authenticator; a
// missing or empty CA file is an error.
func NewCertAuthenticator(o CertOptions) (*CertAuthenticator, error) {
	if o.CAFile == "" {
		return nil, errors.New("certificate authentication needs a CA file (--client-ca-file)")
	}
	if o.ReloadInterval <= 0 {
		o.ReloadInterval = DefaultReloadInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	a := &CertAuthenticator{o: o}
	b, pool, err := loadCAs(o.CAFile)
	if err != nil {
		return nil, err
	}
	a.pem, a.pool, a.lastCheck = b, pool, o.Now()
	return a, nil
}

func loadCAs(path string) ([]byte, *x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("client CA file (--client-ca-file): %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, nil, fmt.Errorf("client CA file %s (--client-ca-file) holds no PEM certificate", path)
	}
	return b, pool, nil
}

// roots returns the current CA pool, reading the file again when the
// reload interval has passed and its content changed.
func (a *CertAuthenticator) roots() *x509.CertPool {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.o.Now()
	if now.Sub(a.lastCheck) < a.o.ReloadInterval {
		return a.pool
	}
	a.lastCheck = now
	b, err := os.ReadFile(a.o.CAFile)
	if err != nil {
		a.o.Logger.Warn("client CA file unreadable; keeping the CAs loaded before", "file", a.o.CAFile, "error", err)
		return a.pool
	}
	if bytes.Equal(b, a.pem) {
		return a.pool
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		a.o.Logger.Warn("client CA file holds no PEM certificate; keeping the CAs loaded before", "file", a.o.CAFile)
		return a.pool
	}
	a.pem, a.pool = b, pool
	a.o.Logger.Info("client CA file reloaded", "file", a.o.CAFile)
	return a.pool
}

// AuthenticateCert verifies a client's certificate chain (leaf first, as
// tls.ConnectionState.PeerCertificates gives it) for client authentication
// and returns its user. An error wraps ErrInvalid when the chain does not
// verify.
func (a *CertAuthenticator) AuthenticateCert(chain []*x509.Certificate) (User, error) {
	if len(chain) == 0 {
		return User{}, fmt.Errorf("%w: no client certificate", ErrInvalid)
	}
	leaf := chain[0]
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         a.roots(),
		Intermediates: inter,
		CurrentTime:   a.o.Now(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return User{}, fmt.Errorf("%w: client certificate %q does not verify against the client CA: %v", ErrInvalid, leaf.Subject.CommonName, err)
	}
	if leaf.Subject.CommonName == "" {
		return User{}, fmt.Errorf("%w: client certificate has no common name to use as the user name", ErrInvalid)
	}
	// As the API server does, every authenticated user is also in
	// system:authenticated.
	groups := append([]string(nil), leaf.Subject.Organization...)
	if !slices.Contains(groups, AuthenticatedGroup) {
		groups = append(groups, AuthenticatedGroup)
	}
	return User{Name: leaf.Subject.CommonName, Groups: groups}, nil
}
