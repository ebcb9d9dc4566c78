package provisioner

import (
	"context"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/volplane/volplane/internal/devcsi"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// A claim that goes away while it is being provisioned gets no
// CreateVolume when it is gone before the call, and no PV (and no volume
// left) when it is gone before the PV: the journal record ends either way.
// The claim is deleted (or recreated under its name) in the API server at
// the n-th read of it, after Provision's own read: read 2 is the re-check
// right before CreateVolume, read 3 the one right before the PV.
func TestProvisionRechecksTheClaim(t *testing.T) {
	for _, tc := range []struct {
		name     string
		atRead   int
		recreate bool // recreate under the same name instead of deleting
		creates  int  // CreateVolume calls expected
		message  string
	}{
		{name: "deleted before CreateVolume", atRead: 2, creates: 0, message: "the claim is gone"},
		{name: "recreated before CreateVolume", atRead: 2, recreate: true, creates: 0, message: "the claim was recreated"},
		{name: "deleted before the PV", atRead: 3, creates: 1, message: "the volume is deleted"},
		{name: "recreated before the PV", atRead: 3, recreate: true, creates: 1, message: "the claim was recreated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuarded(t)
			fast := "fast"
			claim := g.addClaim(t, &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data", UID: "u1"},
				Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &fast, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}},
			})
			if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"},
				Provisioner: devcsi.DefaultName}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			gvr := schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}
			reads := 0
			g.api.PrependReactor("get", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
				if reads++; reads == tc.atRead {
					if err := g.api.Tracker().Delete(gvr, "app", "data"); err != nil {
						t.Error(err)
					}
					if tc.recreate {
						again := claim.DeepCopy()
						again.UID, again.ResourceVersion = "u2", ""
						if err := g.api.Tracker().Create(gvr, again, "app"); err != nil {
							t.Error(err)
						}
					}
				}
				return false, nil, nil
			})
			resp, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "data", ClaimUid: "u1"})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Outcome != provisionerv1.Outcome_OUTCOME_NO_CHANGE || !strings.Contains(resp.Message, tc.message) {
				t.Errorf("outcome %v %q, want NO_CHANGE saying %q", resp.Outcome, resp.Message, tc.message)
			}
			g.mu.Lock()
			creates := len(g.creates)
			g.mu.Unlock()
			if creates != tc.creates {
				t.Errorf("CreateVolume called %d times, want %d", creates, tc.creates)
			}
			if vols := listVolumes(t, g); len(vols) != 0 {
				t.Errorf("volumes left in the driver: %v", vols)
			}
			if recs, _ := g.journal.List(t.Context(), kindProvision); len(recs) != 0 {
				t.Errorf("journal records left: %v", recs)
			}
			if pvs, _ := g.api.CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{}); len(pvs.Items) != 0 {
				t.Errorf("PVs made: %d", len(pvs.Items))
			}
		})
	}
}

// An earlier attempt of a claim that is gone now may have made its volume
// in the background: the retry undoes it (CreateVolume with the journaled
// request finds the volume, DeleteVolume removes it) instead of leaving it.
func TestProvisionUndoesAnEarlierAttemptOfAClaimGone(t *testing.T) {
	g := newGuarded(t)
	fast := "fast"
	g.addClaim(t, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data", UID: "u1"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &fast, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}},
	})
	if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"},
		Provisioner: devcsi.DefaultName}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The first attempt: the driver makes the volume after the caller gave up.
	g.drv.Faults().Set("CreateVolume", devcsi.Fault{HangCount: 1, Hang: devcsi.HangComplete})
	g.s.p.timeout = 200 * time.Millisecond
	resp, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "data", ClaimUid: "u1"})
	if err != nil || resp.Outcome != provisionerv1.Outcome_OUTCOME_IN_BACKGROUND {
		t.Fatalf("first attempt: %v %v, want IN_BACKGROUND", resp, err)
	}
	pollVolumes(t, g, 1)
	// Deleted from the API, still in the informer's cache.
	if err := g.api.CoreV1().PersistentVolumeClaims("app").Delete(t.Context(), "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	g.s.p.timeout = 10 * time.Second
	claim, _ := g.s.hints.Claim("app", "data")
	class, _ := g.api.StorageV1().StorageClasses().Get(t.Context(), "fast", metav1.GetOptions{})
	res, err := g.s.p.provision(t.Context(), claim, class, "")
	if err != nil || res.outcome != provisionerv1.Outcome_OUTCOME_NO_CHANGE {
		t.Fatalf("retry: %v %v, want NO_CHANGE", res, err)
	}
	if vols := listVolumes(t, g); len(vols) != 0 {
		t.Errorf("volumes left in the driver: %v", vols)
	}
	if recs, _ := g.journal.List(t.Context(), kindProvision); len(recs) != 0 {
		t.Errorf("journal records left: %v", recs)
	}
}

func listVolumes(t *testing.T, g *guarded) []string {
	t.Helper()
	resp, err := g.csi.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range resp.GetEntries() {
		ids = append(ids, e.GetVolume().GetVolumeId())
	}
	return ids
}

// pollVolumes waits until the driver holds n volumes.
func pollVolumes(t *testing.T, g *guarded, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(listVolumes(t, g)) != n {
		if time.Now().After(deadline) {
			t.Fatalf("the driver holds %v, want %d volumes", listVolumes(t, g), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
