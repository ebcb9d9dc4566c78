// Package cmdutil holds what every volplane command's main shares: the
// common flags (logging, Kubernetes client, etcd, TLS) and running a service's
// Run under a signal context with a clear error and exit code.
package cmdutil

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
)

// Logging holds the --log-level and --log-format flags.
type Logging struct {
	Level, Format string
}

// LogFlags registers --log-level and --log-format.
func LogFlags() *Logging {
	l := &Logging{}
	flag.StringVar(&l.Level, "log-level", "info", "log level: debug, info, warn or error")
	flag.StringVar(&l.Format, "log-format", "text", "log format: text or json")
	return l
}

// KubeFlags registers --kubeconfig, --kube-api-qps and --kube-api-burst.
func KubeFlags(kubeconfig *string, qps *float32, burst *int) {
	flag.StringVar(kubeconfig, "kubeconfig", "", "path to a kubeconfig; empty: the files $KUBECONFIG lists, else ~/.kube/config, else the in-cluster configuration")
	flag.Var((*float32Value)(qps), "kube-api-qps", "client-side limit on Kubernetes API requests per second, a fuse under the API server's priority and fairness; 0 means the service's default, negative no limit")
	flag.IntVar(burst, "kube-api-burst", 0, "burst above --kube-api-qps; 0 means twice --kube-api-qps")
}

// EtcdFlag registers --etcd-endpoints, a comma-separated list.
func EtcdFlag(endpoints *[]string, purpose string) {
	*endpoints = []string{"http://127.0.0.1:2379"}
	flag.Var(&listValue{p: endpoints}, "etcd-endpoints", "comma-separated etcd client URLs for "+purpose)
}

// EtcdSecurityFlags registers the etcd client's TLS and authentication
// flags: --etcd-cacert, --etcd-cert, --etcd-key, --etcd-username and
// --etcd-password-file (the password is read from a file, never given on
// the command line).
func EtcdSecurityFlags(s *coord.Security) {
	flag.StringVar(&s.CAFile, "etcd-cacert", "", "CA certificates (PEM) that sign etcd's serving certificate; turns etcd TLS on (https:// endpoints)")
	flag.StringVar(&s.CertFile, "etcd-cert", "", "client certificate (PEM) presented to etcd (etcd --client-cert-auth)")
	flag.StringVar(&s.KeyFile, "etcd-key", "", "private key (PEM) of --etcd-cert")
	flag.StringVar(&s.Username, "etcd-username", "", "etcd user, for an etcd with authentication enabled (needs --etcd-password-file)")
	flag.StringVar(&s.PasswordFile, "etcd-password-file", "", "file holding the password of --etcd-username")
}

// TLSFlags registers the mutual TLS flags of a volplane service, used both
// to serve and to dial other volplane services: --tls-ca-file,
// --tls-cert-file, --tls-key-file, and --insecure-plaintext to turn TLS off.
func TLSFlags(f *grpcutil.TLSFiles) {
	flag.StringVar(&f.CAFile, "tls-ca-file", "", "CA certificates (PEM) that sign every volplane service's certificate: clients must present one, servers must have one (required, unless --insecure-plaintext)")
	flag.StringVar(&f.CertFile, "tls-cert-file", "", "this service's certificate (PEM), for serving and as a client of other volplane services; reloaded when it changes. Its Common Name is the identity the other services authorize, per RPC: volplane-watcher, volplane-binder, volplane-provisioner, volplane-reclaimer or volplane-gateway")
	flag.StringVar(&f.KeyFile, "tls-key-file", "", "private key (PEM) of --tls-cert-file; reloaded when it changes")
	flag.BoolVar(&f.InsecurePlaintext, "insecure-plaintext", false, "serve and dial without TLS, letting anyone who reaches the port call every API: for local experiments only")
}

// ReflectionFlag registers --grpc-reflection.
func ReflectionFlag(on *bool) {
	flag.BoolVar(on, "grpc-reflection", false, "serve the gRPC reflection service (for grpcurl); it lists every method to whoever connects")
}

// ListFlag registers a repeatable, comma-separated flag.
func ListFlag(list *[]string, name, usage string) {
	flag.Var(&listValue{p: list}, name, usage)
}

// Run runs run under a context cancelled by SIGINT or SIGTERM and returns
// the process's exit code: 2 for bad usage, 1 when run fails.
func Run(component string, l *Logging, run func(ctx context.Context, log *slog.Logger) error) int {
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "%s: unexpected arguments %q (flags only; see --help)\n", component, flag.Args())
		return 2
	}
	log, err := grpcutil.NewLogger(os.Stderr, component, l.Level, l.Format)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", component, err)
		return 2
	}
	// Packages without a logger of their own (TLS reloads) log here too.
	slog.SetDefault(log)
	RouteKlog(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", component, err)
		return 1
	}
	return 0
}

// RouteKlog sends client-go's klog output (reflector and leader-election
// messages, its V-levels as slog levels below Info) through log, so that
// --log-format=json gives one format on stderr.
func RouteKlog(log *slog.Logger) {
	klog.SetSlogLogger(log.With("logger", "client-go"))
}

type float32Value float32

func (f *float32Value) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 32) }
func (f *float32Value) Set(s string) error {
	v, err := strconv.ParseFloat(s, 32)
	if err != nil {
		return fmt.Errorf("not a number: %q", s)
	}
	*f = float32Value(v)
	return nil
}

// listValue is a comma-separated, repeatable flag whose first use replaces
// the default.
type listValue struct {
	p   *[]string
	set bool
}

func (l *listValue) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l *listValue) Set(s string) error {
	if !l.set {
		*l.p, l.set = nil, true
	}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*l.p = append(*l.p, part)
		}
	}
	return nil
}
