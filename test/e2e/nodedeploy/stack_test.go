package nodedeploy

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/csisidecar"
	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/replica"
	"github.com/volplane/volplane/pkg/sidecar"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/services/provisioner/capacity"
	"github.com/volplane/volplane/services/reclaimer"
	"github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// stack is one run's provisioning: a driver per node and what provisions
// for them. stop ends it (the drivers end with the test).
type stack struct {
	name    string
	drivers map[string]*driver
	// capacityNamespace is where its CSIStorageCapacity objects are.
	capacityNamespace string
	stop              func()
}

// sidecarArgs are the csi-provisioner arguments of the node plugin's
// provisioner container, as a DaemonSet gives them: the same for
// csi-provisioner v6.3.0 and for volplane-csi-sidecar in its place.
func sidecarArgs(sock string) []string {
	return []string{"--csi-address=" + sock, "--node-deployment", "--node-deployment-base-delay=1s", "--node-deployment-max-delay=2s",
		"--enable-capacity", "--capacity-ownerref-level=0", "--capacity-poll-interval=2s", "--timeout=10s", "--v=5"}
}

// group runs functions until stopped.
type group struct {
	cancel context.CancelFunc
	ctx    context.Context
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   []string
}

func newGroup() *group {
	ctx, cancel := context.WithCancel(context.Background())
	return &group{ctx: ctx, cancel: cancel}
}

func (g *group) run(name string, f func(ctx context.Context) error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := f(g.ctx); err != nil && g.ctx.Err() == nil {
			g.mu.Lock()
			g.errs = append(g.errs, name+": "+err.Error())
			g.mu.Unlock()
		}
	}()
}

// stopAll cancels everything and waits; it reports what ended early.
func (g *group) stopAll(t *testing.T) {
	g.cancel()
	g.wg.Wait()
	for _, e := range g.errs {
		t.Errorf("ended early: %s", e)
	}
}

// startVolplane runs, per node, the dev driver and volplane-csi-sidecar
// with sidecarArgs (the DaemonSet's pod), and volplane's watcher,
// provisioner (--discover-sidecars, capacity on), reclaimer and binder.
// It returns once the provisioner serves the driver on every node.
func startVolplane(t *testing.T, c *e2e.Cluster, dir string) *stack {
	t.Helper()
	g := newGroup()
	s := &stack{name: "volplane", drivers: map[string]*driver{}, capacityNamespace: "volplane-system", stop: func() { g.stopAll(t) }}
	for _, node := range nodeNames {
		d := startDriver(t, c, dir, node)
		s.drivers[node] = d
		pod := "volplane-csi-node-" + node
		nodePod(t, c, pod, node)
		o, err := csisidecar.Parse(append(sidecarArgs(d.sock), "--volplane-listen=127.0.0.1:0", "--volplane-ca-file="+c.TLS("provisioner").CAFile))
		if err != nil {
			t.Fatal(err)
		}
		o.Client, o.PodName, o.NodeName, o.PodNamespace = c.Client, pod, node, csiNamespace
		o.Logger = c.Logger("sidecar-"+node, slog.LevelDebug)
		g.run("sidecar "+node, func(ctx context.Context) error { return csisidecar.Run(ctx, o) })
	}
	addrs := map[string]string{}
	for _, svc := range []string{"watcher", "provisioner", "reclaimer", "binder"} {
		a, err := devenv.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		addrs[svc] = a
	}
	ro := func(svc string) replica.Options {
		return replica.Options{Kubeconfig: c.Kubeconfig, EtcdEndpoints: c.EtcdEndpoints, Listen: addrs[svc], TLS: c.TLS(svc), Logger: c.Logger(svc, slog.LevelDebug)}
	}
	g.run("watcher", func(ctx context.Context) error {
		return watcher.Run(ctx, watcher.Options{Kubeconfig: c.Kubeconfig, Listen: addrs["watcher"], TLS: c.TLS("watcher"), Logger: c.Logger("watcher", slog.LevelInfo)})
	})
	g.run("provisioner", func(ctx context.Context) error {
		return provisioner.Run(ctx, provisioner.Options{Options: ro("provisioner"), DiscoverSidecars: true, Namespace: "volplane-system",
			WatcherAddress: addrs["watcher"], Timeout: 10 * time.Second, RecoveryPeriod: time.Second, ProbePeriod: time.Second,
			Capacity: capacity.Options{Enabled: true, Namespace: s.capacityNamespace, PollInterval: 2 * time.Second}})
	})
	g.run("reclaimer", func(ctx context.Context) error {
		return reclaimer.Run(ctx, reclaimer.Options{Options: ro("reclaimer"), ProvisionerAddress: addrs["provisioner"]})
	})
	g.run("binder", func(ctx context.Context) error {
		return binder.Run(ctx, binder.Options{Options: ro("binder"), WatcherAddress: addrs["watcher"], ReclaimerAddress: addrs["reclaimer"],
			ProvisionerAddress: addrs["provisioner"], RetryIntervalStart: 500 * time.Millisecond, RetryIntervalMax: 2 * time.Second})
	})
	if err := c.WaitServing(t.Context(), addrs["binder"], 2*time.Minute); err != nil {
		s.stop()
		t.Fatal(err)
	}
	waitServedOnEveryNode(t, c, addrs["provisioner"])
	checkRegistrations(t, c)
	return s
}

// checkRegistrations: each node's sidecar registered its node, the
// topology its driver's NodeGetInfo reports, and the node-deployment
// setting that a provisioner without node deployment refuses.
func checkRegistrations(t *testing.T, c *e2e.Cluster) {
	t.Helper()
	leases, err := c.Client.CoordinationV1().Leases(csiNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: sidecar.LabelRegistration})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := range leases.Items {
		r, err := sidecar.FromLease(&leases.Items[i])
		if err != nil {
			t.Fatal(err)
		}
		if r.Pod != "volplane-csi-node-"+r.Node || r.NodeTopology[devcsi.TopologyKey] != r.Node || len(r.NodeTopology) != 1 || !r.NodeImmediateBinding || !r.Settings.NodeDeployment {
			t.Errorf("registration %+v: want its pod's node, that node's topology, Immediate claims allowed and the nodeDeployment setting", r)
		}
		seen[r.Node] = true
	}
	if len(seen) != len(nodeNames) {
		t.Errorf("registered nodes %v, want %v", seen, nodeNames)
	}
}

// waitServedOnEveryNode waits until the provisioner lists the dev driver
// ready, with a sidecar on each node.
func waitServedOnEveryNode(t *testing.T, c *e2e.Cluster, addr string) {
	t.Helper()
	cc, err := c.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := provisionerv1.NewProvisionerServiceClient(cc)
	e2e.Eventually(t, time.Minute, func() string {
		resp, err := client.ListDrivers(t.Context(), &provisionerv1.ListDriversRequest{})
		if err != nil {
			return err.Error()
		}
		for _, d := range resp.GetDrivers() {
			if d.GetDriverName() == devcsi.DefaultName && d.GetReady() && strings.Count(d.GetEndpoint(), ", node ") == len(nodeNames) {
				return ""
			}
		}
		return fmt.Sprintf("drivers: %v", resp.GetDrivers())
	})
}

// startUpstream runs, per node, the dev driver and csi-provisioner v6.3.0
// with sidecarArgs (the DaemonSet's pod, as kubernetes-csi's
// csi-driver-host-path deploy/kubernetes-distributed runs it), and
// kube-controller-manager's binder.
func startUpstream(t *testing.T, c *e2e.Cluster, dir, provisionerBin, kcmBin string) *stack {
	t.Helper()
	s := &stack{name: "csi-provisioner", drivers: map[string]*driver{}, capacityNamespace: csiNamespace}
	var procs []*devenv.Process
	for _, node := range nodeNames {
		d := startDriver(t, c, dir, node)
		s.drivers[node] = d
		pod := "csi-provisioner-node-" + node
		nodePod(t, c, pod, node)
		p, err := devenv.StartProcessEnv(dir, "csi-provisioner-"+node, provisionerBin,
			[]string{"NODE_NAME=" + node, "POD_NAME=" + pod, "NAMESPACE=" + csiNamespace},
			append(sidecarArgs(d.sock), "--kubeconfig="+c.Kubeconfig)...)
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
	}
	kcm, err := devenv.StartProcess(dir, "kube-controller-manager", kcmBin, "--kubeconfig", c.Kubeconfig,
		"--controllers", "persistentvolume-binder-controller,persistentvolumeclaim-protection-controller,persistentvolume-protection-controller",
		"--leader-elect=false", "--secure-port=0", "--v=2")
	if err != nil {
		t.Fatal(err)
	}
	procs = append(procs, kcm)
	s.stop = func() {
		for _, p := range procs {
			p.Stop()
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range procs {
				t.Logf("log of %s: %s", p.Name, p.LogPath)
			}
		}
	})
	return s
}

// stackDir is a run's directory.
func stackDir(c *e2e.Cluster, name string) string { return filepath.Join(c.Dir(), name) }
