package devenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/test/harness/pki"
)

// KubeVersion is the kube-apiserver version the Makefile builds and caches.
const KubeVersion = "v1.36.3"

// Options configures Start.
type Options struct {
	// Dir holds etcd's data, certificates, the kubeconfig and logs
	// (required; the caller removes it).
	Dir string
	// KubeAPIServer is the kube-apiserver binary; empty means
	// FindKubeAPIServer.
	KubeAPIServer string
	// ExtraArgs are appended to kube-apiserver's command line.
	ExtraArgs []string
	// EtcdTLS runs etcd with client TLS and client certificates required:
	// Start generates a CA and certificates under Dir/etcd-pki, gives
	// kube-apiserver its --etcd-cafile, --etcd-certfile and --etcd-keyfile,
	// and Env.EtcdSecurity holds the volplane services' client
	// certificate.
	EtcdTLS bool
}

// Env is a running control plane.
type Env struct {
	// Dir is Options.Dir.
	Dir string
	// Kubeconfig is the path of an admin kubeconfig.
	Kubeconfig string
	// APIServerURL is https://127.0.0.1:<port>.
	APIServerURL string
	// EtcdEndpoints are etcd's client URLs (kube-apiserver keeps its data
	// under /registry, volplane its coordination under /volplane).
	EtcdEndpoints []string
	// EtcdSecurity is the etcd client TLS of volplane's services (the
	// zero value without Options.EtcdTLS).
	EtcdSecurity coord.Security
	// RESTConfig is an admin client config.
	RESTConfig *rest.Config
	// APIServerLog is kube-apiserver's stdout and stderr.
	APIServerLog string

	etcd *Etcd
	cmd  *exec.Cmd
	done chan struct{}
	// what StartAPIServer needs to start kube-apiserver again
	bin, caPEM, token string
	args              []string
}

// FindKubeAPIServer returns the kube-apiserver binary to run:
// $VOLPLANE_KUBE_APISERVER, else the Makefile's cache
// ($XDG_CACHE_HOME or ~/.cache)/volplane/kube-apiserver-<KubeVersion>, else
// kube-apiserver on $PATH.
func FindKubeAPIServer() (string, error) {
	if p := os.Getenv("VOLPLANE_KUBE_APISERVER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("VOLPLANE_KUBE_APISERVER=%s: %w (run `make kube-apiserver`)", p, err)
		}
		return p, nil
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		if home, err := os.UserHomeDir(); err == nil {
			cache = filepath.Join(home, ".cache")
		}
	}
	if cache != "" {
		p := filepath.Join(cache, "volplane", "kube-apiserver-"+KubeVersion)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("kube-apiserver"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no kube-apiserver binary: run `make kube-apiserver` (builds %s into ~/.cache/volplane) or set VOLPLANE_KUBE_APISERVER", KubeVersion)
}

// Start starts etcd and kube-apiserver and waits until the apiserver is
// ready. Stop stops both.
func Start(ctx context.Context, o Options) (_ *Env, err error) {
	if o.Dir == "" {
		return nil, errors.New("devenv: Dir is required")
	}
	bin := o.KubeAPIServer
	if bin == "" {
		if bin, err = FindKubeAPIServer(); err != nil {
			return nil, err
		}
	}
	e := &Env{Dir: o.Dir, Kubeconfig: filepath.Join(o.Dir, "kubeconfig"), APIServerLog: filepath.Join(o.Dir, "kube-apiserver.log"), done: make(chan struct{})}
	var etcdTLS *EtcdTLS
	var etcdArgs []string
	if o.EtcdTLS {
		if etcdTLS, etcdArgs, e.EtcdSecurity, err = etcdCerts(filepath.Join(o.Dir, "etcd-pki")); err != nil {
			return nil, err
		}
	}
	e.etcd, err = StartEtcdTLS(filepath.Join(o.Dir, "etcd"), etcdTLS)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	e.EtcdEndpoints = e.etcd.Endpoints

	pki := filepath.Join(o.Dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return nil, err
	}
	caPEM, err := writeCerts(pki)
	if err != nil {
		return nil, fmt.Errorf("generate certificates: %w", err)
	}
	token, err := randomHex(24)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(pki, "tokens.csv"), []byte(token+",volplane-admin,volplane-admin,system:masters\n"), 0o600); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	e.APIServerURL = "https://127.0.0.1:" + strconv.Itoa(port)
	e.RESTConfig = &rest.Config{Host: e.APIServerURL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}}
	if err := writeKubeconfig(e.Kubeconfig, e.APIServerURL, caPEM, token); err != nil {
		return nil, err
	}

	args := []string{
		"--etcd-servers=" + e.EtcdEndpoints[0],
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + pki,
		"--tls-cert-file=" + filepath.Join(pki, "apiserver.crt"),
		"--tls-private-key-file=" + filepath.Join(pki, "apiserver.key"),
		"--token-auth-file=" + filepath.Join(pki, "tokens.csv"),
		"--service-account-key-file=" + filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(pki, "sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=RBAC",
		// See the package documentation.
		"--disable-admission-plugins=StorageObjectInUseProtection",
		"--profiling=false",
		"--v=1",
	}
	e.bin, e.args, e.caPEM, e.token = bin, append(append(args, etcdArgs...), o.ExtraArgs...), string(caPEM), token
	if err := e.StartAPIServer(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer: the
// same flags, port, certificates and etcd) and waits until it is ready.
func (e *Env) StartAPIServer(ctx context.Context) error {
	logf, err := os.OpenFile(e.APIServerLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	e.done = make(chan struct{})
	e.cmd = exec.Command(e.bin, e.args...)
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	// Its own process group (Ctrl-C in a terminal reaches us, and we stop
	// it in order), and killed if we die.
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := e.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", e.bin, err)
	}
	cmd, done := e.cmd, e.done
	go func() { _ = cmd.Wait(); close(done) }()
	if err := e.waitReady(ctx, []byte(e.caPEM), e.token, 3*time.Minute); err != nil {
		return fmt.Errorf("%w (log: %s)\n%s", err, e.APIServerLog, tail(e.APIServerLog, 4096))
	}
	return nil
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after 10s),
// leaving etcd running.
func (e *Env) StopAPIServer() {
	if e.cmd == nil || e.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
		<-e.done
	}
	e.cmd = nil
}

// Etcd is the embedded etcd, to stop and restart it (Etcd.Stop,
// Etcd.Restart) in outage tests.
func (e *Env) Etcd() *Etcd { return e.etcd }

func (e *Env) waitReady(ctx context.Context, caPEM []byte, token string, timeout time.Duration) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.APIServerURL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-e.done:
			return fmt.Errorf("kube-apiserver exited during startup: %v", e.cmd.ProcessState)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("kube-apiserver not ready within %s: %s", timeout, last)
}

// APIServerPID is kube-apiserver's process ID, 0 while it is stopped.
func (e *Env) APIServerPID() int {
	if e.cmd == nil || e.cmd.Process == nil {
		return 0
	}
	return e.cmd.Process.Pid
}

// Exited is closed when kube-apiserver exits.
func (e *Env) Exited() <-chan struct{} { return e.done }

// Stop stops kube-apiserver (SIGTERM, then SIGKILL after 10s) and etcd.
func (e *Env) Stop() {
	e.StopAPIServer()
	if e.etcd != nil {
		e.etcd.Stop()
		e.etcd = nil
	}
}

// etcdCerts generates etcd's CA and serving certificate, and client
// certificates for kube-apiserver and volplane's services, in dir.
func etcdCerts(dir string) (*EtcdTLS, []string, coord.Security, error) {
	ca, err := pki.NewCA(dir, "volplane-dev-etcd-ca")
	if err != nil {
		return nil, nil, coord.Security{}, fmt.Errorf("etcd CA: %w", err)
	}
	srv, err := ca.Issue("etcd")
	if err != nil {
		return nil, nil, coord.Security{}, err
	}
	api, err := ca.Issue("kube-apiserver-etcd-client")
	if err != nil {
		return nil, nil, coord.Security{}, err
	}
	vp, err := ca.Issue("volplane-etcd-client")
	if err != nil {
		return nil, nil, coord.Security{}, err
	}
	args := []string{"--etcd-cafile=" + ca.CertFile, "--etcd-certfile=" + api.CertFile, "--etcd-keyfile=" + api.KeyFile}
	return &EtcdTLS{CAFile: ca.CertFile, CertFile: srv.CertFile, KeyFile: srv.KeyFile}, args,
		coord.Security{CAFile: ca.CertFile, CertFile: vp.CertFile, KeyFile: vp.KeyFile}, nil
}

func writeKubeconfig(path, server string, caPEM []byte, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["volplane-dev"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["volplane-admin"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["volplane-dev"] = &clientcmdapi.Context{Cluster: "volplane-dev", AuthInfo: "volplane-admin", Namespace: "default"}
	cfg.CurrentContext = "volplane-dev"
	return clientcmd.WriteToFile(*cfg, path)
}

// writeCerts writes a CA, a serving certificate for 127.0.0.1 and
// localhost signed by it, and a service-account key pair; it returns the
// CA in PEM.
func writeCerts(dir string) ([]byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "volplane-dev-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, _ = x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 96, 0, 1)},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	srvKeyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"ca.crt":        caPEM,
		"apiserver.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		"apiserver.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: srvKeyDER}),
		"sa.key":        pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		"sa.pub":        pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER}),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return nil, err
		}
	}
	return caPEM, nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func tail(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return string(b)
}
