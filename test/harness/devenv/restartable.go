package devenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/volplane/volplane/pkg/coord"
)

// APIServerOptions configures StartAPIServer.
type APIServerOptions struct {
	// Dir holds the certificates, the kubeconfig and the log (required).
	Dir string
	// KubeAPIServer is the binary; empty means FindKubeAPIServer.
	KubeAPIServer string
	// EtcdServers are etcd's client URLs (required).
	EtcdServers []string
	// Etcd is kube-apiserver's etcd client TLS (the zero value for
	// plaintext etcd).
	Etcd coord.Security
	// ExtraArgs are appended to kube-apiserver's command line.
	ExtraArgs []string
	// CPUs confines kube-apiserver to these CPUs; empty means any.
	CPUs CPUSet
}

// APIServer is a kube-apiserver child process over an etcd it does not
// own, that can be killed and started again on the same address,
// certificates and token: clients and kubeconfigs stay valid across
// restarts. Start and the kill or stop calls may come from any goroutine.
type APIServer struct {
	// URL is https://127.0.0.1:<port>.
	URL string
	// Kubeconfig is an admin kubeconfig's path.
	Kubeconfig string
	// RESTConfig is an admin client config.
	RESTConfig *rest.Config
	// LogPath is the log of every run, appended.
	LogPath string

	bin   string
	args  []string
	cpus  CPUSet
	caPEM []byte
	token string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartAPIServer generates certificates, a token and a kubeconfig in
// o.Dir, starts kube-apiserver and waits until it is ready.
func StartAPIServer(ctx context.Context, o APIServerOptions) (*APIServer, error) {
	if o.Dir == "" || len(o.EtcdServers) == 0 {
		return nil, errors.New("devenv: APIServerOptions needs Dir and EtcdServers")
	}
	bin := o.KubeAPIServer
	if bin == "" {
		var err error
		if bin, err = FindKubeAPIServer(); err != nil {
			return nil, err
		}
	}
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
	a := &APIServer{URL: "https://127.0.0.1:" + strconv.Itoa(port), Kubeconfig: filepath.Join(o.Dir, "kubeconfig"),
		LogPath: filepath.Join(o.Dir, "kube-apiserver.log"), bin: bin, caPEM: caPEM, token: token, cpus: o.CPUs}
	a.RESTConfig = &rest.Config{Host: a.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}}
	if err := writeKubeconfig(a.Kubeconfig, a.URL, caPEM, token); err != nil {
		return nil, err
	}
	a.args = []string{
		"--etcd-servers=" + strings.Join(o.EtcdServers, ","),
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
	if o.Etcd.CAFile != "" {
		a.args = append(a.args, "--etcd-cafile="+o.Etcd.CAFile, "--etcd-certfile="+o.Etcd.CertFile, "--etcd-keyfile="+o.Etcd.KeyFile)
	}
	a.args = append(a.args, o.ExtraArgs...)
	if err := a.Start(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// Start starts kube-apiserver again (after Kill or Stop) and waits until it
// is ready; it does nothing while one runs.
func (a *APIServer) Start(ctx context.Context) error {
	a.mu.Lock()
	if a.cmd != nil {
		a.mu.Unlock()
		return nil
	}
	logf, err := os.OpenFile(a.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		a.mu.Unlock()
		return err
	}
	cmd := exec.Command(a.bin, a.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	done := make(chan struct{})
	if err := startOn(a.cpus, cmd, func() { logf.Close(); close(done) }); err != nil {
		logf.Close()
		a.mu.Unlock()
		return fmt.Errorf("start %s: %w", a.bin, err)
	}
	a.cmd, a.done = cmd, done
	a.mu.Unlock()
	if err := a.waitReady(ctx, done, 3*time.Minute); err != nil {
		return fmt.Errorf("%w (log: %s)\n%s", err, a.LogPath, tail(a.LogPath, 4096))
	}
	return nil
}

// PID is the running kube-apiserver's process ID, 0 when none runs (the
// benchmark reads its CPU time and peak memory from /proc).
func (a *APIServer) PID() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil || a.cmd.Process == nil {
		return 0
	}
	return a.cmd.Process.Pid
}

// Kill kills kube-apiserver with SIGKILL and waits for it to exit.
func (a *APIServer) Kill() { a.signal(syscall.SIGKILL, 0) }

// Stop stops kube-apiserver (SIGTERM, SIGKILL after 10s).
func (a *APIServer) Stop() { a.signal(syscall.SIGTERM, 10*time.Second) }

func (a *APIServer) signal(sig syscall.Signal, grace time.Duration) {
	a.mu.Lock()
	cmd, done := a.cmd, a.done
	a.cmd = nil
	a.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	if grace > 0 {
		select {
		case <-done:
			return
		case <-time.After(grace):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}
	<-done
}

func (a *APIServer) waitReady(ctx context.Context, done <-chan struct{}, timeout time.Duration) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(a.caPEM)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+a.token)
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
		case <-done:
			return errors.New("kube-apiserver exited during startup")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("kube-apiserver not ready within %s: %s", timeout, last)
}

// EtcdCerts generates, in dir, an etcd CA, a serving certificate for
// loopback and client certificates for kube-apiserver and for volplane's
// services: the etcd member's TLS, kube-apiserver's etcd client and the
// services' --etcd-* flags.
func EtcdCerts(dir string) (server *EtcdTLS, apiserver, services coord.Security, err error) {
	srv, args, svc, err := etcdCerts(dir)
	if err != nil {
		return nil, coord.Security{}, coord.Security{}, err
	}
	api := coord.Security{CAFile: srv.CAFile}
	for _, a := range args {
		switch k, v, _ := strings.Cut(a, "="); k {
		case "--etcd-certfile":
			api.CertFile = v
		case "--etcd-keyfile":
			api.KeyFile = v
		}
	}
	return srv, api, svc, nil
}
