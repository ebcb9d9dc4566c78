package csisidecar

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/sidecar"
)

// CARefresh is how often the CA bundle is read again, so that a rotated
// CA is picked up.
const CARefresh = time.Minute

// caRefreshEvery is CARefresh; tests shorten it.
var caRefreshEvery = CARefresh

// servingCertValidity is how long the generated serving certificate is
// valid; the sidecar restarts long before (a new pod, a new certificate).
const servingCertValidity = 10 * 365 * 24 * time.Hour

// newServingCert generates the sidecar's serving certificate: a fresh
// ECDSA P-256 key and a self-signed certificate naming host and ips,
// held in memory only. The provisioner trusts it by its SHA-256, which
// the registration pins, not by a CA.
func newServingCert(host string, ips []net.IP) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "volplane-csi-sidecar " + host},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(servingCertValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{host},
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// caSource reads the CA bundle that signs the provisioner's client
// certificate.
type caSource interface {
	// read returns the PEM bundle.
	read(ctx context.Context) ([]byte, error)
	// String names the source in logs and errors.
	String() string
}

type fileCA string

func (f fileCA) read(context.Context) ([]byte, error) { return os.ReadFile(string(f)) }
func (f fileCA) String() string                       { return "file " + string(f) }

// configMapCA is the ConfigMap the provisioner publishes its CA in.
type configMapCA struct {
	client    kubernetes.Interface
	namespace string
}

func (c configMapCA) read(ctx context.Context) ([]byte, error) {
	cm, err := c.client.CoreV1().ConfigMaps(c.namespace).Get(ctx, sidecar.CAConfigMap, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%s not found: is volplane's provisioner installed in namespace %s? (--volplane-namespace)", c, c.namespace)
		}
		return nil, err
	}
	b, ok := cm.Data[sidecar.CAConfigMapKey]
	if !ok {
		return nil, fmt.Errorf("%s has no key %s", c, sidecar.CAConfigMapKey)
	}
	return []byte(b), nil
}

func (c configMapCA) String() string {
	return "ConfigMap " + c.namespace + "/" + sidecar.CAConfigMap
}

// clientCAs is the CA pool client certificates are verified with, read
// again every CARefresh; until the first good read it is empty, and every
// handshake fails.
type clientCAs struct {
	src  caSource
	log  *slog.Logger
	pool atomic.Pointer[x509.CertPool]
}

// load reads the bundle once; a bundle that does not parse keeps the last
// good pool.
func (c *clientCAs) load(ctx context.Context) error {
	b, err := c.src.read(ctx)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return fmt.Errorf("%s holds no PEM certificate", c.src)
	}
	c.pool.Store(pool)
	return nil
}

// refresh loads the bundle every CARefresh until ctx ends, logging a
// failure once until it recovers.
func (c *clientCAs) refresh(ctx context.Context, every time.Duration) {
	failing := false
	for {
		err := c.load(ctx)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			c.log.Warn("cannot read the CA of volplane's provisioner; calls are refused until it is read", "source", c.src.String(), "error", err)
			failing = true
		case err == nil && failing:
			c.log.Info("read the CA of volplane's provisioner", "source", c.src.String())
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// serverTLS is the TLS configuration of the sidecar's port: TLS 1.3 only,
// cert served, a client certificate required that chains to the current
// CA pool and whose Common Name is volplane's provisioner. Anything else
// fails the handshake.
func serverTLS(cert tls.Certificate, cas *clientCAs) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			pool := cas.pool.Load()
			if pool == nil {
				return nil, errors.New("the CA of volplane's provisioner is not read yet")
			}
			return &tls.Config{
				MinVersion:            tls.VersionTLS13,
				Certificates:          []tls.Certificate{cert},
				ClientAuth:            tls.RequireAndVerifyClientCert,
				ClientCAs:             pool,
				NextProtos:            []string{"h2"},
				VerifyPeerCertificate: verifyProvisioner,
			}, nil
		},
	}
}

// verifyProvisioner refuses a verified client certificate that does not
// name volplane's provisioner.
func verifyProvisioner(_ [][]byte, chains [][]*x509.Certificate) error {
	if len(chains) == 0 || len(chains[0]) == 0 {
		return errors.New("no verified client certificate")
	}
	if cn := chains[0][0].Subject.CommonName; cn != callers.Provisioner {
		return fmt.Errorf("client certificate names %q: only %s may call the driver", cn, callers.Provisioner)
	}
	return nil
}
