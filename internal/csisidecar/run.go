package csisidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/volplane/volplane/pkg/sidecar"
)

// stopGrace is how long calls in flight may finish at shutdown.
const stopGrace = 10 * time.Second

// Sidecar is a started sidecar, before it serves.
type Sidecar struct {
	opts    Options
	log     *slog.Logger
	client  kubernetes.Interface
	driver  *grpc.ClientConn
	cert    tlsCert
	cas     *clientCAs
	lis     net.Listener
	pod, ns string
	metrics *sidecarMetrics
	mux     *http.ServeMux
}

// Run starts the sidecar and serves until ctx ends, then deletes its
// registration and stops. It returns ErrLostLeadership (wrapped) when
// --leader-election's lock is lost.
func Run(ctx context.Context, o Options) error {
	s, err := Start(o)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}

// Start validates o, logs the accepted flags that are not needed, builds
// the API client and the serving certificate, dials the driver and opens
// the listener.
func Start(o Options) (*Sidecar, error) {
	if o.Provisioner.NodeDeployment && o.NodeName == "" {
		o.NodeName = os.Getenv("NODE_NAME")
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	for _, line := range o.NotNeeded() {
		log.Info(line)
	}
	s := &Sidecar{opts: o, log: log, metrics: newMetrics()}
	var err error
	if s.client = o.Client; s.client == nil {
		if s.client, err = newClient(o.Provisioner); err != nil {
			return nil, err
		}
	}
	if s.pod = o.PodName; s.pod == "" {
		if s.pod, err = podName(); err != nil {
			return nil, err
		}
	}
	if s.ns, err = podNamespace(o.PodNamespace); err != nil {
		return nil, err
	}
	if err := s.listen(); err != nil {
		return nil, err
	}
	return s, nil
}

// listen makes the serving certificate, the CA pool, the driver's
// connection and the listener.
func (s *Sidecar) listen() error {
	var ips []net.IP
	if ip := net.ParseIP(os.Getenv("POD_IP")); ip != nil {
		ips = append(ips, ip)
	}
	cert, err := newServingCert(s.pod, ips)
	if err != nil {
		return err
	}
	s.cert = tlsCert{cert}
	var src caSource = configMapCA{client: s.client, namespace: s.opts.Namespace}
	if s.opts.CAFile != "" {
		src = fileCA(s.opts.CAFile)
	}
	s.cas = &clientCAs{src: src, log: s.log}
	if s.driver, err = dialDriver(s.opts.Provisioner.CSIAddress); err != nil {
		return err
	}
	if s.lis, err = net.Listen("tcp", s.opts.Listen); err != nil {
		s.driver.Close()
		return fmt.Errorf("--volplane-listen %s: %w", s.opts.Listen, err)
	}
	return nil
}

// Addr is the address the driver is served on.
func (s *Sidecar) Addr() net.Addr { return s.lis.Addr() }

// CertSHA256 is the pinned fingerprint of the serving certificate.
func (s *Sidecar) CertSHA256() string { return s.cert.sha256() }

// Serve serves until ctx ends: the CA refresh, the driver's hop, the HTTP
// endpoint and, once the driver names itself, the registration.
func (s *Sidecar) Serve(ctx context.Context) error {
	defer s.driver.Close()
	g, ctx := errgroup.WithContext(ctx)
	if err := s.cas.load(ctx); err != nil {
		s.log.Warn("cannot read the CA of volplane's provisioner yet; calls are refused until it is read", "source", s.cas.src.String(), "error", err)
	}
	g.Go(func() error { s.cas.refresh(ctx, caRefreshEvery); return nil })
	h := &hop{driver: s.driver, timeout: s.opts.Provisioner.Timeout, slots: make(chan struct{}, s.opts.Provisioner.WorkerThreads), log: s.log, calls: s.metrics.calls}
	srv := newHopServer(h, serverTLS(s.cert.Certificate, s.cas))
	g.Go(func() error { return serveGRPC(ctx, srv, s.lis) })
	s.mux = s.httpMux()
	var le *leader
	if s.opts.Provisioner.LeaderElection {
		le = newLeader(s.client, s.opts, s.mux)
	}
	if addr := s.httpEndpoint(); addr != "" {
		g.Go(func() error { return serveHTTP(ctx, addr, s.mux, s.log) })
	}
	g.Go(func() error { return s.register(ctx, le) })
	return g.Wait()
}

// register waits for the driver's name, then keeps the registration:
// always, or only while leading with --leader-election.
func (s *Sidecar) register(ctx context.Context, le *leader) error {
	driver, err := waitForDriver(ctx, s.driver, s.opts.Provisioner.Timeout, s.log)
	if err != nil {
		return nil // ctx ended
	}
	s.metrics.ready.Store(true)
	if !s.waitForCA(ctx) {
		return nil // ctx ended
	}
	port, _ := strconv.Atoi(portOf(s.lis.Addr()))
	r := &registrar{client: s.client, log: s.log, every: sidecar.RenewInterval, now: time.Now, reg: sidecar.Registration{
		Namespace: s.ns, Pod: s.pod, Driver: driver, Port: port, CertSHA256: s.cert.sha256(),
		LeaderElection: le != nil, Settings: s.opts.Settings, Duration: sidecar.LeaseDuration,
	}}
	if s.opts.Provisioner.NodeDeployment {
		topo, err := waitForNodeInfo(ctx, s.driver, s.opts.Provisioner.Timeout, s.log)
		if err != nil {
			return nil // ctx ended
		}
		r.reg.Node, r.reg.NodeTopology, r.reg.NodeImmediateBinding = s.opts.NodeName, topo, s.opts.Provisioner.NodeImmediateBinding
		s.log.Info("node deployment: registering for this node only", "node", s.opts.NodeName, "topology", topo)
	}
	if le == nil {
		r.run(ctx)
		return nil
	}
	s.log.Info("waiting for the leader lock before registering", "lock", lockName(driver))
	return le.run(ctx, driver, func(ctx context.Context) {
		s.log.Info("leading: registering", "lock", lockName(driver))
		r.run(ctx)
	})
}

// waitForCA waits until the CA of volplane's provisioner has been read,
// since until then the port refuses every caller: a registration says the
// driver can be called. It is false when ctx ended first.
func (s *Sidecar) waitForCA(ctx context.Context) bool {
	for s.cas.pool.Load() == nil {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Second):
		}
	}
	return true
}

// waitForDriver asks the driver its name until it answers, with backoff,
// logging once while it does not.
func waitForDriver(ctx context.Context, cc *grpc.ClientConn, timeout time.Duration, log *slog.Logger) (string, error) {
	delay, logged := 100*time.Millisecond, false
	for {
		callCtx, cancel := context.WithTimeout(ctx, timeout)
		info, err := csi.NewIdentityClient(cc).GetPluginInfo(callCtx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil && info.GetName() != "" {
			log.Info("driver answered", "driver", info.GetName(), "vendorVersion", info.GetVendorVersion())
			return info.GetName(), nil
		}
		if err == nil {
			err = errors.New("GetPluginInfo answered an empty name")
		}
		if !logged {
			log.Warn("waiting for the CSI driver to answer GetPluginInfo", "error", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// waitForNodeInfo asks the driver its node's topology (NodeGetInfo), as
// csi-provisioner does with --node-deployment, until it answers, with
// backoff. A driver without topology answers an empty segment.
func waitForNodeInfo(ctx context.Context, cc *grpc.ClientConn, timeout time.Duration, log *slog.Logger) (map[string]string, error) {
	delay, logged := 100*time.Millisecond, false
	for {
		callCtx, cancel := context.WithTimeout(ctx, timeout)
		info, err := csi.NewNodeClient(cc).NodeGetInfo(callCtx, &csi.NodeGetInfoRequest{})
		cancel()
		if err == nil {
			topo := info.GetAccessibleTopology().GetSegments()
			if topo == nil {
				topo = map[string]string{}
			}
			return topo, nil
		}
		if !logged {
			log.Warn("waiting for the CSI driver to answer NodeGetInfo (--node-deployment)", "error", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// newClient is the API client of csi-provisioner's flags: $KUBECONFIG
// wins, then --master and --kubeconfig, else the in-cluster config.
func newClient(p ProvisionerFlags) (kubernetes.Interface, error) {
	kubeconfig := p.Kubeconfig
	if env := os.Getenv("KUBECONFIG"); env != "" {
		kubeconfig = env
	}
	var cfg *rest.Config
	var err error
	if p.Master != "" || kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags(p.Master, kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API client (--kubeconfig, --master or in-cluster): %w", err)
	}
	cfg.QPS, cfg.Burst = float32(p.KubeAPIQPS), p.KubeAPIBurst
	cfg.UserAgent = "volplane-csi-sidecar"
	return kubernetes.NewForConfig(cfg)
}

// serveGRPC serves until ctx ends, then drains for up to stopGrace.
func serveGRPC(ctx context.Context, srv *grpc.Server, lis net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(stopGrace):
		srv.Stop()
	}
	<-errc
	return nil
}

func portOf(a net.Addr) string {
	_, port, _ := net.SplitHostPort(a.String())
	return port
}
