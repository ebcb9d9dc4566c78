package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/pki"
)

// ClusterOptions configures StartCluster.
type ClusterOptions struct {
	// Dir holds everything: etcd data, certificates, logs, the CSI
	// driver's volumes and the hostPath volumes (required).
	Dir string
	// BinDir holds the binaries `make build` makes (required).
	BinDir string
	// KubeAPIServer is the kube-apiserver binary; empty means
	// devenv.FindKubeAPIServer.
	KubeAPIServer string
	// EtcdMembers is 1, or 3 for a cluster whose members fail one at a
	// time; default 1.
	EtcdMembers int
	// Replicas of each service; 0 runs none (but see StartCluster).
	Watchers, Binders, Provisioners, Reclaimers int
	// Gateway runs the REST gateway too.
	Gateway bool
	// Standalone runs the provisioners and reclaimers with --standalone:
	// they act on their own, beside kube-controller-manager's binder
	// (which the caller runs: test/e2e/standalone); run no binder then.
	Standalone bool
	// CSIArgs are added to the dev CSI driver's command line, e.g.
	// --driver-fault=CreateVolume=delay:3s.
	CSIArgs []string
	// Env gives a replica (by name, e.g. "provisioner-1") environment
	// variables for its first start only, e.g. a fault point; a restart
	// runs without them, as a fresh replica would.
	Env map[string][]string
	// Args are added to a service replica's command line (by name, e.g.
	// "provisioner-1"), after the cluster's own: a flag given again
	// overrides it, e.g. --retry-interval-max, or a --debug-address to
	// scrape.
	Args map[string][]string
	// LogLevel of the services; default info.
	LogLevel string
	// Logf reports progress; nil is silent.
	Logf func(format string, args ...any)
}

// Client is the name of the chaos run's own client certificate, with
// which it calls the services (health, and the binders' caches for the
// checks): the test harness's identity (pkg/callers).
const Client = callers.Conformance

// NodeName is the node the reclaimers scrub Recycle volumes on.
const NodeName = "chaos-node"

// Cluster is a running volplane: every part a separate process that can
// be killed with SIGKILL and started again.
type Cluster struct {
	// Dir is ClusterOptions.Dir.
	Dir string
	// API is the kube-apiserver.
	API *devenv.APIServer
	// Client is an admin client of API.
	Client kubernetes.Interface
	// Etcd are the etcd members.
	Etcd []*Replica
	// EtcdEndpoints are the members' client URLs (https).
	EtcdEndpoints []string
	// EtcdSecurity is the services' etcd client TLS.
	EtcdSecurity coord.Security
	// TLS holds each service's certificate and Client's.
	TLS map[string]grpcutil.TLSFiles
	// CSI is the dev CSI driver; CSIRoot its state and volumes.
	CSI     *Replica
	CSIRoot string
	// HostPath is the directory under which static hostPath volumes live
	// and Recycle may scrub.
	HostPath string
	// Services are the volplane replicas, watchers first.
	Services []*Replica
	// GatewayURL is the REST gateway's https:// URL (with
	// ClusterOptions.Gateway); its certificate is the services' CA's.
	GatewayURL string

	o ClusterOptions
}

// Replica is one process of the cluster: a service replica, an etcd
// member or the CSI driver.
type Replica struct {
	// Name is unique in the cluster, e.g. "binder-2".
	Name string
	// Service is what it runs: "etcd", "volplane-csi", "watcher", ...
	Service string
	// Addr is where it serves (gRPC; an https:// URL for etcd; a unix://
	// endpoint for the CSI driver).
	Addr string

	bin  string
	args func(gen int) []string
	env  []string
	logs string

	mu      sync.Mutex
	gen     int
	cmd     *exec.Cmd
	done    chan struct{}
	exit    int  // the last run's exit code, -1 for a signal
	killing bool // the run ends because Kill or Stop asked
	crashes int  // runs that ended without Kill or Stop
}

// standaloneFlag is the reclaimer's --standalone when on, else nothing:
// a reclaimer of a release before --standalone (test/e2e/skew) refuses a
// flag it does not know, and off is its default.
func standaloneFlag(on bool) []string {
	if on {
		return []string{"--standalone=true"}
	}
	return nil
}

// StartCluster starts etcd, kube-apiserver, the CSI driver and the
// services, and waits until each serves.
func StartCluster(ctx context.Context, o ClusterOptions) (_ *Cluster, err error) {
	if o.Dir == "" || o.BinDir == "" {
		return nil, errors.New("chaos: ClusterOptions needs Dir and BinDir")
	}
	if o.EtcdMembers == 0 {
		o.EtcdMembers = 1
	}
	if o.EtcdMembers != 1 && o.EtcdMembers != 3 {
		return nil, fmt.Errorf("chaos: %d etcd members: run 1 or 3", o.EtcdMembers)
	}
	if o.LogLevel == "" {
		o.LogLevel = "info"
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	c := &Cluster{Dir: o.Dir, o: o, CSIRoot: filepath.Join(o.Dir, "csi", "root"), HostPath: filepath.Join(o.Dir, "hostpath")}
	for _, d := range []string{filepath.Join(o.Dir, "logs"), c.CSIRoot, c.HostPath} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	// etcd, with client TLS and client certificates required.
	srvTLS, apiEtcd, svcEtcd, err := devenv.EtcdCerts(filepath.Join(o.Dir, "etcd-pki"))
	if err != nil {
		return nil, err
	}
	c.EtcdSecurity = svcEtcd
	var initial []string
	var members []devenv.EtcdServerOptions
	for i := range o.EtcdMembers {
		client, err1 := devenv.FreeAddr()
		peer, err2 := devenv.FreeAddr()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		m := devenv.EtcdServerOptions{Name: fmt.Sprintf("etcd-%d", i+1), DataDir: filepath.Join(o.Dir, fmt.Sprintf("etcd-%d", i+1)),
			ClientURL: "https://" + client, PeerURL: "http://" + peer, TLS: srvTLS}
		members = append(members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
		c.EtcdEndpoints = append(c.EtcdEndpoints, m.ClientURL)
	}
	for _, m := range members {
		m.InitialCluster = strings.Join(initial, ",")
		args := m.Args()
		c.Etcd = append(c.Etcd, c.replica(m.Name, "etcd", m.ClientURL, "volplane-etcd", func(int) []string { return args }))
	}
	for _, m := range c.Etcd {
		if err := m.Start(); err != nil {
			return nil, err
		}
	}
	if err := c.WaitEtcd(ctx, 2*time.Minute); err != nil {
		return nil, err
	}
	o.Logf("etcd ready: %d member(s), %s", len(c.Etcd), strings.Join(c.EtcdEndpoints, ","))

	c.API, err = devenv.StartAPIServer(ctx, devenv.APIServerOptions{Dir: filepath.Join(o.Dir, "apiserver"), KubeAPIServer: o.KubeAPIServer,
		EtcdServers: c.EtcdEndpoints, Etcd: apiEtcd})
	if err != nil {
		return nil, err
	}
	cfg := kube.Tune(c.API.RESTConfig, kube.ClientOptions{UserAgent: "volplane-chaos"})
	// Recycle's deprecation warning, once per static PV, is noise here.
	cfg.WarningHandler = rest.NoWarnings{}
	c.Client = kubernetes.NewForConfigOrDie(cfg)
	o.Logf("kube-apiserver ready at %s", c.API.URL)

	if c.TLS, err = pki.Generate(filepath.Join(o.Dir, "tls"), append(append([]string{}, pki.Services...), Client)...); err != nil {
		return nil, fmt.Errorf("generate certificates: %w", err)
	}
	csi := "unix://" + filepath.Join(o.Dir, "csi", "csi.sock")
	c.CSI = c.replica("volplane-csi", "volplane-csi", csi, "volplane-csi", func(int) []string {
		return append([]string{"--endpoint", csi, "--root-dir", c.CSIRoot, "--node-id", NodeName, "--log-level", o.LogLevel}, o.CSIArgs...)
	})
	if err := c.CSI.Start(); err != nil {
		return nil, err
	}
	if err := devcsi.RegisterNode(ctx, c.Client, devcsi.DefaultName, NodeName); err != nil {
		return nil, err
	}
	if err := devenv.WaitCSIServing(ctx, csi, time.Minute); err != nil {
		return nil, fmt.Errorf("CSI driver: %w (log %s)", err, c.CSI.logs)
	}

	addrs := map[string][]string{}
	for _, s := range []struct {
		name string
		n    int
	}{{"watcher", o.Watchers}, {"provisioner", o.Provisioners}, {"reclaimer", o.Reclaimers}, {"binder", o.Binders}} {
		for range s.n {
			a, err := devenv.FreeAddr()
			if err != nil {
				return nil, err
			}
			addrs[s.name] = append(addrs[s.name], a)
		}
	}
	pick := func(service string, i int) string {
		if l := addrs[service]; len(l) > 0 {
			return l[i%len(l)]
		}
		return ""
	}
	etcdArgs := []string{"--etcd-endpoints", strings.Join(c.EtcdEndpoints, ","),
		"--etcd-cacert", svcEtcd.CAFile, "--etcd-cert", svcEtcd.CertFile, "--etcd-key", svcEtcd.KeyFile}
	common := func(service string) []string {
		return append([]string{"--kubeconfig", c.API.Kubeconfig, "--log-level", o.LogLevel}, devenv.TLSArgs(c.TLS[service])...)
	}
	for i, a := range addrs["watcher"] {
		c.service("watcher", i, a, func(int) []string { return append(common("watcher"), "--listen", a) })
	}
	var standalone []string
	if o.Standalone {
		standalone = []string{"--standalone", "--retry-interval-max", "5s"}
	}
	for i, a := range addrs["provisioner"] {
		c.service("provisioner", i, a, func(gen int) []string {
			return append(append(append(common("provisioner"), etcdArgs...), "--listen", a, "--member-id", memberID("provisioner", i, gen),
				"--csi-endpoint", csi, "--recovery-period", provisionerRecoveryPeriod.String(), "--timeout", "10s", "--probe-period", "2s",
				"--watcher-address", strings.Join(addrs["watcher"], ",")), standalone...)
		})
	}
	for i, a := range addrs["reclaimer"] {
		c.service("reclaimer", i, a, func(gen int) []string {
			return append(append(append(common("reclaimer"), etcdArgs...), "--listen", a, "--member-id", memberID("reclaimer", i, gen),
				"--provisioner-address", pick("provisioner", i), "--recycle-mode", "node-local", "--node-name", NodeName,
				"--recycle-path-prefixes", c.HostPath, "--takeover-period", "2s", "--retry-interval-max", "5s"), standaloneFlag(o.Standalone)...)
		})
	}
	for i, a := range addrs["binder"] {
		c.service("binder", i, a, func(gen int) []string {
			args := append(append(common("binder"), etcdArgs...), "--listen", a, "--member-id", memberID("binder", i, gen),
				"--watcher-address", strings.Join(addrs["watcher"], ","), "--resync-period", "10s")
			if p := pick("provisioner", i); p != "" {
				args = append(args, "--provisioner-address", p)
			}
			if r := pick("reclaimer", i); r != "" {
				args = append(args, "--reclaimer-address", r)
			}
			return args
		})
	}
	if o.Gateway && len(addrs["binder"]) > 0 {
		a, err := devenv.FreeAddr()
		if err != nil {
			return nil, err
		}
		g := c.TLS["gateway"]
		// Users' client certificates come from a CA of their own, as in
		// deploy/: a certificate of the services' CA is no user.
		users, err := pki.NewCA(filepath.Join(o.Dir, "tls", "users"), "volplane-chaos-users-ca")
		if err != nil {
			return nil, err
		}
		c.GatewayURL = "https://" + a
		c.service("gateway", 0, "", func(int) []string {
			args := append(common("gateway"), "--listen", a, "--binder-address", pick("binder", 0), "--watcher-address", pick("watcher", 0),
				"--provisioner-address", pick("provisioner", 0), "--reclaimer-address", pick("reclaimer", 0),
				"--client-ca-file", users.CertFile, "--tls-serving-cert-file", g.CertFile, "--tls-serving-key-file", g.KeyFile)
			return args
		})
	}
	for _, r := range c.Services {
		if err := r.Start(); err != nil {
			return nil, err
		}
		if r.Service == "binder" || r.Service == "gateway" {
			continue // ready once the others are: checked below
		}
		if err := c.WaitServing(ctx, r, 2*time.Minute); err != nil {
			return nil, err
		}
	}
	for _, r := range c.Services {
		if r.Service == "binder" {
			if err := c.WaitServing(ctx, r, 2*time.Minute); err != nil {
				return nil, err
			}
		}
	}
	o.Logf("services ready: %d watcher(s), %d binder(s), %d provisioner(s), %d reclaimer(s)", o.Watchers, o.Binders, o.Provisioners, o.Reclaimers)
	return c, nil
}

func memberID(service string, i, gen int) string {
	return fmt.Sprintf("%s-%d-g%d", service, i+1, gen)
}

func (c *Cluster) replica(name, service, addr, bin string, args func(gen int) []string) *Replica {
	return &Replica{Name: name, Service: service, Addr: addr, bin: filepath.Join(c.o.BinDir, bin), args: args,
		env: c.o.Env[name], logs: filepath.Join(c.Dir, "logs", name+".log")}
}

func (c *Cluster) service(service string, i int, addr string, args func(gen int) []string) {
	name := fmt.Sprintf("%s-%d", service, i+1)
	if extra := c.o.Args[name]; len(extra) > 0 {
		own := args
		args = func(gen int) []string { return append(own(gen), extra...) }
	}
	c.Services = append(c.Services, c.replica(name, service, addr, service, args))
}

// Replicas returns the services' replicas of service ("" for all).
func (c *Cluster) Replicas(service string) []*Replica {
	var out []*Replica
	for _, r := range c.Services {
		if service == "" || r.Service == service {
			out = append(out, r)
		}
	}
	return out
}

// WaitServing waits until the replica reports SERVING to the chaos
// client's health check.
func (c *Cluster) WaitServing(ctx context.Context, r *Replica, timeout time.Duration) error {
	if r.Addr == "" {
		return nil
	}
	if err := devenv.WaitServing(ctx, r.Addr, "", c.TLS[Client], timeout); err != nil {
		return fmt.Errorf("%s: %w (log %s)", r.Name, err, r.logs)
	}
	return nil
}

// WaitEtcd waits until etcd answers a read through every endpoint given
// (a quorum is up).
func (c *Cluster) WaitEtcd(ctx context.Context, timeout time.Duration) error {
	cli, err := c.EtcdClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cli.Get(cctx, "/volplane-chaos/health")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not ready within %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// EtcdClient is a client of every member, with the services' TLS.
func (c *Cluster) EtcdClient() (*clientv3.Client, error) {
	tlsInfo := transport.TLSInfo{CertFile: c.EtcdSecurity.CertFile, KeyFile: c.EtcdSecurity.KeyFile, TrustedCAFile: c.EtcdSecurity.CAFile}
	tc, err := tlsInfo.ClientConfig()
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{Endpoints: c.EtcdEndpoints, TLS: tc, DialTimeout: 2 * time.Second, Logger: nopLogger()})
}

// Stop stops every process, services first.
func (c *Cluster) Stop() {
	for i := len(c.Services) - 1; i >= 0; i-- {
		c.Services[i].Stop()
	}
	if c.CSI != nil {
		c.CSI.Stop()
	}
	if c.API != nil {
		c.API.Stop()
	}
	for _, m := range c.Etcd {
		m.Stop()
	}
}

// Start starts the replica (again); a restart runs a new generation: a
// new member ID, none of the first start's Env.
func (r *Replica) Start() error { return r.start(nil, false, nil) }

// StartWithEnv starts the replica (again) with env added to its
// environment for this run only, e.g. a fault point.
func (r *Replica) StartWithEnv(env ...string) error { return r.start(env, true, nil) }

// StartWithArgs starts the replica (again) with args added to the end of
// its command line for this run only (a flag given again wins).
func (r *Replica) StartWithArgs(args ...string) error { return r.start(nil, false, args) }

func (r *Replica) start(env []string, given bool, extra []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return nil
	}
	r.gen++
	if !given && r.gen == 1 {
		env = r.env
	}
	lf, err := os.OpenFile(r.logs, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(lf, "==== %s: start %d at %s ====\n", r.Name, r.gen, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(r.bin, append(r.args(r.gen), extra...)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("start %s (run `make build` first): %w", r.bin, err)
	}
	done := make(chan struct{})
	r.cmd, r.done = cmd, done
	go func() {
		_ = cmd.Wait()
		fmt.Fprintf(lf, "==== %s: exited: %s ====\n", r.Name, cmd.ProcessState)
		lf.Close()
		r.mu.Lock()
		r.exit = cmd.ProcessState.ExitCode()
		if !r.killing {
			r.crashes++
		}
		r.killing = false
		if r.cmd == cmd {
			r.cmd = nil
		}
		r.mu.Unlock()
		close(done)
	}()
	return nil
}

// Kill kills the replica's process group with SIGKILL and waits for it.
func (r *Replica) Kill() { r.signal(syscall.SIGKILL, 0) }

// Stop stops it with SIGTERM, then SIGKILL after 10s.
func (r *Replica) Stop() { r.signal(syscall.SIGTERM, 10*time.Second) }

func (r *Replica) signal(sig syscall.Signal, grace time.Duration) {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	if cmd != nil {
		r.killing = true
	}
	r.mu.Unlock()
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

// Running reports whether the process runs.
func (r *Replica) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd != nil
}

// Done is closed when the current run exits (nil before the first start).
func (r *Replica) Done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// ExitCode is the last run's exit status: -1 for a signal, while it runs
// or before it ran.
func (r *Replica) ExitCode() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil || r.gen == 0 {
		return -1
	}
	return r.exit
}

// Crashes counts the runs that ended on their own (not by Kill or Stop).
func (r *Replica) Crashes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.crashes
}

// SetBinary makes the replica's next start run bin instead of the binary
// of its service in ClusterOptions.BinDir: another release of it, for the
// version skew tests (test/e2e/skew). Its command line stays the same, so
// bin must know every flag the cluster gives.
func (r *Replica) SetBinary(bin string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bin = bin
}

// Binary is the binary the replica's next start runs.
func (r *Replica) Binary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bin
}

// LogPath is the replica's log, every run appended.
func (r *Replica) LogPath() string { return r.logs }

// provisionerRecoveryPeriod is how often the chaos cluster's provisioners
// run their journal recovery (--recovery-period).
const provisionerRecoveryPeriod = 2 * time.Second

// ShortRunConverge is how long make test's short chaos run (test/chaos)
// gives the cluster to converge after its storm.
const ShortRunConverge = 90 * time.Second

// GoneWithin is how long the crash test's fault points wait for a deleted
// claim's volume and its CSI volume to be gone.
const GoneWithin = 2 * time.Minute
