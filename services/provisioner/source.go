package provisioner

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/match"
)

const snapshotGroup = "snapshot.storage.k8s.io"

var (
	snapshotsResource        = schema.GroupVersionResource{Group: snapshotGroup, Version: "v1", Resource: "volumesnapshots"}
	snapshotContentsResource = schema.GroupVersionResource{Group: snapshotGroup, Version: "v1", Resource: "volumesnapshotcontents"}
)

// sources resolves a claim's data source (a claim to clone or a
// VolumeSnapshot to restore) into the CSI content source, reading the API.
type sources struct {
	client  kubernetes.Interface
	dynamic dynamic.Interface // nil: no VolumeSnapshot support
	// crossNamespace is the CrossNamespaceVolumeDataSource gate
	// (crossns.go).
	crossNamespace bool
	// allowModeConversion turns off external-provisioner's
	// --prevent-volume-mode-conversion (on by default there and here):
	// see checkSnapshotVolumeMode.
	allowModeConversion bool
}

// annAllowVolumeModeChange on a VolumeSnapshotContent lets a restore
// change the snapshot's volume mode (external-provisioner's name).
const annAllowVolumeModeChange = "snapshot.storage.kubernetes.io/allow-volume-mode-change"

// populatorKind returns the kind of claim's data source when it is a
// volume populator's (AnyVolumeDataSource): any kind but
// PersistentVolumeClaim and VolumeSnapshot, which this provisioner
// handles. As external-provisioner v6.3.0's prepareProvision: dataSource
// is read first, else dataSourceRef (unless it names another namespace,
// which the cross-namespace checks of contentSource decide first), and
// the kind alone decides, whatever the group.
func (s sources) populatorKind(claim *corev1.PersistentVolumeClaim) (string, bool) {
	var kind string
	switch ref := claim.Spec.DataSourceRef; {
	case claim.Spec.DataSource != nil:
		kind = claim.Spec.DataSource.Kind
	case ref == nil:
		return "", false
	case ref.Namespace != nil && *ref.Namespace != "" && *ref.Namespace != claim.Namespace:
		return "", false
	default:
		kind = ref.Kind
	}
	if kind == "PersistentVolumeClaim" || kind == "VolumeSnapshot" {
		return "", false
	}
	return kind, true
}

// contentSource returns nil for a claim without a data source. Its errors
// are final: the claim must change (or the source become ready) first.
func (s sources) contentSource(ctx context.Context, claim *corev1.PersistentVolumeClaim, d *driver) (*csi.VolumeContentSource, error) {
	var group, kind, name string
	ns := claim.Namespace
	switch {
	case claim.Spec.DataSourceRef != nil:
		ref := claim.Spec.DataSourceRef
		var err error
		if ns, err = s.sourceNamespace(ctx, claim); err != nil {
			return nil, err
		}
		kind, name = ref.Kind, ref.Name
		if ref.APIGroup != nil {
			group = *ref.APIGroup
		}
	case claim.Spec.DataSource != nil:
		kind, name = claim.Spec.DataSource.Kind, claim.Spec.DataSource.Name
		if claim.Spec.DataSource.APIGroup != nil {
			group = *claim.Spec.DataSource.APIGroup
		}
	default:
		return nil, nil
	}
	switch {
	case group == "" && kind == "PersistentVolumeClaim":
		if !d.has(csi.ControllerServiceCapability_RPC_CLONE_VOLUME) {
			return nil, fmt.Errorf("driver %q cannot clone volumes (no CLONE_VOLUME capability)", d.name())
		}
		return s.cloneSource(ctx, claim, ns, name, d)
	case group == snapshotGroup && kind == "VolumeSnapshot":
		if !d.has(csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT) {
			return nil, fmt.Errorf("driver %q cannot restore snapshots (no CREATE_DELETE_SNAPSHOT capability)", d.name())
		}
		return s.snapshotSource(ctx, claim, ns, name, d)
	default:
		return nil, fmt.Errorf("data source %s %q of group %q is not supported: only PersistentVolumeClaim and %s VolumeSnapshot", kind, name, group, snapshotGroup)
	}
}

func (s sources) cloneSource(ctx context.Context, claim *corev1.PersistentVolumeClaim, ns, name string, d *driver) (*csi.VolumeContentSource, error) {
	src, err := s.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("source claim %s/%s: %w", ns, name, err)
	}
	if src.DeletionTimestamp != nil {
		return nil, fmt.Errorf("source claim %s/%s is being deleted", ns, name)
	}
	if src.Status.Phase != corev1.ClaimBound || src.Spec.VolumeName == "" {
		return nil, fmt.Errorf("source claim %s/%s is not Bound yet", ns, name)
	}
	if match.ClaimClass(src) != match.ClaimClass(claim) {
		return nil, fmt.Errorf("source claim %s/%s is of StorageClass %q, not %q: a clone must be of the same class", ns, name, match.ClaimClass(src), match.ClaimClass(claim))
	}
	want := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	if have, ok := src.Status.Capacity[corev1.ResourceStorage]; ok && want.Cmp(have) < 0 {
		return nil, fmt.Errorf("the claim requests %s, less than its source claim %s/%s holds (%s)", want.String(), ns, name, have.String())
	}
	pv, err := s.client.CoreV1().PersistentVolumes().Get(ctx, src.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("volume %s of source claim %s/%s: %w", src.Spec.VolumeName, ns, name, err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != d.name() {
		return nil, fmt.Errorf("source claim %s/%s is not a volume of driver %q", ns, name, d.name())
	}
	if err := checkCloneVolumeMode(claim, pv); err != nil {
		return nil, err
	}
	// As external-provisioner: the source stays until no Pending claim
	// clones it (cloneProtection).
	if err := protectCloneSource(ctx, s.client, src); err != nil {
		return nil, err
	}
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: pv.Spec.CSI.VolumeHandle},
	}}, nil
}

func (s sources) snapshotSource(ctx context.Context, claim *corev1.PersistentVolumeClaim, ns, name string, d *driver) (*csi.VolumeContentSource, error) {
	if s.dynamic == nil {
		return nil, fmt.Errorf("VolumeSnapshot data sources are not supported by this provisioner")
	}
	snap, err := s.dynamic.Resource(snapshotsResource).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && isMissingResource(err) {
			return nil, fmt.Errorf("VolumeSnapshot %s/%s: the VolumeSnapshot CRDs (%s) are not installed", ns, name, snapshotGroup)
		}
		return nil, fmt.Errorf("VolumeSnapshot %s/%s: %w", ns, name, err)
	}
	// A snapshot being deleted that carries the snapshot-as-source
	// finalizer is restored from: a restore from it started before the
	// deletion (as external-provisioner).
	if snap.GetDeletionTimestamp() != nil && !slices.Contains(snap.GetFinalizers(), finalizerSnapshotSource) {
		return nil, fmt.Errorf("VolumeSnapshot %s/%s is being deleted", ns, name)
	}
	ready, _, _ := unstructured.NestedBool(snap.Object, "status", "readyToUse")
	content, _, _ := unstructured.NestedString(snap.Object, "status", "boundVolumeSnapshotContentName")
	if !ready || content == "" {
		return nil, fmt.Errorf("VolumeSnapshot %s/%s is not ready to use yet", ns, name)
	}
	c, err := s.dynamic.Resource(snapshotContentsResource).Get(ctx, content, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("VolumeSnapshotContent %s of VolumeSnapshot %s/%s: %w", content, ns, name, err)
	}
	if !boundTo(c, snap) {
		// A content that names another snapshot (or another incarnation
		// of this one, by UID) is not this snapshot's data: external-
		// provisioner's check and words.
		return nil, fmt.Errorf("error getting handle for DataSource Type VolumeSnapshot by Name %s: snapshotcontent %s for snapshot %s is bound to a different snapshot", name, content, name)
	}
	drv, _, _ := unstructured.NestedString(c.Object, "spec", "driver")
	handle, _, _ := unstructured.NestedString(c.Object, "status", "snapshotHandle")
	if drv != d.name() {
		return nil, fmt.Errorf("VolumeSnapshot %s/%s was taken by driver %q, not %q", ns, name, drv, d.name())
	}
	if handle == "" {
		return nil, fmt.Errorf("VolumeSnapshotContent %s has no snapshot handle yet", content)
	}
	if err := s.checkSnapshotVolumeMode(claim, c); err != nil {
		// External-provisioner's words, with its prefix for every error
		// of the snapshot's handle.
		return nil, fmt.Errorf("error getting handle for DataSource Type VolumeSnapshot by Name %s: %w", name, err)
	}
	// Protected from here until the volume is provisioned
	// (snapshotprotection.go).
	if err := s.protectSnapshot(ctx, snap); err != nil {
		return nil, err
	}
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: handle},
	}}, nil
}

// boundTo reports whether the VolumeSnapshotContent content is bound to
// the VolumeSnapshot snap: its spec.volumeSnapshotRef names snap's
// namespace, name and UID.
func boundTo(content, snap *unstructured.Unstructured) bool {
	ns, _, _ := unstructured.NestedString(content.Object, "spec", "volumeSnapshotRef", "namespace")
	name, _, _ := unstructured.NestedString(content.Object, "spec", "volumeSnapshotRef", "name")
	uid, _, _ := unstructured.NestedString(content.Object, "spec", "volumeSnapshotRef", "uid")
	return ns == snap.GetNamespace() && name == snap.GetName() && uid == string(snap.GetUID())
}

// checkSnapshotVolumeMode is external-provisioner's
// --prevent-volume-mode-conversion: a restore may not give the volume
// another mode than the snapshot's source volume had
// (spec.sourceVolumeMode of its VolumeSnapshotContent; a Filesystem
// snapshot restored as Block hands the user the raw file system) unless
// the content's annotation annAllowVolumeModeChange parses as true. A
// content or a claim without a mode is not checked, as there.
func (s sources) checkSnapshotVolumeMode(claim *corev1.PersistentVolumeClaim, content *unstructured.Unstructured) error {
	source, ok, _ := unstructured.NestedString(content.Object, "spec", "sourceVolumeMode")
	if s.allowModeConversion || !ok || claim.Spec.VolumeMode == nil || corev1.PersistentVolumeMode(source) == *claim.Spec.VolumeMode {
		return nil
	}
	denied := fmt.Sprintf("requested volume %s/%s modifies the mode of the source volume but does not have permission to do so. ", claim.Namespace, claim.Name)
	v, ok := content.GetAnnotations()[annAllowVolumeModeChange]
	if !ok {
		return fmt.Errorf("%s%s annotation is not present on snapshotcontent %s", denied, annAllowVolumeModeChange, content.GetName())
	}
	allow, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("%sfailed to convert %s annotation value to boolean with error: %v", denied, annAllowVolumeModeChange, err)
	}
	if !allow {
		return fmt.Errorf("%s%s is set to false on snapshotcontent %s", denied, annAllowVolumeModeChange, content.GetName())
	}
	return nil
}

// isMissingResource tells "the resource type does not exist" (no CRD) from
// "no such object".
func isMissingResource(err error) bool {
	se, ok := err.(apierrors.APIStatus)
	if !ok {
		return false
	}
	d := se.Status().Details
	return d == nil || d.Name == ""
}

// planKey marks the context of PlanVolume, which must write nothing: the
// sources are resolved and checked, and not protected.
type planKey struct{}

func forPlan(ctx context.Context) context.Context { return context.WithValue(ctx, planKey{}, true) }

func planning(ctx context.Context) bool { return ctx.Value(planKey{}) != nil }
