package provisioner

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

func grant(ns, name string, from []map[string]any, to []map[string]any) *unstructured.Unstructured {
	conv := func(ms []map[string]any) []any {
		out := make([]any, len(ms))
		for i, m := range ms {
			out[i] = m
		}
		return out
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     map[string]any{"from": conv(from), "to": conv(to)},
	}}
}

func crossClaim(kind, group, srcNS, srcName string) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "dst", Name: "restored"}}
	c.Spec.DataSourceRef = &corev1.TypedObjectReference{Kind: kind, Name: srcName, Namespace: &srcNS}
	if group != "" {
		c.Spec.DataSourceRef.APIGroup = &group
	}
	return c
}

// A dataSourceRef into another namespace: refused with the gate off (as
// volplane always did), and with it on allowed only by a ReferenceGrant
// there whose from and to match, with external-provisioner's message.
func TestSourceNamespace(t *testing.T) {
	fromDst := []map[string]any{{"group": "", "kind": "PersistentVolumeClaim", "namespace": "dst"}}
	toSnaps := []map[string]any{{"group": snapshotGroup, "kind": "VolumeSnapshot"}}
	denied := `accessing src/snap of VolumeSnapshot dataSource from dst/restored isn't allowed`
	for _, tc := range []struct {
		name    string
		gate    bool
		claim   *corev1.PersistentVolumeClaim
		grants  []runtime.Object
		wantNS  string
		wantErr string
	}{
		{"same namespace, gate off", false, crossClaim("VolumeSnapshot", snapshotGroup, "dst", "snap"), nil, "dst", ""},
		{"no namespace, gate off", false, func() *corev1.PersistentVolumeClaim {
			c := crossClaim("VolumeSnapshot", snapshotGroup, "", "snap")
			return c
		}(), nil, "dst", ""},
		{"gate off refuses, even granted", false, crossClaim("VolumeSnapshot", snapshotGroup, "src", "snap"),
			[]runtime.Object{grant("src", "g", fromDst, toSnaps)}, "", `dataSourceRef in another namespace ("src") is not supported`},
		{"gate on, no grant", true, crossClaim("VolumeSnapshot", snapshotGroup, "src", "snap"), nil, "", denied},
		{"gate on, granted for every snapshot", true, crossClaim("VolumeSnapshot", snapshotGroup, "src", "snap"),
			[]runtime.Object{grant("src", "g", fromDst, toSnaps)}, "src", ""},
		{"gate on, granted by name", true, crossClaim("VolumeSnapshot", snapshotGroup, "src", "snap"),
			[]runtime.Object{grant("src", "g", fromDst, []map[string]any{{"group": snapshotGroup, "kind": "VolumeSnapshot", "name": "snap"}})}, "src", ""},
		{"gate on, granted another name", true, crossClaim("VolumeSnapshot", snapshotGroup, "src", "snap"),
			[]runtime.Object{grant("src", "g", fromDst, []map[string]any{{"group": snapshotGroup, "kind": "VolumeSnapshot", "name": "other"}})}, "", denied},
		{"gate on, grant in a third namespace", true, crossClaim("VolumeSnapshot", snapshotGroup, "src", "snap"),
			[]runtime.Object{grant("third", "g", fromDst, toSnaps)}, "", denied},
		{"gate on, grant from another namespace", true, crossClaim("VolumeSnapshot", snapshotGroup, "src", "snap"),
			[]runtime.Object{grant("src", "g", []map[string]any{{"group": "", "kind": "PersistentVolumeClaim", "namespace": "else"}}, toSnaps)}, "", denied},
		{"gate on, grant from another kind", true, crossClaim("VolumeSnapshot", snapshotGroup, "src", "snap"),
			[]runtime.Object{grant("src", "g", []map[string]any{{"group": "", "kind": "Pod", "namespace": "dst"}}, toSnaps)}, "", denied},
		{"gate on, grant to another group", true, crossClaim("VolumeSnapshot", snapshotGroup, "src", "snap"),
			[]runtime.Object{grant("src", "g", fromDst, []map[string]any{{"group": "example.io", "kind": "VolumeSnapshot"}})}, "", denied},
		{"gate on, grant to claims does not grant snapshots", true, crossClaim("VolumeSnapshot", snapshotGroup, "src", "snap"),
			[]runtime.Object{grant("src", "g", fromDst, []map[string]any{{"group": "", "kind": "PersistentVolumeClaim"}})}, "", denied},
		{"gate on, clone granted", true, crossClaim("PersistentVolumeClaim", "", "src", "data"),
			[]runtime.Object{grant("src", "g", fromDst, []map[string]any{{"group": "", "kind": "PersistentVolumeClaim"}})}, "src", ""},
		{"gate on, one of two grants", true, crossClaim("VolumeSnapshot", snapshotGroup, "src", "snap"),
			[]runtime.Object{grant("src", "a", fromDst, []map[string]any{{"group": "", "kind": "PersistentVolumeClaim"}}), grant("src", "b", fromDst, toSnaps)}, "src", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := sources{dynamic: newDynamic(tc.grants...), crossNamespace: tc.gate}
			ns, err := s.sourceNamespace(t.Context(), tc.claim)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || ns != tc.wantNS {
				t.Fatalf("namespace %q, %v; want %q", ns, err, tc.wantNS)
			}
		})
	}
	t.Run("grants unreadable", func(t *testing.T) {
		dyn := newDynamic()
		dyn.PrependReactor("list", "referencegrants", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errForbidden()
		})
		_, err := (sources{dynamic: dyn, crossNamespace: true}).sourceNamespace(t.Context(), crossClaim("VolumeSnapshot", snapshotGroup, "src", "snap"))
		if err == nil || !strings.HasPrefix(err.Error(), "error getting ReferenceGrants in src namespace from api server: ") {
			t.Fatalf("error %v", err)
		}
	})
}

// --feature-gates takes Kubernetes' syntax, knows
// CrossNamespaceVolumeDataSource (off by default) and refuses the rest.
func TestFeatureGates(t *testing.T) {
	for _, tc := range []struct {
		name    string
		values  []string
		want    bool
		wantErr string
	}{
		{"default off", nil, false, ""},
		{"on", []string{"CrossNamespaceVolumeDataSource=true"}, true, ""},
		{"spaces and commas", []string{" CrossNamespaceVolumeDataSource = true ,"}, true, ""},
		{"last wins", []string{"CrossNamespaceVolumeDataSource=true", "CrossNamespaceVolumeDataSource=false"}, false, ""},
		{"unknown gate", []string{"HonorPVReclaimPolicy=true"}, false, "unrecognized feature gate: HonorPVReclaimPolicy"},
		{"no value", []string{"CrossNamespaceVolumeDataSource"}, false, "missing bool value"},
		{"not a bool", []string{"CrossNamespaceVolumeDataSource=yes"}, false, "invalid value of feature gate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var g FeatureGates
			var err error
			for _, v := range tc.values {
				if err = g.Set(v); err != nil {
					break
				}
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := g.Enabled(GateCrossNamespaceVolumeDataSource); got != tc.want {
				t.Errorf("enabled %v, want %v (%s)", got, tc.want, g.String())
			}
		})
	}
}
