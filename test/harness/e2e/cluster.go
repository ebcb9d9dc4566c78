package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/pki"
)

// Cluster is what an end-to-end test package shares: a real kube-apiserver
// and etcd in a temporary directory, a client, the services' certificates,
// and one log file for the services the package runs, printed when a test
// fails.
type Cluster struct {
	*devenv.Env
	// Client is an admin client (protobuf, no client-side throttling).
	Client kubernetes.Interface
	// LogPath is the services' log file.
	LogPath string
	// CA is the services' CA: it issues more certificates of services or
	// of the test harness (a rotation, a test's own server).
	CA *pki.CA
	// UserCA signs users' client certificates for the gateway
	// (--client-ca-file), apart from the services' CA as in deploy/:
	// IssueUser.
	UserCA *pki.CA

	dir   string
	logs  *os.File
	certs map[string]grpcutil.TLSFiles
}

// Options configures StartCluster.
type Options struct {
	// EtcdTLS runs etcd with client TLS and client certificates required;
	// the services then take Env.EtcdSecurity.
	EtcdTLS bool
	// APIServerArgs are added to kube-apiserver's command line.
	APIServerArgs []string
}

// Client is the name of the certificate the tests themselves use to call
// the services (TLS(Client)): the test harness's identity, which may call
// every RPC (pkg/callers).
const Client = callers.Conformance

// StartCluster starts kube-apiserver and etcd for package name, generates
// a CA and a certificate per service (pki.Services) and for the tests
// (Client), and a CA for users (UserCA), and says how long it took. Stop
// undoes it.
func StartCluster(ctx context.Context, name string, o Options) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "volplane-"+strings.ReplaceAll(name, "/", "-")+"-")
	if err != nil {
		return nil, err
	}
	start := time.Now()
	env, err := devenv.Start(ctx, devenv.Options{Dir: dir, EtcdTLS: o.EtcdTLS, ExtraArgs: o.APIServerArgs})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start kube-apiserver and etcd: %w", err)
	}
	fmt.Printf("%s: kube-apiserver and etcd ready in %s\n", name, time.Since(start).Round(time.Millisecond))
	c := &Cluster{Env: env, dir: dir, LogPath: filepath.Join(dir, "services.log"),
		Client: kubernetes.NewForConfigOrDie(kube.Tune(env.RESTConfig, kube.ClientOptions{UserAgent: "volplane-e2e"}))}
	if c.CA, err = pki.NewCA(filepath.Join(dir, "tls"), "volplane-e2e-ca"); err != nil {
		c.Stop()
		return nil, err
	}
	if c.UserCA, err = pki.NewCA(filepath.Join(dir, "users"), "volplane-e2e-users-ca"); err != nil {
		c.Stop()
		return nil, err
	}
	c.certs = map[string]grpcutil.TLSFiles{}
	if c.certs[Client], err = c.CA.Issue(Client); err != nil {
		c.Stop()
		return nil, err
	}
	for _, s := range pki.Services {
		if c.certs[s], err = c.CA.IssueService(s); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if c.logs, err = os.Create(c.LogPath); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// TLS returns the certificate files of service (one of pki.Services, or
// Client); the zero TLSFiles, which every service refuses, for another
// name.
func (c *Cluster) TLS(service string) grpcutil.TLSFiles { return c.certs[service] }

// Dial connects to a volplane service at addr as the tests (Client).
func (c *Cluster) Dial(addr string) (*grpc.ClientConn, error) {
	return grpcutil.Dial(addr, c.TLS(Client))
}

// WaitServing waits until the service at addr reports SERVING.
func (c *Cluster) WaitServing(ctx context.Context, addr string, timeout time.Duration) error {
	return devenv.WaitServing(ctx, addr, "", c.TLS(Client), timeout)
}

// Dir is the cluster's temporary directory, for the tests' own files.
func (c *Cluster) Dir() string { return c.dir }

// Logger is a logger into the services' log at level, for component.
func (c *Cluster) Logger(component string, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(c.logs, &slog.HandlerOptions{Level: level})).With("component", component)
}

// DumpLogs writes the last part of the services' log to w.
func (c *Cluster) DumpLogs(w io.Writer) {
	b, err := os.ReadFile(c.LogPath)
	if err != nil {
		return
	}
	const max = 96 << 10
	if len(b) > max {
		b = b[len(b)-max:]
	}
	fmt.Fprintf(w, "---- service logs (last %d bytes) ----\n%s\n", len(b), b)
}

// Stop stops kube-apiserver and etcd and removes the directory.
func (c *Cluster) Stop() {
	if c.logs != nil {
		c.logs.Close()
	}
	c.Env.Stop()
	os.RemoveAll(c.dir)
}

// RunTests runs the package's tests, prints the services' log when they
// fail, then stops the services (stop) and waits for each of the services
// to report on errc how it ended: a service that ends with an error, or
// not within 30s, fails the run, and so does a value given to Secret that
// the services' log holds. It returns the exit code.
func (c *Cluster) RunTests(m interface{ Run() int }, name string, stop func(), errc <-chan error, services int) int {
	code := m.Run()
	if code != 0 {
		c.DumpLogs(os.Stderr)
	}
	stop()
	for range services {
		select {
		case err := <-errc:
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: service stopped with: %v\n", name, err)
				code = 1
			}
		case <-time.After(30 * time.Second):
			fmt.Fprintf(os.Stderr, "%s: a service did not stop within 30s\n", name)
			return 1
		}
	}
	// Secrets appear in no log, whatever path of whichever test wrote it.
	if !c.NoSecretsLogged(name) {
		code = 1
	}
	return code
}
