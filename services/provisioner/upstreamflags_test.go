package provisioner

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/sidecar"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// The tests of external-provisioner v6.3.0's flags honoured per driver
// (flags.go).

const flagsUID = "0d2c9f3e-7a1b-4c5d-9e8f-a1b2c3d4e5f6"

// withSettings gives the guarded rig's driver the sidecar settings s, as
// a discovered driver's probe would.
func withSettings(g *guarded, s sidecar.Settings) *driver {
	d := g.s.p.drivers.byProvisioner(devcsi.DefaultName)
	st := *d.current()
	st.settings = &s
	d.state.Store(&st)
	return d
}

// flagsClaim is a Pending claim of class "fast" with access modes modes.
func flagsClaim(uid string, modes ...corev1.PersistentVolumeAccessMode) *corev1.PersistentVolumeClaim {
	class := "fast"
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-" + uid[:4], UID: types.UID(uid), Annotations: map[string]string{}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, AccessModes: modes,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}
}

// lastCreate is the rig's last CreateVolume request.
func (g *guarded) lastCreate(t *testing.T) *csi.CreateVolumeRequest {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.creates) == 0 {
		t.Fatal("no CreateVolume")
	}
	return g.creates[len(g.creates)-1]
}

// provisioned provisions claim of class and returns its PV.
func (g *guarded) provisioned(t *testing.T, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) *corev1.PersistentVolume {
	t.Helper()
	claim = g.addClaim(t, claim)
	res, err := g.s.p.provision(t.Context(), claim, class, "")
	if err != nil || res.outcome != provisionerv1.Outcome_OUTCOME_FINISHED || res.volume == nil {
		t.Fatalf("provision: %v %v %s", err, res.outcome, res.message)
	}
	return res.volume
}

// --volume-name-uuid-length as external-provisioner's makeVolumeName: the
// UID without its dashes, cut; -1 (and 0, the zero Options) the whole UID.
func TestVolumeNameUUIDLength(t *testing.T) {
	claim := flagsClaim(flagsUID)
	for _, tc := range []struct {
		n    int
		want string
	}{
		{-1, "pvc-" + flagsUID},
		{0, "pvc-" + flagsUID},
		{1, "pvc-0"},
		{8, "pvc-0d2c9f3e"},
		{12, "pvc-0d2c9f3e7a1b"},
		{32, "pvc-0d2c9f3e7a1b4c5d9e8fa1b2c3d4e5f6"},
	} {
		if got := (volumeNaming{prefix: "pvc", uuidLength: tc.n}).name(claim); got != tc.want {
			t.Errorf("uuid length %d: %q, want %q", tc.n, got, tc.want)
		}
	}
	for _, n := range []int{-2, 33, 100} {
		o := Options{VolumeNameUUIDLength: n}
		if errs := o.validateFlags(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "--volume-name-uuid-length") {
			t.Errorf("--volume-name-uuid-length=%d: %v, want refused naming the flag", n, errs)
		}
	}
	for _, n := range []int{-1, 0, 1, 32} {
		o := Options{VolumeNameUUIDLength: n}
		if errs := o.validateFlags(); len(errs) != 0 {
			t.Errorf("--volume-name-uuid-length=%d refused: %v", n, errs)
		}
	}
}

// The provisioner's own --volume-name-uuid-length names the volume, the
// request and the PV; standalone mode finds the PV by that name (no
// second CreateVolume), and the claim's spec.volumeName with it is the
// provisioner's own.
func TestVolumeNameUUIDLengthProvisions(t *testing.T) {
	g := newGuarded(t)
	g.s.p.flags.uuidLength = 8
	if err := g.classes.Add(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName}); err != nil {
		t.Fatal(err)
	}
	claim := flagsClaim(flagsUID, corev1.ReadWriteOnce)
	claim.Annotations[kube.AnnStorageProvisioner] = devcsi.DefaultName
	claim = g.addClaim(t, claim)
	s := newStandaloneOf(g)
	for range 2 {
		if retry, err := s.sync(t.Context(), "ns/"+claim.Name, false); retry || err != nil {
			t.Fatalf("sync = %v, %v", retry, err)
		}
	}
	const want = "pvc-0d2c9f3e"
	if _, err := g.api.CoreV1().PersistentVolumes().Get(t.Context(), want, metav1.GetOptions{}); err != nil {
		t.Fatalf("PV %s: %v", want, err)
	}
	g.mu.Lock()
	n, name := len(g.creates), g.creates[0].GetName()
	g.mu.Unlock()
	if n != 1 || name != want {
		t.Errorf("%d CreateVolume calls, name %q; want one, %q", n, name, want)
	}
	if !g.s.p.ownVolumeName(want, claim) || g.s.p.ownVolumeName("pvc-"+flagsUID, claim) {
		t.Error("ownVolumeName does not follow --volume-name-uuid-length")
	}
	// A discovered driver's sidecar's length wins for its volumes.
	d := withSettings(g, sidecar.Settings{VolumeNamePrefix: "vendor", VolumeNameUUIDLength: 4})
	if got := g.s.p.namingFor(d).name(claim); got != "vendor-0d2c" {
		t.Errorf("sidecar --volume-name-uuid-length=4: %q, want vendor-0d2c", got)
	}
	if got := g.s.p.namingFor(withSettings(g, sidecar.Settings{VolumeNamePrefix: "vendor"})).name(claim); got != "vendor-"+flagsUID {
		t.Errorf("sidecar without --volume-name-uuid-length: %q, want the whole UID", got)
	}
}

// --immediate-topology=false, as GenerateAccessibilityRequirements: no
// requirements for a claim without a selected node whose class has no
// allowedTopologies; the class's allowedTopologies and a selected node
// still count.
func TestImmediateTopologyOff(t *testing.T) {
	zone := []corev1.TopologySelectorTerm{{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: devcsi.TopologyKey, Values: []string{"node-a"}}}}}
	for _, tc := range []struct {
		name     string
		own      bool // the provisioner's flag, not a sidecar's
		allowed  []corev1.TopologySelectorTerm
		selected string
		want     bool // requirements sent
	}{
		{"immediate", true, nil, "", false},
		{"immediate, sidecar", false, nil, "", false},
		{"allowedTopologies", true, zone, "", true},
		{"selected node", true, nil, "node-a", true},
		{"selected node, sidecar", false, nil, "node-a", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuarded(t)
			off := false
			if tc.own {
				g.s.p.flags.noImmediateTopology = true
			} else {
				withSettings(g, sidecar.Settings{ImmediateTopology: &off})
			}
			class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName, AllowedTopologies: tc.allowed}
			claim := flagsClaim(flagsUID, corev1.ReadWriteOnce)
			if tc.selected != "" {
				claim.Annotations[kube.AnnSelectedNode] = tc.selected
			}
			pv := g.provisioned(t, claim, class)
			if got := g.lastCreate(t).GetAccessibilityRequirements(); (got != nil) != tc.want {
				t.Errorf("accessibility requirements %v, want sent %v", got, tc.want)
			}
			// The PV's node affinity is where the driver put the volume,
			// as upstream (supportsTopology).
			if pv.Spec.NodeAffinity == nil {
				t.Error("PV without node affinity")
			}
		})
	}
	// The default (and a sidecar's true) sends every segment.
	g := newGuarded(t)
	g.provisioned(t, flagsClaim(flagsUID, corev1.ReadWriteOnce), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName})
	if g.lastCreate(t).GetAccessibilityRequirements() == nil {
		t.Error("--immediate-topology=true sent no requirements")
	}
}

// --controller-publish-readonly: only a claim whose only access mode is
// ReadOnlyMany gets spec.csi.readOnly, and only with the flag.
func TestControllerPublishReadOnly(t *testing.T) {
	rox, rwo := corev1.ReadOnlyMany, corev1.ReadWriteOnce
	for _, tc := range []struct {
		name  string
		flag  bool
		own   bool
		modes []corev1.PersistentVolumeAccessMode
		want  bool
	}{
		{"ROX", true, true, []corev1.PersistentVolumeAccessMode{rox}, true},
		{"ROX, sidecar", true, false, []corev1.PersistentVolumeAccessMode{rox}, true},
		{"ROX and RWO", true, true, []corev1.PersistentVolumeAccessMode{rox, rwo}, false},
		{"RWO", true, true, []corev1.PersistentVolumeAccessMode{rwo}, false},
		{"ROX, flag off", false, true, []corev1.PersistentVolumeAccessMode{rox}, false},
		{"ROX, sidecar flag off", false, false, []corev1.PersistentVolumeAccessMode{rox}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuarded(t)
			if tc.own {
				g.s.p.flags.publishReadOnly = tc.flag
			} else {
				g.s.p.flags.publishReadOnly = !tc.flag // the sidecar's wins
				withSettings(g, sidecar.Settings{ControllerPublishReadOnly: tc.flag})
			}
			class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName}
			pv := g.provisioned(t, flagsClaim(flagsUID, tc.modes...), class)
			if pv.Spec.CSI.ReadOnly != tc.want {
				t.Errorf("spec.csi.readOnly %v, want %v", pv.Spec.CSI.ReadOnly, tc.want)
			}
		})
	}
}

// The Topology gate off (the provisioner's or a sidecar's): no
// requirements, no node affinity; VolumeAttributesClass off: the claim's
// class is not copied.
func TestTopologyAndVolumeAttributesClassGates(t *testing.T) {
	for _, own := range []bool{true, false} {
		g := newGuarded(t)
		gates := map[string]bool{sidecar.GateTopology: false, sidecar.GateVolumeAttributesClass: false}
		if own {
			g.s.p.flags.gates = gates
		} else {
			withSettings(g, sidecar.Settings{FeatureGates: gates})
		}
		claim := flagsClaim(flagsUID, corev1.ReadWriteOnce)
		claim.Annotations[kube.AnnSelectedNode] = "node-a"
		vac := "gold"
		claim.Spec.VolumeAttributesClassName = &vac
		pv := g.provisioned(t, claim, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName})
		if req := g.lastCreate(t).GetAccessibilityRequirements(); req != nil || pv.Spec.NodeAffinity != nil {
			t.Errorf("own gates %v: Topology=false sent %v, PV affinity %v", own, req, pv.Spec.NodeAffinity)
		}
		if pv.Spec.VolumeAttributesClassName != nil {
			t.Errorf("own gates %v: VolumeAttributesClass=false copied %q", own, *pv.Spec.VolumeAttributesClassName)
		}
	}
}

// A CreateVolume answer without a content source, for a claim with a data
// source, is deleted and the attempt fails with "volume content source
// missing", as external-provisioner does; no PV, nothing journaled.
func TestContentSourceMissing(t *testing.T) {
	g := newGuarded(t)
	rec := record.NewFakeRecorder(10)
	g.s.p.events = func(string) record.EventRecorder { return rec }
	d := g.s.p.drivers.byProvisioner(devcsi.DefaultName)
	var mu sync.Mutex
	var deleted []string
	var created *csi.CreateVolumeRequest
	strip := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		mu.Lock()
		switch q := req.(type) {
		case *csi.DeleteVolumeRequest:
			deleted = append(deleted, q.GetVolumeId())
		case *csi.CreateVolumeRequest:
			created = q
		}
		mu.Unlock()
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := reply.(*csi.CreateVolumeResponse); ok && err == nil {
			r.GetVolume().ContentSource = nil
		}
		return err
	}
	cc, err := grpcutil.DialCSI(d.endpoint, grpc.WithChainUnaryInterceptor(strip))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	d.controller = csi.NewControllerClient(cc)

	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName}
	handle := g.volume(t, "source")
	ref := &corev1.ObjectReference{Namespace: "ns", Name: "src", UID: "src-uid"}
	if _, err := g.api.CoreV1().PersistentVolumes().Create(t.Context(), provisionedPV("pv-src", handle, corev1.VolumeBound, corev1.PersistentVolumeReclaimDelete, ref), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	src := flagsClaim("5c1e0000-0000-0000-0000-000000000001", corev1.ReadWriteOnce)
	src.Name, src.UID, src.Spec.VolumeName, src.Status.Phase = "src", "src-uid", "pv-src", corev1.ClaimBound
	g.addClaim(t, src)
	clone := flagsClaim(flagsUID, corev1.ReadWriteOnce)
	clone.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}
	clone = g.addClaim(t, clone)

	res, err := g.s.p.provision(t.Context(), clone, class, "")
	if err != nil {
		t.Fatal(err)
	}
	if res.outcome != provisionerv1.Outcome_OUTCOME_IN_BACKGROUND || res.message != "volume content source missing" || res.volume != nil {
		t.Fatalf("outcome %v %q (volume %v), want IN_BACKGROUND, volume content source missing", res.outcome, res.message, res.volume)
	}
	mu.Lock()
	if created.GetVolumeContentSource().GetVolume().GetVolumeId() != handle {
		t.Errorf("CreateVolume content source %v, want volume %s", created.GetVolumeContentSource(), handle)
	}
	if len(deleted) != 1 || deleted[0] == handle {
		t.Errorf("DeleteVolume calls %v, want one, of the new volume", deleted)
	}
	mu.Unlock()
	if !g.intact(handle) {
		t.Error("the source volume was touched")
	}
	if _, err := g.api.CoreV1().PersistentVolumes().Get(t.Context(), "pvc-"+flagsUID, metav1.GetOptions{}); err == nil {
		t.Error("a PV was saved")
	}
	if recs, _ := g.journal.List(t.Context(), kindProvision); len(recs) != 0 {
		t.Errorf("journal records left: %v", recs)
	}
	var events []string
	for len(rec.Events) > 0 {
		events = append(events, <-rec.Events)
	}
	if !strings.Contains(strings.Join(events, "\n"), "Warning ProvisioningFailed volume content source missing") {
		t.Errorf("events %q, want ProvisioningFailed volume content source missing", events)
	}
}

// wantsContentSource is upstream's condition: a dataSource, or with the
// gate a dataSourceRef into another namespace.
func TestWantsContentSource(t *testing.T) {
	other := "other"
	for _, tc := range []struct {
		name    string
		cross   bool
		claim   corev1.PersistentVolumeClaimSpec
		wantSrc bool
	}{
		{"none", false, corev1.PersistentVolumeClaimSpec{}, false},
		{"dataSource", false, corev1.PersistentVolumeClaimSpec{DataSource: &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "a"}}, true},
		{"dataSourceRef, same namespace", true, corev1.PersistentVolumeClaimSpec{DataSourceRef: &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "a"}}, false},
		{"dataSourceRef, other namespace, gate off", false, corev1.PersistentVolumeClaimSpec{DataSourceRef: &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "a", Namespace: &other}}, false},
		{"dataSourceRef, other namespace, gate on", true, corev1.PersistentVolumeClaimSpec{DataSourceRef: &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "a", Namespace: &other}}, true},
	} {
		p := &provisioner{sources: sources{crossNamespace: tc.cross}}
		if got := p.wantsContentSource(&corev1.PersistentVolumeClaim{Spec: tc.claim}); got != tc.wantSrc {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.wantSrc)
		}
	}
}

// --feature-gates takes csi-provisioner v6.3.0's gates as it does.
func TestFeatureGatesAsCSIProvisioner(t *testing.T) {
	for _, tc := range []struct {
		value string
		err   string // "" accepted
	}{
		{"Topology=false", ""},
		{"VolumeAttributesClass=false", ""},
		{"ReleaseLeaderElectionOnExit=true", ""},
		{"CrossNamespaceVolumeDataSource=true,AllBeta=true", ""},
		{"WatchList=false", ""},
		{"APIServerTracing=true", ""},
		{"APIServerTracing=false", "cannot set feature gate APIServerTracing to false, feature is locked to true"},
		{"NoSuchGate=true", "unrecognized feature gate: NoSuchGate"},
		{"Topology", "missing bool value"},
	} {
		var g FeatureGates
		err := g.Set(tc.value)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.value, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want %q", tc.value, err, tc.err)
		}
	}
	// AllAlpha turns the alpha gates on unless set, as featuregate does.
	g := FeatureGates{"AllAlpha": true, sidecar.GateReleaseLeaderElectionOnExit: false}
	if !g.Enabled(GateCrossNamespaceVolumeDataSource) || g.Enabled(sidecar.GateReleaseLeaderElectionOnExit) || !g.Enabled(sidecar.GateTopology) {
		t.Errorf("AllAlpha=true: %v", g)
	}
}

// A provisioning journaled under one --volume-name-uuid-length is carried
// on under the name its record holds after a restart with another: the
// recovery writes that PV and ends the record, instead of computing a new
// name, finding no record under it and leaving the old one for ever.
func TestRecoveryKeepsTheJournaledName(t *testing.T) {
	g := newGuarded(t)
	g.s.p.flags.uuidLength = 8
	if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"},
		Provisioner: devcsi.DefaultName}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim := g.addClaim(t, flagsClaim(flagsUID, corev1.ReadWriteOnce))
	g.drv.Faults().Set("CreateVolume", devcsi.Fault{HangCount: 1, Hang: devcsi.HangComplete})
	g.s.p.timeout = 200 * time.Millisecond
	resp, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: claim.Namespace, ClaimName: claim.Name, ClaimUid: flagsUID})
	const name = "pvc-0d2c9f3e"
	if err != nil || resp.Outcome != provisionerv1.Outcome_OUTCOME_IN_BACKGROUND || resp.GetVolumeName() != name {
		t.Fatalf("first attempt: %v %v, want IN_BACKGROUND for %s", resp, err, name)
	}
	pollVolumes(t, g, 1)
	// Restarted with the default naming.
	g.s.p.flags.uuidLength = 0
	g.s.p.timeout = 10 * time.Second
	g.s.p.recoverAll(t.Context())
	if _, err := g.api.CoreV1().PersistentVolumes().Get(t.Context(), name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the recovery wrote no PV %s: %v", name, err)
	}
	recs, err := g.journal.List(t.Context(), kindProvision)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 0 {
		t.Errorf("journal records left after the recovery: %v", recs)
	}
	if pvs, _ := g.api.CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{}); len(pvs.Items) != 1 {
		t.Errorf("%d PVs, want only %s", len(pvs.Items), name)
	}
}
