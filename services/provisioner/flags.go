package provisioner

import (
	"context"
	"fmt"
	"slices"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/sidecar"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// External-provisioner v6.3.0's flags that change a volume's name, its
// request or its PV, each honoured as there: the provisioner's own flag
// for its --csi-endpoint drivers, a discovered driver's sidecar's for
// that driver (pkg/sidecar.Settings).

// MaxVolumeNameUUIDLength is the longest --volume-name-uuid-length: a
// claim UID without its dashes.
const MaxVolumeNameUUIDLength = 32

// upstreamFlags are the provisioner's own values of those flags.
type upstreamFlags struct {
	// uuidLength: see Options.VolumeNameUUIDLength.
	uuidLength          int
	noImmediateTopology bool
	publishReadOnly     bool
	gates               FeatureGates
}

func flagsOf(o Options) upstreamFlags {
	return upstreamFlags{uuidLength: o.VolumeNameUUIDLength, noImmediateTopology: o.NoImmediateTopology,
		publishReadOnly: o.ControllerPublishReadOnly, gates: o.FeatureGates}
}

// validateFlags checks the provisioner's own values of those flags.
// external-provisioner checks no --volume-name-uuid-length: a length
// above 32 or below -1 makes it panic at its first claim, and 0 names
// every claim's volume "<prefix>-"; both are refused here.
func (o *Options) validateFlags() []error {
	if n := o.VolumeNameUUIDLength; n != 0 && n != -1 && (n < 1 || n > MaxVolumeNameUUIDLength) {
		return []error{fmt.Errorf("--volume-name-uuid-length=%d: want -1 (the whole UID) or 1 to %d", n, MaxVolumeNameUUIDLength)}
	}
	return nil
}

// volumeNaming is how a driver's volumes are named:
// external-provisioner's makeVolumeName.
type volumeNaming struct {
	prefix string
	// uuidLength: 0 or -1 keeps the whole UID, dashes and all; n > 0
	// keeps its first n characters once its dashes are removed.
	uuidLength int
}

// name is the claim's volume name: <prefix>-<UID>.
func (n volumeNaming) name(claim *corev1.PersistentVolumeClaim) string {
	uid := string(claim.UID)
	if n.uuidLength <= 0 {
		return n.prefix + "-" + uid
	}
	uid = strings.ReplaceAll(uid, "-", "")
	return n.prefix + "-" + uid[:min(n.uuidLength, len(uid))]
}

// namingFor is the naming of d's volumes.
func (p *provisioner) namingFor(d *driver) volumeNaming {
	n := volumeNaming{prefix: p.prefixFor(d), uuidLength: p.flags.uuidLength}
	if s := d.settings(); s != nil {
		n.uuidLength = s.VolumeNameUUIDLength
	}
	return n
}

// namings are the namings in use: the provisioner's, then those its
// discovered drivers' sidecars set.
func (p *provisioner) namings() []volumeNaming {
	out := []volumeNaming{{prefix: p.prefix, uuidLength: p.flags.uuidLength}}
	for _, d := range p.drivers.all() {
		if n := p.namingFor(d); !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// immediateTopologyFor is --immediate-topology for d.
func (p *provisioner) immediateTopologyFor(d *driver) bool {
	if s := d.settings(); s != nil {
		return s.ImmediateTopology == nil || *s.ImmediateTopology
	}
	return !p.flags.noImmediateTopology
}

// publishReadOnlyFor is --controller-publish-readonly for d.
func (p *provisioner) publishReadOnlyFor(d *driver) bool {
	if s := d.settings(); s != nil {
		return s.ControllerPublishReadOnly
	}
	return p.flags.publishReadOnly
}

// gateFor reports whether the feature gate is on for d.
func (p *provisioner) gateFor(d *driver, gate string) bool {
	if s := d.settings(); s != nil {
		return sidecar.GateEnabled(s.FeatureGates, gate)
	}
	return p.flags.gates.Enabled(gate)
}

// topologyFor is external-provisioner's supportsTopology: the driver has
// VOLUME_ACCESSIBILITY_CONSTRAINTS and the Topology gate is on. Without
// it no accessibility requirements are sent and PVs get no node
// affinity.
func (p *provisioner) topologyFor(d *driver) bool {
	return d.current().topology && p.gateFor(d, sidecar.GateTopology)
}

// unconstrained is external-provisioner's --immediate-topology=false
// (GenerateAccessibilityRequirements): a claim without a selected node, of
// a class without allowedTopologies, is sent no accessibility
// requirements at all, neither requisite nor preferred.
func unconstrained(immediateTopology bool, class *storagev1.StorageClass, claim *corev1.PersistentVolumeClaim) bool {
	return !immediateTopology && claim.Annotations[kube.AnnSelectedNode] == "" && len(class.AllowedTopologies) == 0
}

// readOnlyVolume is external-provisioner's pvReadOnly: with
// --controller-publish-readonly, a request with one capability, whose
// access mode is MULTI_NODE_READER_ONLY (a claim whose only access mode
// is ReadOnlyMany), makes a PV with spec.csi.readOnly.
func readOnlyVolume(publishReadOnly bool, req *csi.CreateVolumeRequest) bool {
	caps := req.GetVolumeCapabilities()
	return publishReadOnly && len(caps) == 1 &&
		caps[0].GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

// errContentSourceMissing is external-provisioner's error for a volume
// made without the content source its claim asked for.
const errContentSourceMissing = "volume content source missing"

// wantsContentSource is external-provisioner's test of a CreateVolume
// answer: a claim with a dataSource (or, with the
// CrossNamespaceVolumeDataSource gate, a dataSourceRef in another
// namespace) must get a volume with a content source.
func (p *provisioner) wantsContentSource(claim *corev1.PersistentVolumeClaim) bool {
	if claim.Spec.DataSource != nil {
		return true
	}
	ref := claim.Spec.DataSourceRef
	return p.sources.crossNamespace && ref != nil && ref.Namespace != nil && *ref.Namespace != ""
}

// contentSourceMissing ends an attempt whose volume came back without
// the content source its claim asked for, as external-provisioner does:
// the volume is deleted (with the provisioner secret), ProvisioningFailed
// says "volume content source missing", and the claim is tried again.
// Should the deletion fail, the journal record stays, so that nothing
// is leaked: the next attempt gets the same volume back and deletes it
// again.
func (p *provisioner) contentSourceMissing(ctx context.Context, a *attempt, vol *csi.Volume, secrets map[string]string) (result, error) {
	msg := errContentSourceMissing
	cctx, cancel := context.WithTimeout(withNode(ctx, a.op.Node), p.timeoutFor(a.d))
	_, err := a.d.controller.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId(), Secrets: secrets})
	cancel()
	if err != nil && status.Code(err) != codes.NotFound {
		msg = fmt.Sprintf("%s. cleanup of volume %s failed, volume is orphaned: %v", msg, a.name, err)
		a.op.LastError = msg
		if perr := p.put(ctx, kindProvision, a.name, a.op); perr != nil {
			p.log.Warn("journal provisioning attempt", logging.Claim(a.claim), "volume", a.name, "error", perr)
		}
	} else if ferr := p.journal.Finish(ctx, kindProvision, a.name, p.member); ferr != nil {
		return result{}, ferr
	}
	failed(a.class.Provisioner, stageCreateVolume, status.Error(codes.Internal, msg))
	a.recorder.Event(a.claim, corev1.EventTypeWarning, kube.EventProvisioningFailed, msg)
	p.log.Info("volume made without its content source: deleted", logging.Claim(a.claim), "volume", a.name, "handle", vol.GetVolumeId(), "error", err)
	return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: msg}, nil
}
