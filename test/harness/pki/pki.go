// Package pki generates the certificates of volplane's development
// environment and tests: a CA and, per service, a certificate and key
// signed by it, written as PEM files that the services' --tls-* flags
// name. A service's certificate carries its identity (pkg/callers) as its
// Common Name, volplane-<service>, as deploy/kubernetes/certificates.yaml
// names them. Users' client certificates, for the gateway, come from a CA
// of their own (IssueUser), never from the services' CA, whose every
// certificate the services trust. It is not meant for production, where a
// cluster's own PKI (cert-manager, a service mesh's CA) issues the
// certificates.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/grpcutil"
)

// Services are the volplane components that talk mutual TLS, by their
// certificates' file names; their identities are
// callers.ServiceIdentity(name).
var Services = []string{"watcher", "binder", "provisioner", "reclaimer", "gateway"}

// Validity is how long generated certificates are valid.
const Validity = 365 * 24 * time.Hour

// CA is a certificate authority whose certificate and key are files in a
// directory; it issues certificates into the same directory.
type CA struct {
	// Dir holds ca.crt, ca.key and the issued <name>.crt and <name>.key.
	Dir string
	// CertFile is the CA certificate's path (the --tls-ca-file of every
	// service).
	CertFile string

	cert *x509.Certificate
	key  crypto.Signer
}

// NewCA creates a CA named name in dir (created if missing) and writes its
// certificate and key there.
func NewCA(dir, name string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"volplane"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{Dir: dir, CertFile: filepath.Join(dir, "ca.crt"), cert: cert, key: key}
	if err := writePair(ca.CertFile, filepath.Join(dir, "ca.key"), der, key); err != nil {
		return nil, err
	}
	return ca, nil
}

// Issue writes <name>.crt and <name>.key into the CA's directory (replacing
// them atomically if they exist, as a rotation does): a certificate with
// common name name, valid for both server and client authentication, for
// localhost, 127.0.0.1, ::1, name and the extra hosts (DNS names or IP
// addresses). It returns the files as a service's TLS flags name them.
func (ca *CA) Issue(name string, hosts ...string) (grpcutil.TLSFiles, error) {
	return ca.issue(name, pkix.Name{CommonName: name, Organization: []string{"volplane"}}, true, append([]string{name}, hosts...))
}

// IssueService writes <service>.crt and <service>.key, as Issue, for the
// volplane service named service ("binder"): its Common Name is the
// service's identity, callers.ServiceIdentity(service) ("volplane-binder"),
// and it is valid for the host names service and volplane-<service> too.
func (ca *CA) IssueService(service string, hosts ...string) (grpcutil.TLSFiles, error) {
	id := callers.ServiceIdentity(service)
	return ca.issue(service, pkix.Name{CommonName: id, Organization: []string{"volplane"}}, true, append([]string{service, id}, hosts...))
}

// IssueUser writes <user>.crt and <user>.key: a user's client certificate,
// for the gateway's --client-ca-file, as the API server reads one (CN the
// user, O the groups); client authentication only. Issue users'
// certificates from a CA of their own, never the services'.
func (ca *CA) IssueUser(user string, groups ...string) (grpcutil.TLSFiles, error) {
	return ca.issue(user, pkix.Name{CommonName: user, Organization: groups}, false, nil)
}

func (ca *CA) issue(name string, subject pkix.Name, server bool, hosts []string) (grpcutil.TLSFiles, error) {
	if name == "" || filepath.Base(name) != name {
		return grpcutil.TLSFiles{}, fmt.Errorf("pki: invalid certificate name %q", name)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return grpcutil.TLSFiles{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return grpcutil.TLSFiles{}, fmt.Errorf("issue certificate %s: %w", name, err)
	}
	f := grpcutil.TLSFiles{CAFile: ca.CertFile, CertFile: filepath.Join(ca.Dir, name+".crt"), KeyFile: filepath.Join(ca.Dir, name+".key")}
	if err := writePair(f.CertFile, f.KeyFile, der, key); err != nil {
		return grpcutil.TLSFiles{}, err
	}
	return f, nil
}

// Generate creates a CA in dir and a certificate for each of names
// (default Services), and returns each one's files by name: a service's
// (one of Services) by IssueService, any other name's by Issue.
func Generate(dir string, names ...string) (map[string]grpcutil.TLSFiles, error) {
	if len(names) == 0 {
		names = Services
	}
	ca, err := NewCA(dir, "volplane-dev-ca")
	if err != nil {
		return nil, err
	}
	out := make(map[string]grpcutil.TLSFiles, len(names))
	for _, n := range names {
		issue := ca.Issue
		if slices.Contains(Services, n) {
			issue = ca.IssueService
		}
		if out[n], err = issue(n); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// writePair writes a certificate and its key as PEM; each file is written
// aside and renamed into place, so a reader never sees half of one. The key
// goes first: a reader that sees the new certificate sees its key too.
func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return errors.Join(
		writeAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600),
		writeAtomic(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644),
	)
}

func writeAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
