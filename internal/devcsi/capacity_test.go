package devcsi_test

import (
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/volplane/volplane/internal/devcsi"
)

// Each node holds NodeCapacity bytes: CreateVolume and expansion beyond
// what is left there are ResourceExhausted, and GetCapacity for the
// segment reports what is left, whatever the other nodes hold.
func TestNodeCapacity(t *testing.T) {
	const gi = 1 << 30
	d := start(t, devcsi.Options{NodeCapacity: 3 * gi})
	d.SetNodeCapacity("node-big", 10*gi)
	on := func(name, node string, bytes int64) *csi.CreateVolumeRequest {
		req := createReq(name, bytes)
		req.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{topo(node)}}
		return req
	}
	capacity := func(node string) int64 {
		t.Helper()
		req := &csi.GetCapacityRequest{}
		if node != "" {
			req.AccessibleTopology = topo(node)
		}
		resp, err := d.GetCapacity(t.Context(), req)
		if err != nil {
			t.Fatalf("GetCapacity(%s): %v", node, err)
		}
		return resp.GetAvailableCapacity()
	}
	if got := capacity("node-b"); got != 3*gi {
		t.Fatalf("empty node-b: %d bytes, want %d", got, 3*gi)
	}
	v := mustCreate(t, d, on("a", "node-b", 2*gi))
	if got := capacity("node-b"); got != gi {
		t.Errorf("node-b after 2Gi: %d, want %d", got, gi)
	}
	if got := capacity("node-c"); got != 3*gi {
		t.Errorf("node-c: %d, want %d (node-b's volumes do not count)", got, 3*gi)
	}
	if got := capacity("node-big"); got != 10*gi {
		t.Errorf("node-big: %d, want its own 10Gi", got)
	}
	_, err := d.CreateVolume(t.Context(), on("b", "node-b", 2*gi))
	wantCode(t, err, codes.ResourceExhausted)
	mustCreate(t, d, on("c", "node-c", 2*gi))
	_, err = d.ControllerExpandVolume(t.Context(), &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 4 * gi}})
	wantCode(t, err, codes.ResourceExhausted)
	if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	if got := capacity("node-b"); got != 3*gi {
		t.Errorf("node-b after the delete: %d, want %d", got, 3*gi)
	}
	mustCreate(t, d, on("b", "node-b", 3*gi))
	if got := capacity("node-b"); got != 0 {
		t.Errorf("full node-b: %d, want 0", got)
	}
}

// Every answer about a volume carries its creation time in its volume
// context, the same each time.
func TestVolumeContextHasCreationTime(t *testing.T) {
	d := start(t, devcsi.Options{})
	before := time.Now().Add(-time.Second)
	v := mustCreate(t, d, createReq("a", 0))
	at, err := time.Parse(time.RFC3339, v.GetVolumeContext()[devcsi.CreationTimeKey])
	if err != nil || at.Before(before.Truncate(time.Second)) || at.After(time.Now()) {
		t.Fatalf("creation time %q (%v), want about now", v.GetVolumeContext()[devcsi.CreationTimeKey], err)
	}
	list, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetEntries()) != 1 || list.GetEntries()[0].GetVolume().GetVolumeContext()[devcsi.CreationTimeKey] != v.GetVolumeContext()[devcsi.CreationTimeKey] {
		t.Fatalf("ListVolumes %v, want the creation time CreateVolume gave", list.GetEntries())
	}
	again := mustCreate(t, d, createReq("a", 0))
	if again.GetVolumeContext()[devcsi.CreationTimeKey] != v.GetVolumeContext()[devcsi.CreationTimeKey] {
		t.Fatalf("a repeated CreateVolume says %v, first %v", again.GetVolumeContext(), v.GetVolumeContext())
	}
}
