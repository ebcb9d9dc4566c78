// Package cmdutil holds what every volplane command's main shares: a
// command line in the manner of Kubernetes components (pflag, flags in
// named groups, a description at the top of --help, --version, a short
// error for a bad value), the common flags (logging, Kubernetes client,
// etcd, TLS), and running a service's Run under a signal context with one
// logger for the whole process and a clear error and exit code.
package cmdutil

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/version"
)

// Names of the flag groups the shared flags go to.
const (
	GroupKube    = "Kubernetes client"
	GroupEtcd    = "etcd"
	GroupTLS     = "TLS"
	GroupServing = "Serving"
	GroupLogging = "Logging"
	GroupDebug   = "Debug"
	GroupGeneral = "General"
)

// Logging holds the --log-level and --log-format flags.
type Logging struct {
	Level, Format string
}

// LogFlags registers --log-level and --log-format in the Logging group.
func (c *Command) LogFlags() *Logging {
	l := &Logging{}
	fs := c.Flags(GroupLogging)
	fs.StringVar(&l.Level, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&l.Format, "log-format", "text", "log format: text or json; client-go's, gRPC's and the etcd client's lines too")
	return l
}

// KubeFlags registers --kubeconfig, --kube-api-qps and --kube-api-burst in
// the Kubernetes client group.
func (c *Command) KubeFlags(kubeconfig *string, qps *float32, burst *int) {
	fs := c.Flags(GroupKube)
	fs.StringVar(kubeconfig, "kubeconfig", "", "path to a kubeconfig; empty: the files $KUBECONFIG lists, else ~/.kube/config, else the in-cluster configuration")
	fs.Float32Var(qps, "kube-api-qps", *qps, "client-side limit on Kubernetes API requests per second, a fuse under the API server's priority and fairness; 0 means the service's default, negative no limit")
	fs.IntVar(burst, "kube-api-burst", *burst, "burst above --kube-api-qps; 0 means twice --kube-api-qps")
}

// EtcdFlag registers --etcd-endpoints, a comma-separated list, in the etcd
// group.
func (c *Command) EtcdFlag(endpoints *[]string, purpose string) {
	*endpoints = []string{"http://127.0.0.1:2379"}
	c.Flags(GroupEtcd).Var(NewList(endpoints, "urls"), "etcd-endpoints", "comma-separated etcd client URLs for "+purpose)
}

// EtcdSecurityFlags registers the etcd client's TLS and authentication
// flags in the etcd group: --etcd-cacert, --etcd-cert, --etcd-key,
// --etcd-username and --etcd-password-file (the password is read from a
// file, never given on the command line).
func (c *Command) EtcdSecurityFlags(s *coord.Security) {
	fs := c.Flags(GroupEtcd)
	fs.StringVar(&s.CAFile, "etcd-cacert", "", "CA certificates (PEM) that sign etcd's serving certificate; turns etcd TLS on (https:// endpoints)")
	fs.StringVar(&s.CertFile, "etcd-cert", "", "client certificate (PEM) presented to etcd (etcd --client-cert-auth)")
	fs.StringVar(&s.KeyFile, "etcd-key", "", "private key (PEM) of --etcd-cert")
	fs.StringVar(&s.Username, "etcd-username", "", "etcd user, for an etcd with authentication enabled (needs --etcd-password-file)")
	fs.StringVar(&s.PasswordFile, "etcd-password-file", "", "file holding the password of --etcd-username")
}

// TLSFlags registers the mutual TLS flags of a volplane service in the TLS
// group, used both to serve and to dial other volplane services:
// --tls-ca-file, --tls-cert-file, --tls-key-file, and --insecure-plaintext
// to turn TLS off.
func (c *Command) TLSFlags(f *grpcutil.TLSFiles) {
	fs := c.Flags(GroupTLS)
	fs.StringVar(&f.CAFile, "tls-ca-file", "", "CA certificates (PEM) that sign every volplane service's certificate: clients must present one, servers must have one (required, unless --insecure-plaintext)")
	fs.StringVar(&f.CertFile, "tls-cert-file", "", "this service's certificate (PEM), for serving and as a client of other volplane services; reloaded when it changes. Its Common Name is the identity the other services authorize, per RPC: volplane-watcher, volplane-binder, volplane-provisioner, volplane-reclaimer or volplane-gateway")
	fs.StringVar(&f.KeyFile, "tls-key-file", "", "private key (PEM) of --tls-cert-file; reloaded when it changes")
	fs.BoolVar(&f.InsecurePlaintext, "insecure-plaintext", false, "serve and dial without TLS, letting anyone who reaches the port call every API: for local experiments only")
}

// ReflectionFlag registers --grpc-reflection in the Serving group.
func (c *Command) ReflectionFlag(on *bool) {
	c.Flags(GroupServing).BoolVar(on, "grpc-reflection", false, "serve the gRPC reflection service (for grpcurl); it lists every method to whoever connects")
}

// DebugAddressFlag registers --debug-address in the Debug group.
func (c *Command) DebugAddressFlag(addr *string) {
	c.Flags(GroupDebug).StringVar(addr, "debug-address", "", "HTTP address serving /metrics (Prometheus), /readyz (readiness: the gRPC health's verdict, check by check), /livez (liveness; /healthz the same), and /debug/pprof with --enable-pprof; empty disables")
}

// Run parses the command line (os.Args[1:]), then runs run under a
// context cancelled by SIGINT or SIGTERM with the process's logger (every
// library's logs routed into it, logging.Route), and returns the process's
// exit code: 0 after --help or --version, 2 for bad usage, 1 when run
// fails. Its first log line says which build starts.
func (c *Command) Run(l *Logging, run func(ctx context.Context, log *slog.Logger) error) int {
	if code, done := c.Parse(os.Args[1:]); done {
		return code
	}
	if err := c.NoArgs(); err != nil {
		return c.usageError(err)
	}
	log, err := logging.New(os.Stderr, c.Name, l.Level, l.Format)
	if err != nil {
		return c.usageError(err)
	}
	logging.Route(log)
	v := version.Get()
	log.Info("starting", "version", v.Version, "commit", v.Commit, "go", v.GoVersion)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", c.Name, err)
		return 1
	}
	return 0
}

// NoArgs is an error when the command line has positional arguments.
func (c *Command) NoArgs() error {
	if c.all.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (flags only)", c.all.Args())
	}
	return nil
}

// Args are the positional arguments after Parse.
func (c *Command) Args() []string { return c.all.Args() }

// Changed reports whether the flag name was set on the command line.
func (c *Command) Changed(name string) bool { return c.all.Changed(name) }
