package provisioner

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/internal/devcsi"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// Which data sources are a volume populator's: external-provisioner
// v6.3.0 decides on the kind alone, dataSource before dataSourceRef; a
// dataSourceRef of another namespace goes through the cross-namespace
// checks first.
func TestPopulatorKind(t *testing.T) {
	core, snap, pop := "", snapshotGroup, "populator.example.io"
	other := "elsewhere"
	ref := func(group *string, kind string, ns *string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns"},
			Spec: corev1.PersistentVolumeClaimSpec{DataSourceRef: &corev1.TypedObjectReference{APIGroup: group, Kind: kind, Name: "src", Namespace: ns}}}
	}
	both := ref(&pop, "Hello", nil)
	both.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}
	for _, tc := range []struct {
		name  string
		claim *corev1.PersistentVolumeClaim
		want  string
	}{
		{"no source", &corev1.PersistentVolumeClaim{}, ""},
		{"clone", ref(nil, "PersistentVolumeClaim", nil), ""},
		{"clone, core group spelt out", ref(&core, "PersistentVolumeClaim", nil), ""},
		{"snapshot", ref(&snap, "VolumeSnapshot", nil), ""},
		// Upstream then refuses the group; it is not a populator's.
		{"snapshot of another group", ref(&pop, "VolumeSnapshot", nil), ""},
		{"populator", ref(&pop, "Hello", nil), "Hello"},
		{"populator of the core group", ref(nil, "ConfigMap", nil), "ConfigMap"},
		{"populator in the claim's namespace", ref(&pop, "Hello", func() *string { s := "ns"; return &s }()), "Hello"},
		{"populator of another namespace", ref(&pop, "Hello", &other), ""},
		{"dataSource first", both, ""},
		{"populator through dataSource", &corev1.PersistentVolumeClaim{Spec: corev1.PersistentVolumeClaimSpec{
			DataSource: &corev1.TypedLocalObjectReference{APIGroup: &pop, Kind: "Hello", Name: "src"}}}, "Hello"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kind, ok := sources{}.populatorKind(tc.claim)
			if kind != tc.want || ok != (tc.want != "") {
				t.Errorf("populatorKind = %q, %t; want %q", kind, ok, tc.want)
			}
		})
	}
}

// A claim of a volume populator gets upstream's two Normal Provisioning
// events and a FINISHED outcome without a volume (no retry, no
// ProvisioningFailed); nothing is asked of the driver or journaled.
func TestPopulatorClaimIsLeftAlone(t *testing.T) {
	g := newGuarded(t)
	rec := record.NewFakeRecorder(10)
	g.s.p.events = func(string) record.EventRecorder { return rec }
	pop := "populator.example.io"
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "u1"},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:     corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
			DataSourceRef: &corev1.TypedObjectReference{APIGroup: &pop, Kind: "Hello", Name: "src"}}}
	class := testClass()
	for range 2 {
		res, err := g.s.p.provision(t.Context(), claim, class, "")
		if err != nil {
			t.Fatal(err)
		}
		if res.outcome != provisionerv1.Outcome_OUTCOME_FINISHED || res.volume != nil {
			t.Fatalf("outcome %v (volume %v), want FINISHED without a volume: %s", res.outcome, res.volume, res.message)
		}
		want := "ignored because data source (Hello) is not handled by the provisioner, assuming an external populator will provision it"
		if res.message != want {
			t.Errorf("message %q, want %q", res.message, want)
		}
		for _, want := range []string{
			`Normal Provisioning External provisioner is provisioning volume for claim "ns/c"`,
			"Normal Provisioning Assuming an external populator will provision the volume",
		} {
			if ev := <-rec.Events; ev != want {
				t.Errorf("event %q, want %q", ev, want)
			}
		}
	}
	select {
	case ev := <-rec.Events:
		t.Errorf("unexpected event %q", ev)
	default:
	}
	if len(g.creates) != 0 {
		t.Errorf("CreateVolume called: %v", g.creates)
	}
	if recs, _ := g.journal.List(t.Context(), kindProvision); len(recs) != 0 {
		t.Errorf("journaled: %v", recs)
	}
}

func testClass() *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast", UID: "c1"}, Provisioner: devcsi.DefaultName}
}

// contentObj is a VolumeSnapshotContent of the dev driver bound to
// VolumeSnapshot ns/snap, of source volume mode mode ("" for none).
func contentObj(mode string, annotations map[string]string) *unstructured.Unstructured {
	spec := map[string]any{"driver": devcsi.DefaultName,
		"volumeSnapshotRef": map[string]any{"namespace": "ns", "name": "snap", "uid": "uid-snap"}}
	if mode != "" {
		spec["sourceVolumeMode"] = mode
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": "content"},
		"spec":     spec,
		"status":   map[string]any{"snapshotHandle": "snap-handle"},
	}}
	u.SetAnnotations(annotations)
	return u
}

// --prevent-volume-mode-conversion, as external-provisioner v6.3.0: a
// restore changing the snapshot's volume mode is refused, with its words,
// unless the content's annotation parses as true or the check is off.
func TestSnapshotVolumeModeConversion(t *testing.T) {
	g := newGuarded(t)
	d := g.s.p.drivers.byProvisioner(devcsi.DefaultName)
	const denied = "error getting handle for DataSource Type VolumeSnapshot by Name snap: requested volume ns/c modifies the mode of the source volume but does not have permission to do so. "
	ann := func(v string) map[string]string { return map[string]string{annAllowVolumeModeChange: v} }
	for _, tc := range []struct {
		name        string
		source      string
		claim       corev1.PersistentVolumeMode // "" for none
		annotations map[string]string
		allow       bool
		want        string // error; "" restores
	}{
		{"Filesystem to Block", "Filesystem", corev1.PersistentVolumeBlock, nil, false,
			denied + "snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent content"},
		{"Block to Filesystem", "Block", corev1.PersistentVolumeFilesystem, nil, false,
			denied + "snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent content"},
		{"annotation false", "Filesystem", corev1.PersistentVolumeBlock, ann("false"), false,
			denied + "snapshot.storage.kubernetes.io/allow-volume-mode-change is set to false on snapshotcontent content"},
		{"annotation not a boolean", "Filesystem", corev1.PersistentVolumeBlock, ann("yes"), false,
			denied + `failed to convert snapshot.storage.kubernetes.io/allow-volume-mode-change annotation value to boolean with error: strconv.ParseBool: parsing "yes": invalid syntax`},
		{"annotation on another key", "Filesystem", corev1.PersistentVolumeBlock, map[string]string{"snapshot.storage.kubernetes.io/allow-volume-mode-change-x": "true"}, false,
			denied + "snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent content"},
		{"annotation true", "Filesystem", corev1.PersistentVolumeBlock, ann("true"), false, ""},
		{"annotation 1", "Filesystem", corev1.PersistentVolumeBlock, ann("1"), false, ""},
		{"check off", "Filesystem", corev1.PersistentVolumeBlock, nil, true, ""},
		{"same mode", "Block", corev1.PersistentVolumeBlock, nil, false, ""},
		{"content without a mode", "", corev1.PersistentVolumeBlock, nil, false, ""},
		{"claim without a mode", "Block", "", nil, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := snapshotObj("ns", "snap")
			_ = unstructured.SetNestedField(snap.Object, true, "status", "readyToUse")
			_ = unstructured.SetNestedField(snap.Object, "content", "status", "boundVolumeSnapshotContentName")
			dyn := newDynamic(snap, contentObj(tc.source, tc.annotations))
			s := sources{dynamic: dyn, allowModeConversion: tc.allow}
			claim := restoreClaim("ns", "c", "snap", corev1.ClaimPending)
			if tc.claim != "" {
				claim.Spec.VolumeMode = &tc.claim
			}
			src, err := s.snapshotSource(t.Context(), claim, "ns", "snap", d)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "" && src.GetSnapshot().GetSnapshotId() != "snap-handle":
				t.Fatalf("source %v", src)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Fatalf("error %v,\nwant %s", err, tc.want)
			}
			if tc.want != "" && slices.Contains(snapshotFinalizers(t, dyn, "ns", "snap"), finalizerSnapshotSource) {
				t.Error("a refused restore protected the snapshot")
			}
		})
	}
}

// In --standalone mode too, a populator's claim is not retried: the
// library's errStopProvision.
func TestStandaloneLeavesPopulatorClaimsAlone(t *testing.T) {
	g := newGuarded(t)
	rec := record.NewFakeRecorder(10)
	g.s.p.events = func(string) record.EventRecorder { return rec }
	if err := g.classes.Add(testClass()); err != nil {
		t.Fatal(err)
	}
	s := newStandaloneOf(g)
	c := annotatedClaim("p", devcsi.DefaultName)
	group := "populator.example.io"
	c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "Hello", Name: "src"}
	c = g.addClaim(t, c)
	if retry, err := s.sync(t.Context(), c.Namespace+"/"+c.Name, false); retry || err != nil {
		t.Fatalf("sync = %v, %v; want no retry", retry, err)
	}
	for range 2 {
		if ev := <-rec.Events; !strings.HasPrefix(ev, "Normal Provisioning ") {
			t.Errorf("event %q, want a Normal Provisioning", ev)
		}
	}
	if len(g.creates) != 0 {
		t.Errorf("CreateVolume called: %v", g.creates)
	}
}

// A content whose volumeSnapshotRef names another snapshot, or this one
// by another UID (a snapshot deleted and made again under its name), is
// not restored from: external-provisioner v6.3.0's check and words.
func TestSnapshotContentBoundToAnotherSnapshot(t *testing.T) {
	g := newGuarded(t)
	d := g.s.p.drivers.byProvisioner(devcsi.DefaultName)
	for name, ref := range map[string]map[string]any{
		"another UID":       {"namespace": "ns", "name": "snap", "uid": "uid-before"},
		"another name":      {"namespace": "ns", "name": "other", "uid": "uid-snap"},
		"another namespace": {"namespace": "elsewhere", "name": "snap", "uid": "uid-snap"},
		"no reference":      nil,
	} {
		t.Run(name, func(t *testing.T) {
			snap := snapshotObj("ns", "snap")
			_ = unstructured.SetNestedField(snap.Object, true, "status", "readyToUse")
			_ = unstructured.SetNestedField(snap.Object, "content", "status", "boundVolumeSnapshotContentName")
			content := contentObj("", nil)
			if ref == nil {
				unstructured.RemoveNestedField(content.Object, "spec", "volumeSnapshotRef")
			} else {
				_ = unstructured.SetNestedMap(content.Object, ref, "spec", "volumeSnapshotRef")
			}
			s := sources{dynamic: newDynamic(snap, content)}
			_, err := s.snapshotSource(t.Context(), restoreClaim("ns", "c", "snap", corev1.ClaimPending), "ns", "snap", d)
			want := "error getting handle for DataSource Type VolumeSnapshot by Name snap: snapshotcontent content for snapshot snap is bound to a different snapshot"
			if err == nil || err.Error() != want {
				t.Errorf("error %v, want %s", err, want)
			}
		})
	}
}
