package provisioner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/sidecar"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// driver is one CSI driver the provisioner serves.
type driver struct {
	endpoint   string
	configured string // provisioner name given in the configuration; "" = the driver's own name
	identity   csi.IdentityClient
	controller csi.ControllerClient
	state      atomic.Pointer[driverState]
	// metrics times the driver's calls (nil in tests without it); named
	// is the driver name it labels them with.
	metrics csimetrics.CSIMetricsManager
	named   string
	// outage reports once when the driver stops answering its probe and
	// once when it answers again (set by registry.add).
	outage *logging.Outage
	// sidecars are the sidecars of a discovered driver (discovered.go),
	// nil for a --csi-endpoint one; gates are the provisioner's feature
	// gates, and allowModeConversion its --prevent-volume-mode-conversion
	// turned off, which a sidecar's must match.
	sidecars            *sidecarPool
	gates               FeatureGates
	allowModeConversion bool
}

// driverState is what the last probe learnt.
type driverState struct {
	info     *provisionerv1.Driver
	caps     map[csi.ControllerServiceCapability_RPC_Type]bool
	topology bool // VOLUME_ACCESSIBILITY_CONSTRAINTS
	// unreachable is why the driver did not answer the probe's first
	// call; nil when it answered (ready or not).
	unreachable error
	// settings are a discovered driver's sidecar settings (nil: the
	// provisioner's flags); clash, that its name is also a --csi-endpoint
	// driver's (markSidecarClashes).
	settings *sidecar.Settings
	clash    bool
}

func newDriver(endpoint, configured string, cc grpc.ClientConnInterface) *driver {
	d := &driver{endpoint: endpoint, configured: configured, identity: csi.NewIdentityClient(cc), controller: csi.NewControllerClient(cc)}
	d.state.Store(&driverState{info: &provisionerv1.Driver{Endpoint: endpoint, ProvisionerName: configured, Message: "not probed yet"}})
	return d
}

func (d *driver) current() *driverState { return d.state.Load() }

// name is the CSI driver name (what PVs carry in spec.csi.driver).
func (d *driver) name() string { return d.current().info.GetDriverName() }

// provisionerName is the StorageClass provisioner name it serves.
func (d *driver) provisionerName() string {
	if d.configured != "" {
		return d.configured
	}
	return d.name()
}

func (d *driver) ready() bool { return d.current().info.GetReady() }

func (d *driver) has(c csi.ControllerServiceCapability_RPC_Type) bool { return d.current().caps[c] }

// probeCSI asks the driver who it is, what it can do and whether it is
// ready (GetPluginInfo, GetPluginCapabilities, ControllerGetCapabilities,
// Probe).
func (d *driver) probeCSI(ctx context.Context) *driverState {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st := &driverState{info: &provisionerv1.Driver{Endpoint: d.endpoint, ProvisionerName: d.configured}, caps: map[csi.ControllerServiceCapability_RPC_Type]bool{}}
	info := st.info
	pi, err := d.identity.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		info.Message = fmt.Sprintf("GetPluginInfo: %v", err)
		st.unreachable = fmt.Errorf("GetPluginInfo: %w", err)
		return st
	}
	info.DriverName, info.VendorVersion = pi.GetName(), pi.GetVendorVersion()
	if d.metrics != nil && d.named != info.DriverName {
		// Only here, in the probe loop: before the first probe succeeds no
		// other call is made, and a driver seldom changes its name.
		d.metrics.SetDriverName(info.DriverName)
		d.named = info.DriverName
	}
	if info.ProvisionerName == "" {
		info.ProvisionerName = pi.GetName()
	}
	pc, err := d.identity.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		info.Message = fmt.Sprintf("GetPluginCapabilities: %v", err)
		return st
	}
	controller := false
	for _, c := range pc.GetCapabilities() {
		if svc := c.GetService(); svc != nil {
			info.Capabilities = append(info.Capabilities, svc.GetType().String())
			switch svc.GetType() {
			case csi.PluginCapability_Service_CONTROLLER_SERVICE:
				controller = true
			case csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS:
				st.topology = true
			}
		}
		if ve := c.GetVolumeExpansion(); ve != nil {
			info.Capabilities = append(info.Capabilities, "VOLUME_EXPANSION_"+ve.GetType().String())
		}
	}
	if !controller {
		info.Message = "the driver offers no CONTROLLER_SERVICE: it cannot create or delete volumes"
		sort.Strings(info.Capabilities)
		return st
	}
	cc, err := d.controller.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		info.Message = fmt.Sprintf("ControllerGetCapabilities: %v", err)
		return st
	}
	for _, c := range cc.GetCapabilities() {
		if r := c.GetRpc(); r != nil {
			st.caps[r.GetType()] = true
			info.Capabilities = append(info.Capabilities, r.GetType().String())
		}
	}
	sort.Strings(info.Capabilities)
	if !st.caps[csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME] {
		info.Message = "the driver lacks the CREATE_DELETE_VOLUME controller capability"
		return st
	}
	pr, err := d.identity.Probe(ctx, &csi.ProbeRequest{})
	switch {
	case err != nil:
		info.Message = fmt.Sprintf("Probe: %v", err)
	case pr.GetReady() != nil && !pr.GetReady().GetValue():
		info.Message = "the driver reports it is not ready"
	default:
		info.Ready = true
	}
	return st
}

// registry holds the drivers and finds them by provisioner or driver name.
type registry struct {
	log     *slog.Logger
	mu      sync.Mutex
	drivers []*driver
	probed  chan struct{} // closed after the first round of probes
	once    sync.Once
	// kicked asks the probe loop for a round now (kick); gates are the
	// provisioner's feature gates and allowModeConversion its
	// --prevent-volume-mode-conversion turned off (discovered drivers
	// check theirs).
	kicked              chan struct{}
	gates               FeatureGates
	allowModeConversion bool
	// onChange, when set, is called after a round of probes in which a
	// driver's readiness or provisioner name changed (standalone mode
	// looks at its claims again); set before the probe loop runs.
	onChange func()
}

// setOnChange sets onChange; call it before the probe loop starts.
func (r *registry) setOnChange(f func()) { r.onChange = f }

func newRegistry(log *slog.Logger) *registry {
	return &registry{log: log, probed: make(chan struct{}), kicked: make(chan struct{}, 1)}
}

func (r *registry) add(d *driver) {
	if d.outage == nil {
		d.outage = logging.NewOutage(r.log, "CSI driver", "endpoint", d.endpoint)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drivers = append(r.drivers, d)
}

func (r *registry) all() []*driver {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*driver(nil), r.drivers...)
}

// check is the readiness check "csi-drivers": every driver has been
// probed and every --csi-endpoint driver is ready. A discovered driver's
// readiness is its own (ListDrivers): one vendor's driver going away does
// not stop the provisioner serving the others.
func (r *registry) check() error {
	select {
	case <-r.probed:
	default:
		return errors.New("not probed yet")
	}
	var bad []string
	for _, d := range r.all() {
		if info := d.current().info; !info.GetReady() && d.sidecars == nil {
			bad = append(bad, fmt.Sprintf("%s not ready: %s", d.endpoint, info.GetMessage()))
		}
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "; "))
	}
	return nil
}

// byProvisioner is the driver serving StorageClass provisioner name, or nil.
func (r *registry) byProvisioner(name string) *driver {
	for _, d := range r.all() {
		if d.provisionerName() == name {
			return d
		}
	}
	return nil
}

// byDriver is the driver whose CSI name is name (spec.csi.driver), or nil.
func (r *registry) byDriver(name string) *driver {
	for _, d := range r.all() {
		if d.name() == name {
			return d
		}
	}
	return nil
}

// probeAll probes every driver once and logs readiness changes.
func (r *registry) probeAll(ctx context.Context) {
	drivers := r.all()
	states := make([]*driverState, len(drivers))
	for i, d := range drivers {
		states[i] = d.probe(ctx)
	}
	markSidecarClashes(drivers, states)
	markConflicts(drivers, states)
	changed := false
	for i, d := range drivers {
		st := states[i]
		if st.unreachable != nil {
			// Logged once per outage, not per probe.
			d.outage.Failed(st.unreachable)
			d.state.Store(st)
			continue
		}
		d.outage.Recovered("driver", st.info.DriverName)
		old := d.current().info
		changed = changed || old.GetReady() != st.info.GetReady() || old.GetProvisionerName() != st.info.GetProvisionerName()
		if old.GetReady() != st.info.GetReady() || old.GetMessage() != st.info.GetMessage() {
			r.log.Info("CSI driver", "endpoint", d.endpoint, "driver", st.info.DriverName, "provisioner", st.info.ProvisionerName,
				"ready", st.info.Ready, "message", st.info.Message, "capabilities", st.info.Capabilities)
		}
		d.state.Store(st)
	}
	r.once.Do(func() { close(r.probed) })
	if changed && r.onChange != nil {
		r.onChange()
	}
}

// markConflicts makes not ready, saying why, the drivers of endpoints that
// share a name with another endpoint's: a CSI driver name (which endpoint
// would delete a volume of that driver?) or a StorageClass provisioner
// name (which one would provision for the class?). The same endpoint under
// two provisioner names is one driver, and fine. Names change only at run
// time (a driver reports its own), so this is a readiness matter: the
// provisioner is NOT_SERVING until the configuration is fixed.
func markConflicts(drivers []*driver, states []*driverState) {
	for _, key := range []struct {
		name func(*driverState) string
		what string
	}{
		{func(st *driverState) string { return st.info.GetDriverName() }, "the CSI driver name %s is reported by %d endpoints (%s): its volumes' deletions could go to either"},
		{func(st *driverState) string { return st.info.GetProvisionerName() }, "the provisioner name %s is served by %d endpoints (%s): its classes' claims could go to either"},
	} {
		endpoints := map[string][]string{}
		for i, st := range states {
			if n := key.name(st); n != "" && !st.clash && !slices.Contains(endpoints[n], drivers[i].endpoint) {
				endpoints[n] = append(endpoints[n], drivers[i].endpoint)
			}
		}
		for _, st := range states {
			eps := endpoints[key.name(st)]
			if len(eps) < 2 || st.clash {
				continue
			}
			why := fmt.Sprintf(key.what, key.name(st), len(eps), strings.Join(eps, ", ")) +
				"; remove one, or map them to different provisioner names (--csi-endpoint name=endpoint)"
			if st.info.Ready || st.info.Message == "" {
				st.info.Message = why
			} else if !strings.Contains(st.info.Message, why) {
				st.info.Message += "; " + why
			}
			st.info.Ready = false
		}
	}
}

// probeLoop probes every driver now and then every period; a driver that is
// not ready is probed again after a second, so it is used as soon as it is.
func (r *registry) probeLoop(ctx context.Context, period time.Duration) {
	for {
		r.probeAll(ctx)
		wait := period
		for _, d := range r.all() {
			if !d.ready() {
				wait = min(wait, time.Second)
			}
		}
		select {
		case <-time.After(wait):
		case <-r.kicked:
		case <-ctx.Done():
			return
		}
	}
}

// list is the drivers as last probed.
func (r *registry) list() []*provisionerv1.Driver {
	var out []*provisionerv1.Driver
	for _, d := range r.all() {
		out = append(out, proto.Clone(d.current().info).(*provisionerv1.Driver))
	}
	return out
}

// parseEndpoint splits "name=endpoint" (a provisioner name mapped to an
// endpoint) from a bare endpoint.
func parseEndpoint(s string) (name, endpoint string) {
	if i := strings.Index(s, "="); i > 0 && !strings.Contains(s[:i], "/") && !strings.Contains(s[:i], ":") {
		return s[:i], s[i+1:]
	}
	return "", s
}

// csiLogger logs every CSI call with its code and duration, and at debug
// level the request with every field the CSI spec marks csi_secret
// stripped (csi-lib-utils' protosanitizer, as the CSI sidecars log).
func csiLogger(log *slog.Logger, endpoint string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		took := time.Since(start)
		attrs := []any{"endpoint", endpoint, "method", method, "code", status.Code(err).String(), "duration", took}
		if log.Enabled(ctx, slog.LevelDebug) {
			attrs = append(attrs, "request", protosanitizer.StripSecrets(req).String())
		}
		if err != nil && !strings.HasSuffix(method, "/Probe") {
			log.InfoContext(ctx, "CSI call failed", append(attrs, "error", err)...)
		} else {
			log.DebugContext(ctx, "CSI call", attrs...)
		}
		return err
	}
}
