package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/pki"
)

// trial is one run on a fresh control plane: etcd and kube-apiserver as
// processes of their own (so that their CPU and memory can be read), what
// binds (volplane's services, kube-controller-manager, or the ceiling),
// the existing population, and the run's own volumes.
type trial struct {
	o       *Options
	sys     system
	pairs   int // claims the run creates (and volumes, when static)
	dir     string
	etcd    *devenv.Process
	etcdURL string
	api     *devenv.APIServer
	client  kubernetes.Interface
	metrics *metricsReader
	procs   []*devenv.Process // what binds, in start order
	binder  *devenv.Process   // whose log explains a stuck run
	csiSock string            // the dev CSI driver's socket path, when dynamic
	ceiling *ceiling
	// baseWatches are the apiserver's own watches, open before anything
	// else runs.
	baseWatches counts
	debug       map[string]string // process → base URL of its /debug/pprof (ProfileDir)
	// noProfiles: the phase measured now is not profiled (the
	// provisioning before a deletion burst).
	noProfiles bool
	certs      map[string]grpcutil.TLSFiles
	setup      Setup

	fail     chan error    // a child exited, or the ceiling failed
	stopping chan struct{} // closed by stop
	stopOnce sync.Once
}

// Setup is how long a run took to get ready for its measured phase.
type Setup struct {
	ControlPlane time.Duration // etcd and kube-apiserver ready
	Existing     Existing      // the population made before the services start
	Services     time.Duration // what binds started and ready
	Volumes      time.Duration // the run's own volumes created and Available (static)
	// Settled is how long the processes took to go idle after an
	// existing population was loaded (0 without one); Quiet says whether
	// they did within the limit.
	Settled time.Duration
	Quiet   bool
}

// settleLimit bounds the wait for the services to digest an existing
// population before the measured phase.
const settleLimit = 2 * time.Minute

// start brings up a trial for sys, ready to measure pairs claims.
func start(ctx context.Context, o *Options, sys system, pairs int) (_ *trial, err error) {
	dir, err := os.MkdirTemp("", "volplane-bench-")
	if err != nil {
		return nil, err
	}
	t := &trial{o: o, sys: sys, pairs: pairs, dir: dir, debug: map[string]string{}, fail: make(chan error, 1), stopping: make(chan struct{})}
	defer func() {
		if err != nil {
			t.stop()
		}
	}()
	began := time.Now()
	fmt.Fprintf(o.Log, "starting etcd and kube-apiserver...\n")
	if err := t.startControlPlane(ctx); err != nil {
		return nil, err
	}
	t.setup.ControlPlane = time.Since(began)
	if o.Existing > 0 {
		if t.setup.Existing, err = createExisting(ctx, t.client, o.Existing, o.Clients, o.Log); err != nil {
			return nil, fmt.Errorf("existing population: %w", err)
		}
	}
	began = time.Now()
	fmt.Fprintf(o.Log, "starting %s...\n", o.name(sys))
	if err := t.startSystem(ctx); err != nil {
		return nil, err
	}
	t.setup.Services = time.Since(began)
	began = time.Now()
	if err := t.prepare(ctx); err != nil {
		return nil, err
	}
	t.setup.Volumes = time.Since(began)
	if o.Existing > 0 {
		fmt.Fprintf(o.Log, "waiting until the processes are idle (at most %s)...\n", settleLimit)
		t.setup.Settled, t.setup.Quiet = settle(ctx, t.procList(), settleLimit)
	}
	return t, nil
}

// stop stops everything the trial started and removes its directory.
func (t *trial) stop() {
	t.stopOnce.Do(func() {
		close(t.stopping)
		if t.ceiling != nil {
			t.ceiling.stop()
		}
		for i := len(t.procs) - 1; i >= 0; i-- {
			t.procs[i].Stop()
		}
		if t.api != nil {
			t.api.Stop()
		}
		if t.etcd != nil {
			t.etcd.Stop()
		}
		if t.o.KeepLogs {
			fmt.Fprintf(os.Stderr, "kept the run's logs in %s\n", t.dir)
			return
		}
		os.RemoveAll(t.dir)
	})
}

// failed reports err once as the trial's failure.
func (t *trial) failed(err error) {
	select {
	case t.fail <- err:
	default:
	}
}

// startProcess starts a child whose unexpected exit fails the trial.
func (t *trial) startProcess(name, bin string, args ...string) (*devenv.Process, error) {
	return t.startProcessEnv(name, bin, nil, args...)
}

// startProcessEnv is startProcess with env added to the child's
// environment.
func (t *trial) startProcessEnv(name, bin string, env []string, args ...string) (*devenv.Process, error) {
	cpus := t.o.others
	if name == "etcd" {
		cpus = t.o.controlPlane
	}
	p, err := devenv.StartProcessOn(t.dir, name, bin, cpus, env, args...)
	if err != nil {
		return nil, err
	}
	go func() {
		select {
		case <-p.Done():
			select {
			case <-t.stopping:
			default:
				t.failed(fmt.Errorf("%s exited: %s (log: %s)", name, p.ExitStatus(), p.LogPath))
			}
		case <-t.stopping:
		}
	}()
	return p, nil
}

// startControlPlane starts etcd (volplane-etcd) and kube-apiserver and
// makes the bench's namespace.
func (t *trial) startControlPlane(ctx context.Context) error {
	client, err1 := devenv.FreeAddr()
	peer, err2 := devenv.FreeAddr()
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	m := devenv.EtcdServerOptions{Name: "bench", DataDir: filepath.Join(t.dir, "etcd"), ClientURL: "http://" + client, PeerURL: "http://" + peer}
	var err error
	if t.etcd, err = t.startProcess("etcd", filepath.Join(t.o.BinDir, "volplane-etcd"), append(m.Args(), "--log-level", "warn")...); err != nil {
		return err
	}
	t.etcdURL = m.ClientURL
	if err := waitHealthy(ctx, t.etcdURL+"/health", t.fail, time.Minute); err != nil {
		return fmt.Errorf("etcd: %w (log: %s)", err, t.etcd.LogPath)
	}
	var extra []string
	if t.o.ProfileDir != "" {
		extra = append(extra, "--profiling=true") // /debug/pprof, for the profile of its CPU
	}
	if t.api, err = devenv.StartAPIServer(ctx, devenv.APIServerOptions{Dir: filepath.Join(t.dir, "apiserver"),
		KubeAPIServer: t.o.KubeAPIServer, EtcdServers: []string{t.etcdURL}, ExtraArgs: extra, CPUs: t.o.controlPlane}); err != nil {
		return err
	}
	t.client = t.newClient("volplane-bench")
	hc, err := rest.HTTPClientFor(t.api.RESTConfig)
	if err != nil {
		return err
	}
	t.metrics = &metricsReader{api: hc, etcd: http.DefaultClient, apiURL: t.api.URL, etcdURL: t.etcdURL}
	base, err := t.metrics.snapshot(ctx)
	if err != nil {
		return err
	}
	t.baseWatches = base.watches
	_, err = t.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}, metav1.CreateOptions{})
	return err
}

// newClient is a protobuf client with no rate limit on a connection of
// its own: the claims' creates, the tracker's watch and the ceiling's
// writes do not share one HTTP/2 connection, as they would not share one
// between processes.
func (t *trial) newClient(userAgent string) kubernetes.Interface {
	cfg := kube.Tune(t.api.RESTConfig, kube.ClientOptions{UserAgent: userAgent})
	cfg.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	return kubernetes.NewForConfigOrDie(cfg)
}

// waitHealthy polls url until it answers 200.
func waitHealthy(ctx context.Context, url string, fail <-chan error, timeout time.Duration) error {
	return waitHealthyWith(ctx, http.DefaultClient, url, fail, timeout)
}

// waitHealthyWith is waitHealthy with client.
func waitHealthyWith(ctx context.Context, client *http.Client, url string, fail <-chan error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
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
		case <-ctx.Done():
			return ctx.Err()
		case err := <-fail:
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not healthy within %s: %s", url, timeout, last)
}

// startSystem starts what binds.
func (t *trial) startSystem(ctx context.Context) error {
	if t.o.Dynamic {
		if err := t.startDriver(ctx); err != nil {
			return err
		}
	}
	switch t.sys {
	case sysCeiling:
		c, err := newCeiling(t.newClient("volplane-bench-ceiling"), t.o.workers(), t.pairs, t.csiSock, t.failed)
		if err != nil {
			return err
		}
		t.ceiling = c
		return nil
	case sysKCM:
		return t.startKCM(ctx)
	default:
		return t.startVolplane(ctx)
	}
}

// startKCM runs kube-controller-manager's PV binder, and csi-provisioner
// when dynamic. With ProfileDir both serve /debug/pprof: csi-provisioner
// on plain HTTP (--http-endpoint, --enable-pprof), kube-controller-manager
// on its secure port (--profiling is its default) with a self-signed
// certificate, the pprof paths allowed without authorization and requests
// without credentials taken as anonymous (no --authentication-kubeconfig),
// so that the bench needs no credential of its own to profile it.
func (t *trial) startKCM(ctx context.Context) error {
	qps := strconv.Itoa(kcmQPS(t.o.KCMQPS))
	if t.o.ExternalProvisioner != "" {
		args := []string{"--csi-address", t.csiSock, "--kubeconfig", t.api.Kubeconfig, "--leader-election=false",
			"--kube-api-qps", qps, "--kube-api-burst", qps, "--v=1"}
		if t.o.ProfileDir != "" {
			addr, err := devenv.FreeAddr()
			if err != nil {
				return err
			}
			t.debug["csi-provisioner"] = "http://" + addr
			args = append(args, "--http-endpoint", addr, "--enable-pprof")
		}
		p, err := t.startProcess("csi-provisioner", t.o.ExternalProvisioner, args...)
		if err != nil {
			return err
		}
		t.procs = append(t.procs, p)
	}
	args := []string{"--kubeconfig", t.api.Kubeconfig,
		"--controllers", "persistentvolume-binder-controller",
		"--kube-api-qps", qps, "--kube-api-burst", qps,
		"--kube-api-content-type", "application/vnd.kubernetes.protobuf",
		"--leader-elect=false", "--v=1"}
	if t.o.ProfileDir == "" {
		args = append(args, "--secure-port=0")
	} else {
		addr, err := devenv.FreeAddr()
		if err != nil {
			return err
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return err
		}
		t.debug["kube-controller-manager"] = "https://" + addr
		args = append(args, "--bind-address", host, "--secure-port", port, "--cert-dir", filepath.Join(t.dir, "kcm-certs"),
			"--profiling=true", "--authorization-always-allow-paths", "/healthz,/readyz,/livez,/debug/pprof/*")
	}
	p, err := t.startProcess("kube-controller-manager", t.o.KCM, args...)
	if err != nil {
		return err
	}
	t.procs, t.binder = append(t.procs, p), p
	if u := t.debug["kube-controller-manager"]; u != "" {
		if err := waitHealthyWith(ctx, insecureClient, u+"/healthz", t.fail, time.Minute); err != nil {
			return fmt.Errorf("kube-controller-manager: %w (log: %s)", err, p.LogPath)
		}
	}
	return nil
}

// insecureClient reaches kube-controller-manager's secure port, whose
// certificate it made itself: only for its profiles, on loopback.
var insecureClient = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // loopback, self-signed, profiles only

// kcmQPS is kube-controller-manager's (and csi-provisioner's) client QPS:
// qps, or kube-controller-manager's default of 20.
func kcmQPS(qps int) int {
	if qps <= 0 {
		return 20
	}
	return qps
}

// startDriver runs the dev CSI driver on a unix socket.
func (t *trial) startDriver(ctx context.Context) error {
	t.csiSock = filepath.Join(t.dir, "csi.sock")
	sock := "unix://" + t.csiSock
	p, err := t.startProcess("volplane-csi", filepath.Join(t.o.BinDir, "volplane-csi"),
		"--endpoint", sock, "--root-dir", filepath.Join(t.dir, "csi"), "--node-id", benchNode, "--log-level", "warn")
	if err != nil {
		return err
	}
	t.procs = append(t.procs, p)
	if err := devenv.WaitCSIServing(ctx, sock, time.Minute); err != nil {
		return fmt.Errorf("dev CSI driver: %w (log: %s)", err, p.LogPath)
	}
	return nil
}

// startVolplane runs the watcher and the binder, and the provisioner when
// dynamic (fed by the watcher's stream, as deployed; for the hop's B, with
// the dev driver behind a volplane-csi-sidecar, hop.go) and the reclaimer
// for a deletion burst, with mutual TLS between them as in production.
func (t *trial) startVolplane(ctx context.Context) error {
	var err error
	if t.certs, err = pki.Generate(filepath.Join(t.dir, "tls"), append(pki.Services, "bench", callers.Conformance)...); err != nil {
		return fmt.Errorf("generate certificates: %w", err)
	}
	etcd := t.etcdURL
	// The watcher first: the binder and the provisioner stream from it.
	watcherAddr, err := devenv.FreeAddr()
	if err != nil {
		return err
	}
	watcherArgs := append([]string{"--kubeconfig", t.api.Kubeconfig, "--listen", watcherAddr, "--log-level", "warn"}, devenv.TLSArgs(t.certs["watcher"])...)
	if t.o.ProfileDir != "" {
		addr, err := devenv.FreeAddr()
		if err != nil {
			return err
		}
		t.debug["watcher"] = "http://" + addr
		watcherArgs = append(watcherArgs, "--debug-address", addr, "--enable-pprof")
	}
	w, err := t.startProcess("watcher", filepath.Join(t.o.BinDir, "watcher"), watcherArgs...)
	if err != nil {
		return err
	}
	t.procs = append(t.procs, w)
	var provisionerAddr string
	if t.o.Dynamic {
		if provisionerAddr, err = devenv.FreeAddr(); err != nil {
			return err
		}
		if t.sys == sysSidecar {
			if err := t.prepareHop(ctx); err != nil {
				return fmt.Errorf("the sidecar's pod and role: %w", err)
			}
		}
		args := append([]string{"--kubeconfig", t.api.Kubeconfig, "--etcd-endpoints", etcd,
			"--listen", provisionerAddr, "--watcher-address", watcherAddr, "--log-level", "warn"}, devenv.TLSArgs(t.certs["provisioner"])...)
		args = append(args, provisionerDriverArgs(t.sys, t.csiSock)...)
		args = append(args, t.o.ServiceFlags...)
		if t.o.ProfileDir != "" {
			addr, err := devenv.FreeAddr()
			if err != nil {
				return err
			}
			t.debug["provisioner"] = "http://" + addr
			args = append(args, "--debug-address", addr, "--enable-pprof")
		}
		p, err := t.startProcess("provisioner", filepath.Join(t.o.BinDir, "provisioner"), args...)
		if err != nil {
			return err
		}
		t.procs = append(t.procs, p)
		if err := devenv.WaitServing(ctx, provisionerAddr, "", t.certs["bench"], 2*time.Minute); err != nil {
			return fmt.Errorf("provisioner: %w (log: %s)", err, p.LogPath)
		}
		if t.sys == sysSidecar {
			if err := t.startSidecar(ctx, provisionerAddr); err != nil {
				return fmt.Errorf("%w (provisioner's log: %s)", err, p.LogPath)
			}
		}
	}
	// The reclaimer, for deletion bursts: the binder hands it the volumes
	// Released by the deleted claims, and it deletes them through the
	// provisioner, as deployed.
	var reclaimerAddr string
	if t.o.Delete {
		if reclaimerAddr, err = devenv.FreeAddr(); err != nil {
			return err
		}
		args := append([]string{"--kubeconfig", t.api.Kubeconfig, "--etcd-endpoints", etcd, "--listen", reclaimerAddr,
			"--provisioner-address", provisionerAddr, "--member-id", "reclaimer", "--log-level", "warn"}, devenv.TLSArgs(t.certs["reclaimer"])...)
		if t.o.ProfileDir != "" {
			addr, err := devenv.FreeAddr()
			if err != nil {
				return err
			}
			t.debug["reclaimer"] = "http://" + addr
			args = append(args, "--debug-address", addr, "--enable-pprof")
		}
		r, err := t.startProcess("reclaimer", filepath.Join(t.o.BinDir, "reclaimer"), args...)
		if err != nil {
			return err
		}
		t.procs = append(t.procs, r)
		if err := devenv.WaitServing(ctx, reclaimerAddr, "", t.certs["bench"], 2*time.Minute); err != nil {
			return fmt.Errorf("reclaimer: %w (log: %s)", err, r.LogPath)
		}
	}
	// Every binder replica streams from the one watcher; the first is the
	// one whose log a stuck run names and, with ProfileDir, is profiled.
	for i := range max(t.o.Binders, 1) {
		name := "binder"
		if i > 0 {
			name = fmt.Sprintf("binder-%d", i+1)
		}
		binderAddr, err := devenv.FreeAddr()
		if err != nil {
			return err
		}
		binderArgs := append([]string{"--kubeconfig", t.api.Kubeconfig, "--etcd-endpoints", etcd,
			"--listen", binderAddr, "--watcher-address", watcherAddr, "--member-id", name, "--log-level", "warn"}, devenv.TLSArgs(t.certs["binder"])...)
		binderArgs = append(binderArgs, "--workers", strconv.Itoa(t.o.workers()))
		binderArgs = append(binderArgs, t.o.ServiceFlags...)
		binderArgs = append(binderArgs, t.o.BinderFlags...)
		if provisionerAddr != "" {
			binderArgs = append(binderArgs, "--provisioner-address", provisionerAddr)
		}
		if reclaimerAddr != "" {
			binderArgs = append(binderArgs, "--reclaimer-address", reclaimerAddr)
		}
		if t.o.ProfileDir != "" && i == 0 {
			addr, err := devenv.FreeAddr()
			if err != nil {
				return err
			}
			t.debug["binder"] = "http://" + addr
			binderArgs = append(binderArgs, "--debug-address", addr, "--enable-pprof")
		}
		b, err := t.startProcess(name, filepath.Join(t.o.BinDir, "binder"), binderArgs...)
		if err != nil {
			return err
		}
		t.procs = append(t.procs, b)
		if i == 0 {
			t.binder = b
		}
		if err := devenv.WaitServing(ctx, binderAddr, "", t.certs["bench"], 2*time.Minute); err != nil {
			return fmt.Errorf("%s: %w (log: %s)", name, err, b.LogPath)
		}
	}
	return nil
}

// benchNode is the dev CSI driver's node.
const benchNode = "bench-node"

// prepare makes what the claims need: for dynamic provisioning the
// driver's Node and CSINode and the class; for static binding the run's
// volumes, Available before the first claim arrives.
func (t *trial) prepare(ctx context.Context) error {
	if t.o.Dynamic {
		// The driver's node, registered as its kubelet would: external-
		// provisioner refuses to provision for a topology-aware driver
		// that no CSINode lists, and every provisioner should see the same.
		if _, err := t.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: benchNode,
			Labels: map[string]string{devcsi.TopologyKey: benchNode}}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		if _, err := t.client.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: benchNode},
			Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: devcsi.DefaultName, NodeID: benchNode,
				TopologyKeys: []string{devcsi.TopologyKey}}}}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		policy := corev1.PersistentVolumeReclaimDelete
		mode := storagev1.VolumeBindingImmediate
		_, err := t.client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
			ObjectMeta: metav1.ObjectMeta{Name: benchClass}, Provisioner: devcsi.DefaultName,
			ReclaimPolicy: &policy, VolumeBindingMode: &mode,
		}, metav1.CreateOptions{})
		return err
	}
	fmt.Fprintf(t.o.Log, "creating %d volumes...\n", t.pairs)
	var volumes []*corev1.PersistentVolume
	if t.ceiling != nil {
		volumes = make([]*corev1.PersistentVolume, t.pairs)
	}
	if err := parallel(ctx, t.pairs, t.o.Clients, func(i int) error {
		v, err := t.client.CoreV1().PersistentVolumes().Create(ctx, volume(i), metav1.CreateOptions{})
		if err != nil || volumes == nil {
			return err
		}
		// No controller makes the ceiling's volumes Available: the bench
		// does, so that they are the same objects volplane binds.
		v.Status.Phase = corev1.VolumeAvailable
		volumes[i], err = t.client.CoreV1().PersistentVolumes().UpdateStatus(ctx, v, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("create volumes: %w", err)
	}
	if volumes != nil {
		t.ceiling.volumes = volumes
		return nil
	}
	// Let the binder make every volume Available before claims arrive.
	if err := waitVolumesAvailable(ctx, t.client, t.pairs, t.fail); err != nil {
		return fmt.Errorf("%w (log: %s)", err, t.binder.LogPath)
	}
	return nil
}

// procList is every process whose cost a run reports: what binds, then
// kube-apiserver, etcd and the bench itself (the load generator, and the
// ceiling's client).
func (t *trial) procList() []proc {
	var out []proc
	for _, p := range t.procs {
		out = append(out, proc{name: p.Name, pid: p.PID, binds: p.Name != "volplane-csi"})
	}
	out = append(out, proc{name: "kube-apiserver", pid: t.api.PID}, proc{name: "etcd", pid: t.etcd.PID},
		proc{name: "volplane-bench", pid: os.Getpid})
	return out
}
