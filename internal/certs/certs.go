package certs

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Component is one volplane component with a certificate.
type Component struct {
	// Name is the component ("binder"); its certificate's common name is
	// volplane-<Name>.
	Name string
	// Secret is the Secret its pods mount.
	Secret string
	// Service is the Service that reaches it.
	Service string
	// Peers is the headless Service under which its pods have names of
	// their own (a StatefulSet's serviceName), "" when they have none.
	Peers string
	// Members, when above 0, names each pod under Peers explicitly
	// (<Service>-0 ... <Service>-<Members-1>): etcd checks a peer's address
	// by resolving the names of its certificate, which a wildcard cannot
	// give it (docs/etcd.md).
	Members int
}

// Components are the certificates the manifests (deploy/kubernetes)
// mount, with the Secret names, common names and DNS names that
// cert-manager's certificates.yaml gives them.
var Components = []Component{
	{Name: "etcd", Secret: "volplane-etcd-tls", Service: "volplane-etcd", Peers: "volplane-etcd", Members: 3},
	{Name: "watcher", Secret: "volplane-watcher-tls", Service: "volplane-watcher", Peers: "volplane-watcher-peers"},
	{Name: "binder", Secret: "volplane-binder-tls", Service: "volplane-binder", Peers: "volplane-binder-peers"},
	{Name: "provisioner", Secret: "volplane-provisioner-tls", Service: "volplane-provisioner"},
	{Name: "reclaimer", Secret: "volplane-reclaimer-tls", Service: "volplane-reclaimer", Peers: "volplane-reclaimer-peers"},
	{Name: "gateway", Secret: "volplane-gateway-tls", Service: "volplane-gateway"},
}

// Client is a client-only certificate of the services CA: a job that
// calls a component and serves nothing, so it has no DNS name and is
// refused as a server.
type Client struct {
	// Name is its common name (volplane-etcd-backup).
	Name string
	// Secret is the Secret its pods mount.
	Secret string
}

// Clients are the client-only certificates the manifests mount, as
// cert-manager's certificates.yaml issues them: the etcd backup job's
// (deploy/kubernetes/etcd-backup.yaml).
var Clients = []Client{
	{Name: "volplane-etcd-backup", Secret: "volplane-etcd-backup-tls"},
}

// ClientCASecret is the gateway's client CA: ca.crt, the CA whose client
// certificates identify REST users.
const ClientCASecret = "volplane-gateway-client-ca"

// Defaults of Options.
const (
	DefaultNamespace     = "volplane-system"
	DefaultClusterDomain = "cluster.local"
	DefaultValidity      = 365 * 24 * time.Hour
	// CAValidity is how long a CA made here is valid.
	CAValidity = 10 * 365 * 24 * time.Hour
)

// The files of the state directory.
const (
	servicesCA = "services-ca"
	usersCA    = "users-ca"
)

// Options says which Secrets to make.
type Options struct {
	// StateDir keeps the CAs (services-ca.crt/.key, users-ca.crt/.key,
	// mode 0600 keys in a 0700 directory): made on the first run, reused
	// by the next ones (required).
	StateDir string
	// Namespace is volplane's namespace; default DefaultNamespace.
	Namespace string
	// ClusterDomain is the cluster's DNS domain; default
	// DefaultClusterDomain. Every name is in the certificates with and
	// without it.
	ClusterDomain string
	// Validity is how long the components' certificates are valid;
	// default DefaultValidity. Run again before then: the services reload
	// the Secrets when they change.
	Validity time.Duration
	// GatewayHosts are more DNS names or IP addresses of the gateway's
	// certificate: the names its users reach it by (a load balancer's).
	GatewayHosts []string
	// ClientCAFile, when set, is a CA certificate (PEM) of the cluster's
	// (its API server's client CA, say) to use as the gateway's client CA
	// instead of a users' CA of the state directory.
	ClientCAFile string

	now func() time.Time
}

func (o *Options) defaults() error {
	var errs []error
	if o.StateDir == "" {
		errs = append(errs, errors.New("a state directory is required, to keep the CAs for the next run (--state-dir)"))
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if es := validation.IsDNS1123Label(o.Namespace); len(es) > 0 {
		errs = append(errs, fmt.Errorf("namespace %q: %s (--namespace)", o.Namespace, strings.Join(es, "; ")))
	}
	if o.ClusterDomain == "" {
		o.ClusterDomain = DefaultClusterDomain
	}
	if es := validation.IsDNS1123Subdomain(o.ClusterDomain); len(es) > 0 {
		errs = append(errs, fmt.Errorf("cluster domain %q: %s (--cluster-domain)", o.ClusterDomain, strings.Join(es, "; ")))
	}
	switch {
	case o.Validity < 0:
		errs = append(errs, fmt.Errorf("validity must be positive, got %s (--validity)", o.Validity))
	case o.Validity == 0:
		o.Validity = DefaultValidity
	case o.Validity > CAValidity:
		errs = append(errs, fmt.Errorf("validity %s outlasts the CA's %s (--validity)", o.Validity, CAValidity))
	}
	for _, h := range o.GatewayHosts {
		if net.ParseIP(h) != nil {
			continue
		}
		if es := validation.IsWildcardDNS1123Subdomain(h); len(es) > 0 && len(validation.IsDNS1123Subdomain(h)) > 0 {
			errs = append(errs, fmt.Errorf("gateway host %q is neither an IP address nor a DNS name (--gateway-host)", h))
		}
	}
	if o.now == nil {
		o.now = time.Now
	}
	return errors.Join(errs...)
}

// Hosts are the DNS names and IP addresses of c's certificate: its
// Service's names (name, name.namespace, name.namespace.svc and
// name.namespace.svc.<domain>), the headless Service Peers' (which
// resolves to every pod) and its pods' under it (each of those forms,
// under a wildcard, and by name for Members), localhost, 127.0.0.1 and ::1 (a probe or a
// tool in the pod), and, for the gateway, GatewayHosts.
func (o Options) Hosts(c Component) []string {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.ClusterDomain == "" {
		o.ClusterDomain = DefaultClusterDomain
	}
	names := func(svc string) []string {
		return []string{svc, svc + "." + o.Namespace, svc + "." + o.Namespace + ".svc", svc + "." + o.Namespace + ".svc." + o.ClusterDomain}
	}
	hosts := names(c.Service)
	if c.Peers != "" && c.Peers != c.Service {
		hosts = append(hosts, names(c.Peers)...) // headless: its name reaches every pod
	}
	if c.Peers != "" {
		for _, n := range names(c.Peers) {
			hosts = append(hosts, "*."+n)
		}
		for i := range c.Members {
			for _, n := range names(c.Peers) {
				hosts = append(hosts, fmt.Sprintf("%s-%d.%s", c.Service, i, n))
			}
		}
	}
	hosts = append(hosts, "localhost", "127.0.0.1", "::1")
	if c.Name == "gateway" {
		hosts = append(hosts, o.GatewayHosts...)
	}
	return hosts
}

// Make returns the Secrets of every component, of every client-only
// certificate and the gateway's client CA, in the order of Components
// then Clients, the CA last. The CAs are read from the
// state directory, or made there when it has none.
func Make(o Options) ([]*corev1.Secret, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	ca, err := loadOrMakeCA(o.StateDir, servicesCA, "volplane-ca", o.now())
	if err != nil {
		return nil, err
	}
	var out []*corev1.Secret
	for _, c := range Components {
		certPEM, keyPEM, err := ca.issue("volplane-"+c.Name, nil, o.Hosts(c), o.Validity, o.now(),
			x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
		out = append(out, o.secret(c.Secret, corev1.SecretTypeTLS, map[string][]byte{
			"ca.crt": ca.certPEM, corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM,
		}))
	}
	for _, c := range Clients {
		certPEM, keyPEM, err := ca.issue(c.Name, nil, nil, o.Validity, o.now(), x509.ExtKeyUsageClientAuth)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
		out = append(out, o.secret(c.Secret, corev1.SecretTypeTLS, map[string][]byte{
			"ca.crt": ca.certPEM, corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM,
		}))
	}
	var clientCA []byte
	if o.ClientCAFile != "" {
		if clientCA, err = readCACert(o.ClientCAFile); err != nil {
			return nil, err
		}
	} else {
		users, err := loadOrMakeCA(o.StateDir, usersCA, "volplane-users-ca", o.now())
		if err != nil {
			return nil, err
		}
		clientCA = users.certPEM
	}
	out = append(out, o.secret(ClientCASecret, corev1.SecretTypeOpaque, map[string][]byte{"ca.crt": clientCA}))
	return out, nil
}

func (o Options) secret(name string, typ corev1.SecretType, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: o.Namespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "volplane", "app.kubernetes.io/managed-by": "volplane-certs"}},
		Type: typ, Data: data,
	}
}

// WriteYAML writes the Secrets as one YAML stream, for kubectl apply -f -.
func WriteYAML(w io.Writer, secrets []*corev1.Secret) error {
	var b bytes.Buffer
	b.WriteString("# volplane's TLS Secrets, made by volplane-certs (docs/certificates.md).\n")
	for _, s := range secrets {
		y, err := yaml.Marshal(s)
		if err != nil {
			return err
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// User issues a client certificate of the users' CA in stateDir for a REST
// user (common name name, organizations groups, as the API server reads a
// client certificate) and writes <name>.crt and <name>.key into outDir.
func User(stateDir, outDir, name string, groups []string, validity time.Duration) (certFile, keyFile string, err error) {
	if name == "" || strings.ContainsAny(name, "/\\") || name == "." || name == ".." {
		return "", "", fmt.Errorf("user name %q cannot name a file (--name)", name)
	}
	if validity <= 0 {
		validity = DefaultValidity
	}
	if _, err := os.Stat(filepath.Join(stateDir, usersCA+".key")); err != nil {
		return "", "", fmt.Errorf("no users' CA in %s: run volplane-certs without --client-ca-file first: %w", stateDir, err)
	}
	ca, err := loadOrMakeCA(stateDir, usersCA, "volplane-users-ca", time.Now())
	if err != nil {
		return "", "", err
	}
	certPEM, keyPEM, err := ca.issue(name, groups, nil, validity, time.Now(), x509.ExtKeyUsageClientAuth)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(outDir, name+".crt"), filepath.Join(outDir, name+".key")
	if err := writeFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := writeFile(certFile, certPEM, 0o644); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// authority is a CA: its certificate and key.
type authority struct {
	cert    *x509.Certificate
	certPEM []byte
	key     crypto.Signer
}

// loadOrMakeCA reads <dir>/<base>.crt and .key, or makes a CA there.
func loadOrMakeCA(dir, base, commonName string, now time.Time) (*authority, error) {
	certPath, keyPath := filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key")
	certPEM, cerr := os.ReadFile(certPath)
	keyPEM, kerr := os.ReadFile(keyPath)
	switch {
	case cerr == nil && kerr == nil:
		return parseCA(certPEM, keyPEM, certPath)
	case !errors.Is(cerr, os.ErrNotExist) && cerr != nil:
		return nil, cerr
	case !errors.Is(kerr, os.ErrNotExist) && kerr != nil:
		return nil, kerr
	case cerr == nil || kerr == nil:
		return nil, fmt.Errorf("%s: a CA's certificate without its key, or the reverse: restore both or remove both", filepath.Join(dir, base))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"volplane"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA %s: %w", commonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if err := writeFile(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeFile(certPath, certPEM, 0o644); err != nil {
		return nil, err
	}
	return parseCA(certPEM, keyPEM, certPath)
}

func parseCA(certPEM, keyPEM []byte, where string) (*authority, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("%s: not a PEM certificate and key", where)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s key: %w", where, err)
	}
	key, ok := k.(crypto.Signer)
	if !ok || !cert.IsCA {
		return nil, fmt.Errorf("%s: not a CA certificate with its signing key", where)
	}
	if time.Now().After(cert.NotAfter) {
		return nil, fmt.Errorf("%s: the CA expired on %s", where, cert.NotAfter.Format(time.RFC3339))
	}
	return &authority{cert: cert, certPEM: certPEM, key: key}, nil
}

// issue makes a certificate and key signed by a, for hosts (DNS names or
// IP addresses), with the given extended key usages.
func (a *authority) issue(commonName string, orgs, hosts []string, validity time.Duration, now time.Time, usages ...x509.ExtKeyUsage) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(a.cert.NotAfter) {
		return nil, nil, fmt.Errorf("the CA expires on %s, before the %s certificate would: make a new state directory (a new CA)", a.cert.NotAfter.Format(time.RFC3339), validity)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: commonName, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue %s: %w", commonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// readCACert reads a CA certificate (PEM; several are a bundle).
func readCACert(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("client CA (--client-ca-file): %w", err)
	}
	rest, n := b, 0
	for {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type == "CERTIFICATE" {
			if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
				return nil, fmt.Errorf("client CA %s: %w", path, err)
			}
			n++
		}
		if strings.Contains(blk.Type, "PRIVATE KEY") {
			return nil, fmt.Errorf("client CA %s holds a private key: give the CA's certificate only", path)
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("client CA %s holds no PEM certificate", path)
	}
	return b, nil
}

// writeFile writes aside and renames into place.
func writeFile(path string, b []byte, mode os.FileMode) error {
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
