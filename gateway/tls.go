package gateway

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/volplane/volplane/pkg/metrics"
)

// servingCert is the gateway's serving certificate, read again from its
// files when they change (checked at most once a second, on a new TLS
// handshake), so it rotates without a restart. A change that does not load
// (a key that does not match, a half-written file) is logged and the last
// good certificate stays in use.
type servingCert struct {
	certFile, keyFile string
	log               *slog.Logger

	mu              sync.Mutex
	lastCheck       time.Time
	certPEM, keyPEM []byte
	cert            *tls.Certificate
}

func newServingCert(certFile, keyFile string, log *slog.Logger) (*servingCert, error) {
	s := &servingCert{certFile: certFile, keyFile: keyFile, log: log}
	c, k, cert, err := s.load()
	if err != nil {
		return nil, err
	}
	s.certPEM, s.keyPEM, s.cert, s.lastCheck = c, k, cert, time.Now()
	s.record(cert)
	metrics.RefreshCertificatesWith(func() { _, _ = s.get(nil) })
	return s, nil
}

func (s *servingCert) load() ([]byte, []byte, *tls.Certificate, error) {
	c, err := os.ReadFile(s.certFile)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("serving certificate (--tls-serving-cert-file): %w", err)
	}
	k, err := os.ReadFile(s.keyFile)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("serving key (--tls-serving-key-file): %w", err)
	}
	cert, err := tls.X509KeyPair(c, k)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("serving certificate %s and key %s: %w", s.certFile, s.keyFile, err)
	}
	return c, k, &cert, nil
}

// record publishes the notAfter of the certificate in use
// (volplane_certificate_expiry_timestamp_seconds, role gateway-serving).
func (s *servingCert) record(cert *tls.Certificate) {
	var certs []*x509.Certificate
	for _, der := range cert.Certificate {
		if x, err := x509.ParseCertificate(der); err == nil {
			certs = append(certs, x)
		}
	}
	metrics.SetCertificates(metrics.RoleGatewayServing, s.certFile, certs)
}

// get is tls.Config.GetCertificate.
func (s *servingCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.lastCheck) < time.Second {
		return s.cert, nil
	}
	s.lastCheck = time.Now()
	c, k, cert, err := s.load()
	switch {
	case err != nil:
		s.log.Warn("serving certificate did not reload; keeping the one loaded before", "error", err)
	case !bytes.Equal(c, s.certPEM) || !bytes.Equal(k, s.keyPEM):
		s.certPEM, s.keyPEM, s.cert = c, k, cert
		s.record(cert)
		s.log.Info("serving certificate reloaded", "file", s.certFile)
	}
	return s.cert, nil
}

// tlsConfig serves the certificate and asks for (without requiring) a
// client certificate when a client CA is configured: the handler verifies
// it against the CA file as it is now, so the CA rotates without a
// restart, and a client without one may still send a token.
func (s *servingCert) tlsConfig(clientCA bool) *tls.Config {
	cfg := &tls.Config{GetCertificate: s.get, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	if clientCA {
		cfg.ClientAuth = tls.RequestClientCert
	}
	return cfg
}
