// Package slowapi tests volplane against a slow API server, end to end: a
// real kube-apiserver and etcd, the dev CSI driver, and the watcher,
// binder, provisioner and reclaimer in this process, whose every request
// to the API server goes through a proxy that holds it for seconds
// (e2e.LatencyProxy). A slow API server must slow volplane down, never
// stop it: claims keep binding at the API server's pace, no service turns
// NOT_SERVING, and the binder never refuses a step because its watch
// stream looks stale (issue 23, item 6).
package slowapi

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/replica"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/services/reclaimer"
	"github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

var (
	cl     *e2e.Cluster
	client kubernetes.Interface // straight to the API server
	proxy  *e2e.LatencyProxy    // in front of it, for the services
	// services by name, with their addresses.
	services []service
	logs     = &records{}
)

type service struct{ name, addr string }

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e/slowapi: skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var err error
	cl, err = e2e.StartCluster(ctx, "e2e/slowapi", e2e.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/slowapi:", err)
		return 1
	}
	defer cl.Stop()
	client = cl.Client
	env := cl.Env
	logger := func(name string) *slog.Logger {
		return slog.New(&recorder{next: cl.Logger(name, slog.LevelInfo).Handler(), rec: logs, component: name})
	}

	u, err := url.Parse(env.APIServerURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/slowapi:", err)
		return 1
	}
	if proxy, err = e2e.NewLatencyProxy(u.Host); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/slowapi:", err)
		return 1
	}
	defer proxy.Close()
	slow := rest.CopyConfig(env.RESTConfig)
	slow.Host = "https://" + proxy.Addr()

	drv, err := devcsi.New(devcsi.Options{RootDir: filepath.Join(cl.Dir(), "csi"), NodeID: "node-a", Logger: logger("csi")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/slowapi: dev CSI driver:", err)
		return 1
	}
	if err := devcsi.RegisterNode(ctx, client, drv.Name(), drv.NodeID()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/slowapi:", err)
		return 1
	}
	sock := "unix://" + filepath.Join(cl.Dir(), "csi.sock")
	lis, err := grpcutil.Listen(sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	csiSrv := grpcutil.NewCSIServer(logger("csi"))
	drv.Register(csiSrv.Server)
	csiSrv.SetServing(true)
	go func() { _ = csiSrv.Serve(ctx, lis, 10*time.Second) }()

	addr := func() string {
		a, err := devenv.FreeAddr()
		if err != nil {
			panic(err)
		}
		return a
	}
	w, p, r, b := addr(), addr(), addr(), addr()
	opts := func(name, listen string) replica.Options {
		return replica.Options{RESTConfig: slow, EtcdEndpoints: env.EtcdEndpoints, Listen: listen, TLS: cl.TLS(name), Logger: logger(name)}
	}
	runs := []struct {
		name, addr string
		run        func(context.Context) error
	}{
		{"watcher", w, func(ctx context.Context) error {
			return watcher.Run(ctx, watcher.Options{RESTConfig: slow, Listen: w, TLS: cl.TLS("watcher"), Logger: logger("watcher")})
		}},
		{"provisioner", p, func(ctx context.Context) error {
			return provisioner.Run(ctx, provisioner.Options{Options: opts("provisioner", p), CSIEndpoints: []string{sock}, WatcherAddress: w,
				Timeout: 5 * time.Second, RecoveryPeriod: time.Second})
		}},
		{"reclaimer", r, func(ctx context.Context) error {
			return reclaimer.Run(ctx, reclaimer.Options{Options: opts("reclaimer", r), ProvisionerAddress: p, TakeoverPeriod: time.Second})
		}},
		{"binder", b, func(ctx context.Context) error {
			return binder.Run(ctx, binder.Options{Options: opts("binder", b), WatcherAddress: w, ReclaimerAddress: r, ProvisionerAddress: p,
				ResyncPeriod: 10 * time.Minute})
		}},
	}
	sctx, stop := context.WithCancel(ctx)
	errc := make(chan error, len(runs))
	for _, s := range runs {
		services = append(services, service{s.name, s.addr})
		go func() {
			err := s.run(sctx)
			if err != nil {
				err = fmt.Errorf("%s: %w", s.name, err)
			}
			errc <- err
		}()
		if err := cl.WaitServing(ctx, s.addr, 2*time.Minute); err != nil {
			fmt.Fprintf(os.Stderr, "e2e/slowapi: %s did not start: %v\n", s.name, err)
			cl.DumpLogs(os.Stderr)
			stop()
			return 1
		}
	}
	return cl.RunTests(m, "e2e/slowapi", stop, errc, len(runs))
}

// records keeps every log record of the services: component, message and
// attributes as text.
type records struct {
	mu   sync.Mutex
	list []string
}

// count is how many records so far contain every one of subs.
func (r *records) count(subs ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
next:
	for _, s := range r.list {
		for _, sub := range subs {
			if !strings.Contains(s, sub) {
				continue next
			}
		}
		n++
	}
	return n
}

// recorder is a slog.Handler that adds each record to records, and passes
// it on.
type recorder struct {
	next      slog.Handler
	rec       *records
	component string
	attrs     string
}

func (h *recorder) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *recorder) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %s%s", h.component, r.Level, r.Message, h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	h.rec.mu.Lock()
	h.rec.list = append(h.rec.list, b.String())
	h.rec.mu.Unlock()
	return h.next.Handle(ctx, r)
}

func (h *recorder) WithAttrs(as []slog.Attr) slog.Handler {
	attrs := h.attrs
	for _, a := range as {
		attrs += fmt.Sprintf(" %s=%v", a.Key, a.Value)
	}
	return &recorder{next: h.next.WithAttrs(as), rec: h.rec, component: h.component, attrs: attrs}
}

func (h *recorder) WithGroup(n string) slog.Handler {
	return &recorder{next: h.next.WithGroup(n), rec: h.rec, component: h.component, attrs: h.attrs}
}
