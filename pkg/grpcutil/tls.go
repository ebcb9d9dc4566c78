package grpcutil

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/volplane/volplane/pkg/metrics"
)

// TLSFiles names the PEM files of a volplane service's mutual TLS: the CA
// that signs every volplane service's certificate, and this service's own
// certificate and key. The same files serve (the server presents CertFile
// and requires a client certificate signed by CAFile) and dial (the client
// verifies the server against CAFile and presents CertFile).
//
// The files are read again when they change (checked at most once every
// ReloadInterval, on a new connection), so certificates rotate without a
// restart; a change that does not load (a key that does not match its
// certificate, half-written files) is logged and the last good material
// stays in use.
type TLSFiles struct {
	// CAFile holds the CA certificates, PEM, that sign the peers'
	// certificates (--tls-ca-file).
	CAFile string
	// CertFile holds this service's certificate, PEM, followed by any
	// intermediates (--tls-cert-file). A certificate for a service carries
	// its DNS names and IP addresses, and both the server and client auth
	// extended key usages.
	CertFile string
	// KeyFile holds CertFile's private key, PEM (--tls-key-file).
	KeyFile string
	// InsecurePlaintext turns TLS off: the server accepts anyone, the
	// client verifies nobody (--insecure-plaintext). It is for local
	// experiments and unit tests over unix sockets only: a volplane service
	// that serves plaintext lets whoever reaches its port delete volumes.
	// It is exclusive with the files.
	InsecurePlaintext bool
}

// ReloadInterval is how often, at most, the TLS files are read again to see
// whether they changed.
const ReloadInterval = time.Second

// Validate checks that f names all three files, or chooses plaintext
// explicitly; the error names the flags to set.
func (f TLSFiles) Validate() error {
	set := f.CAFile != "" || f.CertFile != "" || f.KeyFile != ""
	switch {
	case f.InsecurePlaintext && set:
		return errors.New("TLS files and plaintext are exclusive: drop --insecure-plaintext, or the --tls-ca-file, --tls-cert-file and --tls-key-file flags")
	case f.InsecurePlaintext:
		return nil
	case f.CAFile == "" || f.CertFile == "" || f.KeyFile == "":
		return errors.New("mutual TLS between volplane services needs --tls-ca-file (the CA signing every service), --tls-cert-file and --tls-key-file (this service's certificate and key); " +
			"--insecure-plaintext turns TLS off, for local experiments only")
	}
	return nil
}

// ValidateListenAndTLS checks the two settings every volplane process that
// listens and talks to the services shares: a listen address (--listen)
// and its mutual TLS (f.Validate). Each error names the flags to set; the
// caller adds its own checks and joins them.
func ValidateListenAndTLS(listen string, f TLSFiles) []error {
	var errs []error
	if listen == "" {
		errs = append(errs, errors.New("a listen address is required (--listen)"))
	}
	if err := f.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// ServerCredentials returns gRPC transport credentials that serve f's
// certificate and require a client certificate signed by f's CA, both
// reloaded when the files change. It reads the files once now and fails if
// they do not load.
func (f TLSFiles) ServerCredentials() (credentials.TransportCredentials, error) {
	r, err := reloaderFor(f)
	if err != nil {
		return nil, err
	}
	return &reloadingCreds{r: r, server: true}, nil
}

// ClientCredentials returns gRPC transport credentials that verify the
// server's certificate against f's CA (for the host of the dial target)
// and present f's certificate, both reloaded when the files change. It
// reads the files once now and fails if they do not load.
func (f TLSFiles) ClientCredentials() (credentials.TransportCredentials, error) {
	r, err := reloaderFor(f)
	if err != nil {
		return nil, err
	}
	return &reloadingCreds{r: r}, nil
}

// ServerConfig returns a crypto/tls server configuration for an HTTPS
// listener that presents f's certificate and verifies client certificates
// against f's CA when clientAuth asks for them, both reloaded when the
// files change.
func (f TLSFiles) ServerConfig(clientAuth tls.ClientAuthType) (*tls.Config, error) {
	r, err := reloaderFor(f)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := r.serverConfig()
			c.ClientAuth = clientAuth
			return c, nil
		},
	}, nil
}

// ClientConfig returns a crypto/tls client configuration that verifies
// servers against f's CA and presents f's certificate, as read now (for an
// HTTPS client; gRPC clients use ClientCredentials, which reloads).
func (f TLSFiles) ClientConfig() (*tls.Config, error) {
	r, err := reloaderFor(f)
	if err != nil {
		return nil, err
	}
	return r.clientConfig(), nil
}

// reloadingCreds is a TLS TransportCredentials whose configuration is
// rebuilt from the reloader's current material for every handshake.
type reloadingCreds struct {
	r      *reloader
	server bool
}

var _ credentials.TransportCredentials = (*reloadingCreds)(nil)

func (c *reloadingCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.r.clientConfig()).ClientHandshake(ctx, authority, conn)
}

func (c *reloadingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.r.serverConfig()).ServerHandshake(conn)
}

func (c *reloadingCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (c *reloadingCreds) Clone() credentials.TransportCredentials {
	return &reloadingCreds{r: c.r, server: c.server}
}

// OverrideServerName is deprecated in gRPC and not supported: the server
// name is the dial target's host.
func (c *reloadingCreds) OverrideServerName(string) error {
	return errors.New("grpcutil: overriding the TLS server name is not supported")
}

// reloaders are shared by every server and client of the process that use
// the same files, so the files are read once per interval, not per
// connection.
var (
	reloadersMu sync.Mutex
	reloaders   = map[TLSFiles]*reloader{}
)

func reloaderFor(f TLSFiles) (*reloader, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if f.InsecurePlaintext {
		return nil, errors.New("grpcutil: TLS credentials asked for with --insecure-plaintext set")
	}
	reloadersMu.Lock()
	defer reloadersMu.Unlock()
	if r := reloaders[f]; r != nil {
		return r, nil
	}
	r := &reloader{files: f, checked: time.Now()}
	if _, err := r.load(); err != nil {
		return nil, err
	}
	reloaders[f] = r
	metrics.RefreshCertificatesWith(func() { r.current() })
	return r, nil
}

// reloader holds the current certificate and CA pool read from TLSFiles.
type reloader struct {
	files TLSFiles

	mu      sync.Mutex
	checked time.Time
	raw     [3][]byte // CA, certificate and key as last loaded
	cert    tls.Certificate
	pool    *x509.CertPool
	failed  [3][]byte // the contents that last failed to load, logged once
}

// load reads the files and, when they differ from the material in use,
// parses them and replaces it. It returns an error when they do not load
// (and the contents it read); the material in use stays.
func (r *reloader) load() ([3][]byte, error) {
	var raw [3][]byte
	for i, name := range []string{r.files.CAFile, r.files.CertFile, r.files.KeyFile} {
		b, err := os.ReadFile(name)
		if err != nil {
			return raw, fmt.Errorf("read TLS file: %w", err)
		}
		raw[i] = b
	}
	if r.pool != nil && same(raw, r.raw) {
		return raw, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw[0]) {
		return raw, fmt.Errorf("TLS CA file %s holds no PEM certificate (--tls-ca-file)", r.files.CAFile)
	}
	cert, err := tls.X509KeyPair(raw[1], raw[2])
	if err != nil {
		return raw, fmt.Errorf("TLS certificate %s and key %s: %w (--tls-cert-file, --tls-key-file)", r.files.CertFile, r.files.KeyFile, err)
	}
	reload := r.pool != nil
	r.raw, r.cert, r.pool = raw, cert, pool
	metrics.SetCertificates(metrics.RoleService, r.files.CertFile, chain(cert))
	metrics.SetCertificates(metrics.RoleCA, r.files.CAFile, pemCertificates(raw[0]))
	if reload {
		slog.Default().Info("TLS certificates reloaded", "cert", r.files.CertFile, "ca", r.files.CAFile,
			"subject", cert.Leaf.Subject.String(), "notAfter", cert.Leaf.NotAfter)
	}
	return raw, nil
}

// current returns the material in use, reading the files again first when
// the last check is older than ReloadInterval.
func (r *reloader) current() (tls.Certificate, *x509.CertPool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= ReloadInterval {
		r.checked = now
		// Log a given broken state once, not on every connection.
		if raw, err := r.load(); err != nil && !same(raw, r.failed) {
			r.failed = raw
			slog.Default().Error("TLS files changed but do not load; the previous certificates stay in use", "error", err)
		}
	}
	return r.cert, r.pool
}

func (r *reloader) serverConfig() *tls.Config {
	cert, pool := r.current()
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}
}

func (r *reloader) clientConfig() *tls.Config {
	cert, pool := r.current()
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
	}
}

func same(a, b [3][]byte) bool {
	return bytes.Equal(a[0], b[0]) && bytes.Equal(a[1], b[1]) && bytes.Equal(a[2], b[2])
}

// chain is a loaded certificate's leaf and intermediates, parsed (those
// that do not parse are left out: the key pair loaded, so the leaf did).
func chain(c tls.Certificate) []*x509.Certificate {
	var out []*x509.Certificate
	for _, der := range c.Certificate {
		if x, err := x509.ParseCertificate(der); err == nil {
			out = append(out, x)
		}
	}
	return out
}

// pemCertificates parses every CERTIFICATE block of a PEM bundle, as
// x509.CertPool.AppendCertsFromPEM does (skipping what does not parse).
func pemCertificates(b []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for len(b) > 0 {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			continue
		}
		if x, err := x509.ParseCertificate(block.Bytes); err == nil {
			out = append(out, x)
		}
	}
	return out
}
