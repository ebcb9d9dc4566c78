// Package cmdutil holds what every volplane command's main shares: the
// common flags (logging, Kubernetes client, etcd) and running a service's
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
	flag.StringVar(kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "path to a kubeconfig; empty ($KUBECONFIG unset) uses the in-cluster configuration")
	flag.Var((*float32Value)(qps), "kube-api-qps", "client-side limit on Kubernetes API requests per second; 0 means no limit")
	flag.IntVar(burst, "kube-api-burst", 0, "burst above --kube-api-qps")
}

// EtcdFlag registers --etcd-endpoints, a comma-separated list.
func EtcdFlag(endpoints *[]string, purpose string) {
	*endpoints = []string{"http://127.0.0.1:2379"}
	flag.Var(&listValue{p: endpoints}, "etcd-endpoints", "comma-separated etcd client URLs for "+purpose)
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", component, err)
		return 1
	}
	return 0
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
