package provisioner

import (
	"maps"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// vacClaim is a claim of class "fast" with the VolumeAttributesClass vac
// ("" for none).
func vacClaim(vac string) *corev1.PersistentVolumeClaim {
	fast := "fast"
	c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data", UID: "u1"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &fast, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}}
	if vac != "" {
		c.Spec.VolumeAttributesClassName = &vac
	}
	return c
}

// withoutModifyVolume makes g's provisioner serve a dev driver that does
// not advertise MODIFY_VOLUME instead of its own, and returns a client of
// it.
func withoutModifyVolume(t *testing.T, g *guarded) csi.ControllerClient {
	t.Helper()
	_, ep := startDriverWith(t, devcsi.Options{NoModifyVolume: true})
	cc, err := grpcutil.DialCSI(ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	reg := newRegistry(discard)
	reg.add(newDriver(ep, "", cc))
	reg.probeAll(t.Context())
	g.s.p.drivers = reg
	return csi.NewControllerClient(cc)
}

// A claim's VolumeAttributesClass at creation, as external-provisioner
// v6.3.0's prepareProvision: its parameters are CreateVolume's
// mutable_parameters and the PV names it; a class of another driver, a
// class that is not there and a driver without MODIFY_VOLUME are refused
// with upstream's messages, before the driver is asked, and nothing is
// made. On the code before VolumeAttributesClasses were handled, the
// request carried no mutable_parameters and every refusal provisioned.
func TestVolumeAttributesClassAtCreation(t *testing.T) {
	for _, tc := range []struct {
		name, vac string
		noModify  bool
		want      string // the ProvisioningFailed message; "" provisions
	}{
		{name: "the driver's class", vac: "gold"},
		{name: "no class", vac: ""},
		{name: "another driver's class", vac: "foreign", want: "Warning ProvisioningFailed VAC foreign referenced in PVC is for driver other.example.com which does not match driver name " + devcsi.DefaultName},
		{name: "a class that is not there", vac: "missing", want: `Warning ProvisioningFailed volumeattributesclasses.storage.k8s.io "missing" not found`},
		{name: "a driver without MODIFY_VOLUME", vac: "gold", noModify: true,
			want: "Warning ProvisioningFailed CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuarded(t)
			if tc.noModify {
				other := withoutModifyVolume(t, g)
				defer func() {
					if vols, err := other.ListVolumes(t.Context(), &csi.ListVolumesRequest{}); err != nil || len(vols.GetEntries()) != 0 {
						t.Errorf("the driver without MODIFY_VOLUME has volumes %v (%v)", vols.GetEntries(), err)
					}
				}()
			}
			rec := record.NewFakeRecorder(100)
			g.s.p.events = func(string) record.EventRecorder { return rec }
			gold := map[string]string{"iops": "3000"}
			for _, vac := range []*storagev1.VolumeAttributesClass{
				{ObjectMeta: metav1.ObjectMeta{Name: "gold"}, DriverName: devcsi.DefaultName, Parameters: gold},
				{ObjectMeta: metav1.ObjectMeta{Name: "foreign"}, DriverName: "other.example.com", Parameters: gold},
			} {
				if _, err := g.api.StorageV1().VolumeAttributesClasses().Create(t.Context(), vac, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			g.addClaim(t, vacClaim(tc.vac))
			resp, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "data", ClaimUid: "u1"})
			if err != nil {
				t.Fatal(err)
			}
			g.mu.Lock()
			creates := g.creates
			g.mu.Unlock()
			if tc.want != "" {
				if len(creates) != 0 || resp.GetOutcome() == provisionerv1.Outcome_OUTCOME_FINISHED {
					t.Fatalf("%d CreateVolume calls, outcome %v: want none, not FINISHED", len(creates), resp.GetOutcome())
				}
				if got := lastEvent(rec); got != tc.want {
					t.Fatalf("event %q, want %q", got, tc.want)
				}
				return
			}
			if resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_FINISHED || len(creates) != 1 {
				t.Fatalf("outcome %v after %d CreateVolume calls: %s", resp.GetOutcome(), len(creates), resp.GetMessage())
			}
			pv, err := g.api.CoreV1().PersistentVolumes().Get(t.Context(), "pvc-u1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string(nil)
			if tc.vac != "" {
				want = gold
			}
			if got := creates[0].GetMutableParameters(); !maps.Equal(got, want) {
				t.Errorf("mutable_parameters %v, want %v", got, want)
			}
			if got := pv.Spec.VolumeAttributesClassName; (got == nil) != (tc.vac == "") || (got != nil && *got != tc.vac) {
				t.Errorf("PV volumeAttributesClassName %v, want %q", got, tc.vac)
			}
		})
	}
}

// An empty volumeAttributesClassName is no class: nothing is checked and
// the PV names none, as upstream.
func TestEmptyVolumeAttributesClassIsNone(t *testing.T) {
	g := newGuarded(t)
	withoutModifyVolume(t, g)
	if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := vacClaim("")
	c.Spec.VolumeAttributesClassName = new(string)
	g.addClaim(t, c)
	resp, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "data", ClaimUid: "u1"})
	if err != nil || resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_FINISHED {
		t.Fatalf("%v %v", resp, err)
	}
	pv, err := g.api.CoreV1().PersistentVolumes().Get(t.Context(), "pvc-u1", metav1.GetOptions{})
	if err != nil || pv.Spec.VolumeAttributesClassName != nil {
		t.Fatalf("PV %v %v: want no volumeAttributesClassName", pv.Spec.VolumeAttributesClassName, err)
	}
}

// A class that is not found is tried again, not rescheduled: the selected
// node is kept.
func TestMissingAttributesClassIsNotAMissingNode(t *testing.T) {
	g := newGuarded(t)
	if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := vacClaim("missing")
	c.Annotations = map[string]string{"volume.kubernetes.io/selected-node": "node-a"}
	g.addClaim(t, c)
	resp, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "data", ClaimUid: "u1"})
	if err != nil || resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_NO_CHANGE {
		t.Fatalf("%v %v: want NO_CHANGE", resp, err)
	}
}

// lastEvent is the last event rec holds, "" for none.
func lastEvent(rec *record.FakeRecorder) string {
	var last string
	for {
		select {
		case e := <-rec.Events:
			last = e
		default:
			return last
		}
	}
}
