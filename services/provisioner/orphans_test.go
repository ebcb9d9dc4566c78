package provisioner

import (
	"context"
	"encoding/json"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/coord"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// hookJournal runs a hook before each List: a provisioning that finishes
// while the orphan scan runs.
type hookJournal struct {
	*memJournal
	beforeList func(kind string)
}

func (h *hookJournal) List(ctx context.Context, kind string) ([]coord.Record, error) {
	if h.beforeList != nil {
		h.beforeList(kind)
	}
	return h.memJournal.List(ctx, kind)
}

func orphanIDs(t *testing.T, s *server) map[string]*provisionerv1.Orphan {
	t.Helper()
	resp, err := s.ListOrphans(t.Context(), &provisionerv1.ListOrphansRequest{})
	if err != nil {
		t.Fatalf("ListOrphans: %v", err)
	}
	out := map[string]*provisionerv1.Orphan{}
	for _, o := range resp.GetOrphans() {
		out[o.GetVolumeId()] = o
	}
	return out
}

func journalProvision(t *testing.T, j *memJournal, name string) {
	t.Helper()
	b, _ := json.Marshal(provisionOp{ClaimNamespace: "ns", ClaimName: "c", Provisioner: devcsi.DefaultName})
	if err := j.Acquire(t.Context(), kindProvision, name, "other"); err != nil {
		t.Fatal(err)
	}
	if err := j.Put(t.Context(), kindProvision, name, "other", b); err != nil {
		t.Fatal(err)
	}
}

// A volume whose provisioning finishes between the volume listing and the
// journal read (its PV is created, then its record removed) is not
// reported: the journal is read after the volumes, and PVs after the
// journal.
func TestOrphanScanOrderMissesNoProvisioningInFlight(t *testing.T) {
	g := newGuarded(t)
	id := g.volume(t, "pvc-racing")
	journalProvision(t, g.journal, "pvc-racing")
	hj := &hookJournal{memJournal: g.journal}
	hj.beforeList = func(kind string) {
		if kind != kindProvision || hj.beforeList == nil {
			return
		}
		hj.beforeList = nil
		if _, err := g.api.CoreV1().PersistentVolumes().Create(context.Background(), provisionedPV("pvc-racing", id, corev1.VolumeBound, corev1.PersistentVolumeReclaimDelete, nil), metav1.CreateOptions{}); err != nil {
			t.Error(err)
		}
		if err := g.journal.Finish(context.Background(), kindProvision, "pvc-racing", "other"); err != nil {
			t.Error(err)
		}
	}
	g.s.p.journal = hj
	if o := orphanIDs(t, g.s)[id]; o != nil {
		t.Fatalf("a volume provisioned during the scan is reported: %v", o)
	}
}

// While a provisioning of the driver is in flight, volumes without a PV
// are reported as uncertain and DeleteOrphan refuses them; once it ends,
// one is deleted; a PV's volume never is; a PV without its volume is
// reported.
func TestDeleteOrphanRechecks(t *testing.T) {
	g := newGuarded(t)
	leak := g.volume(t, "leak")
	kept := g.volume(t, "pvc-kept")
	if _, err := g.api.CoreV1().PersistentVolumes().Create(t.Context(), provisionedPV("pvc-kept", kept, corev1.VolumeBound, corev1.PersistentVolumeReclaimDelete, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.api.CoreV1().PersistentVolumes().Create(t.Context(), provisionedPV("pvc-ghost", "vol-gone", corev1.VolumeBound, corev1.PersistentVolumeReclaimRetain, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	journalProvision(t, g.journal, "pvc-inflight")

	got := orphanIDs(t, g.s)
	if o := got[leak]; o == nil || o.GetUncertain() == "" {
		t.Fatalf("leak with a provisioning in flight: %v, want uncertain", o)
	}
	if o := got[kept]; o != nil {
		t.Errorf("a PV's volume is reported: %v", o)
	}
	if o := got["vol-gone"]; o == nil || o.GetKind() != provisionerv1.OrphanKind_ORPHAN_KIND_PERSISTENT_VOLUME || o.GetPersistentVolumeName() != "pvc-ghost" {
		t.Errorf("a PV without its volume: %v", o)
	}
	del := func(id string) error {
		_, err := g.s.DeleteOrphan(t.Context(), &provisionerv1.DeleteOrphanRequest{DriverName: devcsi.DefaultName, VolumeId: id})
		return err
	}
	if err := del(leak); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("delete while uncertain: %v, want FailedPrecondition", err)
	}
	if err := g.journal.Finish(t.Context(), kindProvision, "pvc-inflight", "other"); err != nil {
		t.Fatal(err)
	}
	if err := del(kept); status.Code(err) != codes.FailedPrecondition || !g.intact(kept) {
		t.Fatalf("delete a PV's volume: %v, intact %v", err, g.intact(kept))
	}
	if err := del(leak); err != nil {
		t.Fatalf("delete the leak: %v", err)
	}
	if err := del(leak); status.Code(err) != codes.NotFound {
		t.Fatalf("delete it again: %v, want NotFound", err)
	}
	for _, tc := range []struct{ driver, id string }{{"", "x"}, {devcsi.DefaultName, ""}, {devcsi.DefaultName, "a\x00b"}} {
		if _, err := g.s.DeleteOrphan(t.Context(), &provisionerv1.DeleteOrphanRequest{DriverName: tc.driver, VolumeId: tc.id}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%q/%q: %v, want InvalidArgument", tc.driver, tc.id, err)
		}
	}
	if _, err := g.s.DeleteOrphan(t.Context(), &provisionerv1.DeleteOrphanRequest{DriverName: "nope", VolumeId: "x"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown driver: %v, want NotFound", err)
	}
}

// A driver that cannot list volumes says so instead of answering empty.
func TestOrphansOfADriverWithoutListVolumes(t *testing.T) {
	g := newGuarded(t)
	d := g.s.p.drivers.all()[0]
	st := *d.current()
	st.caps = map[csi.ControllerServiceCapability_RPC_Type]bool{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME: true}
	d.state.Store(&st)
	resp, err := g.s.ListOrphans(t.Context(), &provisionerv1.ListOrphansRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetDrivers()) != 1 || resp.GetDrivers()[0].GetChecked() || resp.GetDrivers()[0].GetMessage() == "" {
		t.Fatalf("drivers %v, want one not checked, saying why", resp.GetDrivers())
	}
	if _, err := g.s.DeleteOrphan(t.Context(), &provisionerv1.DeleteOrphanRequest{DriverName: devcsi.DefaultName, VolumeId: "x"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("DeleteOrphan: %v, want FailedPrecondition", err)
	}
	// GetCapacity of a driver without GET_CAPACITY.
	if _, err := g.s.GetCapacity(t.Context(), &provisionerv1.GetCapacityRequest{Name: devcsi.DefaultName}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("GetCapacity without GET_CAPACITY: %v, want FailedPrecondition", err)
	}
}
