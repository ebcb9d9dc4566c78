package provisioner

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/sidecar"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// A discovered driver is one CSI driver served by volplane-csi-sidecars
// (pkg/sidecar) found at run time: one *driver per driver name, however
// many registrations it has, whose connection is the pool of its verified
// sidecars. Once discovered it stays in the registry (and, through
// knownDrivers, in etcd): a driver whose sidecars are gone is listed not
// ready, so its volumes and claims wait for it instead of being taken for
// another provisioner's.

// newDiscoveredDriver is the driver of the sidecars in pool, not probed
// yet.
func newDiscoveredDriver(pool *sidecarPool, cm csimetrics.CSIMetricsManager) *driver {
	d := &driver{endpoint: sidecarEndpointPrefix + pool.name, identity: csi.NewIdentityClient(pool),
		controller: csi.NewControllerClient(pool), sidecars: pool, metrics: cm, named: pool.name}
	d.state.Store(missingState(pool))
	return d
}

// missingState is the state of a discovered driver without sidecars.
func missingState(pool *sidecarPool) *driverState {
	return &driverState{info: &provisionerv1.Driver{Endpoint: pool.describe(), DriverName: pool.name,
		ProvisionerName: pool.name, Message: pool.missing()}}
}

// probe asks the driver who it is, what it can do and whether it is ready.
// A discovered driver is not ready, without a call, while it has no
// verified sidecar or while its sidecars carry settings the provisioner
// cannot honour; it keeps its name (it is known, and its volumes are
// volplane's) whatever its sidecars answer.
func (d *driver) probe(ctx context.Context) *driverState {
	if d.sidecars == nil {
		return d.probeCSI(ctx)
	}
	pool := d.sidecars
	eps := pool.endpoints()
	var st *driverState
	settings, why := sidecarSettings(eps, d.gates, d.allowModeConversion)
	switch {
	case len(eps) == 0:
		st = &driverState{info: &provisionerv1.Driver{Message: pool.missing()}}
	case why != "":
		st = &driverState{info: &provisionerv1.Driver{Message: why}}
	default:
		st = d.probeCSI(ctx)
		if got := st.info.GetDriverName(); got != "" && got != pool.name {
			st.info.Ready = false
			st.info.Message = fmt.Sprintf("the sidecars registered for CSI driver %s serve a driver named %s", pool.name, got)
		}
	}
	st.settings = settings
	st.info.Endpoint, st.info.DriverName, st.info.ProvisionerName = pool.describe(), pool.name, pool.name
	return st
}

// sidecarSettings are the settings the sidecars of one driver carry, and
// why the driver cannot be used with them ("" when it can): the
// registrations must agree, and every setting must be one the provisioner
// honours.
func sidecarSettings(eps []*sidecarEndpoint, gates FeatureGates, allowModeConversion bool) (*sidecar.Settings, string) {
	if len(eps) == 0 {
		return nil, ""
	}
	s := eps[0].settings
	for _, ep := range eps[1:] {
		if !reflect.DeepEqual(ep.settings, s) {
			return nil, fmt.Sprintf("the sidecars of pods %s and %s run with different csi-provisioner flags (%+v, %+v): give every replica of the driver the same command line",
				eps[0].pod, ep.pod, s, ep.settings)
		}
	}
	if why := unsupportedSettings(s, gates, allowModeConversion); why != "" {
		return nil, fmt.Sprintf("the sidecar of pod %s runs with %s", eps[0].pod, why)
	}
	return &s, ""
}

// unsupportedSettings names the sidecar flags (with their values) that
// volplane's provisioner cannot honour for one driver, "" when none:
// gates and allowModeConversion are the provisioner's own, which apply to
// every driver. The other settings are honoured per driver.
func unsupportedSettings(s sidecar.Settings, gates FeatureGates, allowModeConversion bool) string {
	var bad []string
	if n := s.VolumeNameUUIDLength; n < -1 || n > MaxVolumeNameUUIDLength {
		bad = append(bad, fmt.Sprintf("--volume-name-uuid-length=%d, which csi-provisioner would not run with (-1, or 1 to %d)", n, MaxVolumeNameUUIDLength))
	}
	if p := s.PreventVolumeModeConversion; p != nil && *p == allowModeConversion {
		bad = append(bad, fmt.Sprintf("--prevent-volume-mode-conversion=%t, which volplane's provisioner runs with %t for every driver (its --prevent-volume-mode-conversion)", *p, !allowModeConversion))
	}
	if err := sidecar.CheckGates(s.FeatureGates); err != nil {
		g := FeatureGates(s.FeatureGates)
		bad = append(bad, fmt.Sprintf("--feature-gates=%s, which csi-provisioner v6.3.0 refuses: %v", g.String(), err))
	} else if on := sidecar.GateEnabled(s.FeatureGates, GateCrossNamespaceVolumeDataSource); on != gates.Enabled(GateCrossNamespaceVolumeDataSource) {
		bad = append(bad, fmt.Sprintf("%s %s, which volplane's provisioner runs %s for every driver (its --feature-gates)",
			GateCrossNamespaceVolumeDataSource, onOff(on), onOff(!on)))
	}
	return strings.Join(bad, "; ")
}

// onOff words a gate's state.
func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// markSidecarClashes refuses a discovered driver whose CSI or provisioner
// name is also served by a --csi-endpoint: its volumes' deletions and its
// classes' claims could go to either. The configured endpoint keeps
// serving; the discovered one is not ready and left out of markConflicts.
func markSidecarClashes(drivers []*driver, states []*driverState) {
	configured := map[string]string{}
	for i, d := range drivers {
		if d.sidecars != nil {
			continue
		}
		for _, n := range []string{states[i].info.GetDriverName(), states[i].info.GetProvisionerName()} {
			if n != "" {
				configured[n] = d.endpoint
			}
		}
	}
	for i, d := range drivers {
		if d.sidecars == nil {
			continue
		}
		if ep, ok := configured[d.sidecars.name]; ok {
			st := states[i]
			st.clash = true
			st.info.Ready = false
			st.info.Message = fmt.Sprintf("CSI driver %s is also served by --csi-endpoint %s: its volplane-csi-sidecars are not used; remove the endpoint, or the sidecars", d.sidecars.name, ep)
		}
	}
}

// sidecarDriver is the discovered driver named name, made (and added,
// not probed yet) if it is not in the registry yet; made reports whether
// it was.
func (r *registry) sidecarDriver(name string) (d *driver, made bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.drivers {
		if d.sidecars != nil && d.sidecars.name == name {
			return d, false
		}
	}
	cm := newCSIMetrics()
	cm.SetDriverName(name)
	d = newDiscoveredDriver(newSidecarPool(name), cm)
	d.gates, d.allowModeConversion = r.gates, r.allowModeConversion
	d.outage = logging.NewOutage(r.log, "CSI driver", "endpoint", d.endpoint)
	r.drivers = append(r.drivers, d)
	return d, true
}

// kick has the probe loop probe every driver now (a sidecar came or
// went).
func (r *registry) kick() {
	select {
	case r.kicked <- struct{}{}:
	default:
	}
}

// settings are the sidecar settings of a discovered driver as last
// probed; nil for a --csi-endpoint driver (the provisioner's flags apply).
func (d *driver) settings() *sidecar.Settings { return d.current().settings }

// The request-shaping settings of one driver: a discovered driver's
// sidecar flags where its sidecar sets them, else the provisioner's own.

func (p *provisioner) prefixFor(d *driver) string {
	if s := d.settings(); s != nil && s.VolumeNamePrefix != "" {
		return s.VolumeNamePrefix
	}
	return p.prefix
}

func (p *provisioner) fsTypeFor(d *driver) string {
	if s := d.settings(); s != nil && s.DefaultFSType != "" {
		return s.DefaultFSType
	}
	return p.defaultFSType
}

func (p *provisioner) strictTopologyFor(d *driver) bool {
	if s := d.settings(); s != nil {
		return s.StrictTopology
	}
	return p.strictTopology
}

func (p *provisioner) extraMetadataFor(d *driver) bool {
	if s := d.settings(); s != nil {
		return s.ExtraCreateMetadata
	}
	return p.extraMetadata
}

func (p *provisioner) timeoutFor(d *driver) time.Duration {
	if s := d.settings(); s != nil && s.Timeout > 0 {
		return s.Timeout
	}
	return p.timeout
}

// volumeNameFor is the name of claim's volume as provisioned for class:
// with its driver's naming (the provisioner's when no driver serves the
// class).
func (p *provisioner) volumeNameFor(class *storagev1.StorageClass, claim *corev1.PersistentVolumeClaim) string {
	if d := p.drivers.byProvisioner(class.Provisioner); d != nil {
		return p.namingFor(d).name(claim)
	}
	return volumeNaming{prefix: p.prefix, uuidLength: p.flags.uuidLength}.name(claim)
}

// sidecarNotReady tells a claim, with a ProvisioningFailed Warning, that
// the discovered driver of its class is not ready and why (msg): its
// sidecars are gone, or cannot be used. The claim stays Pending and is
// tried again. (A --csi-endpoint driver that is not ready makes the whole
// provisioner not ready instead; its claims wait as they always have.)
func (p *provisioner) sidecarNotReady(claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, d *driver, msg string) {
	if d.sidecars == nil || p.events == nil {
		return
	}
	p.events(class.Provisioner).Event(claim, corev1.EventTypeWarning, kube.EventProvisioningFailed,
		fmt.Sprintf("failed to provision volume with StorageClass %q: %s", class.Name, msg))
}

// ownVolumeName reports whether name is claim's volume name with one of
// the namings in use.
func (p *provisioner) ownVolumeName(name string, claim *corev1.PersistentVolumeClaim) bool {
	for _, n := range p.namings() {
		if name == n.name(claim) {
			return true
		}
	}
	return false
}
