package devcsi_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/volplane/volplane/internal/devcsi"
)

func topo(node string) *csi.Topology {
	return &csi.Topology{Segments: map[string]string{devcsi.TopologyKey: node}}
}

func TestCreateVolumeIsIdempotentByName(t *testing.T) {
	const gi = 1 << 30
	d := start(t, devcsi.Options{})
	first := mustCreate(t, d, &csi.CreateVolumeRequest{
		Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo},
		CapacityRange:             &csi.CapacityRange{RequiredBytes: 2 * gi},
		Parameters:                map[string]string{"tier": "fast"},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{topo("node-b")}},
	})
	if first.GetCapacityBytes() != 2*gi {
		t.Fatalf("capacity %d", first.GetCapacityBytes())
	}
	for _, tc := range []struct {
		name   string
		change func(*csi.CreateVolumeRequest)
		want   codes.Code
	}{
		{"the same request", func(*csi.CreateVolumeRequest) {}, codes.OK},
		{"a range the volume still satisfies", func(r *csi.CreateVolumeRequest) {
			r.CapacityRange = &csi.CapacityRange{RequiredBytes: gi, LimitBytes: 3 * gi}
		}, codes.OK},
		{"no capacity range", func(r *csi.CreateVolumeRequest) { r.CapacityRange = nil }, codes.OK},
		{"no topology requirement", func(r *csi.CreateVolumeRequest) { r.AccessibilityRequirements = nil }, codes.OK},
		{"more bytes", func(r *csi.CreateVolumeRequest) { r.CapacityRange.RequiredBytes = 3 * gi }, codes.AlreadyExists},
		{"a lower limit", func(r *csi.CreateVolumeRequest) {
			r.CapacityRange = &csi.CapacityRange{RequiredBytes: gi, LimitBytes: gi}
		}, codes.AlreadyExists},
		{"other parameters", func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{"tier": "slow"} }, codes.AlreadyExists},
		{"another node", func(r *csi.CreateVolumeRequest) {
			r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{topo("node-c")}}
		}, codes.AlreadyExists},
		{"a content source", func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
				Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: first.GetVolumeId()}}}
		}, codes.AlreadyExists},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &csi.CreateVolumeRequest{
				Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rwo},
				CapacityRange:             &csi.CapacityRange{RequiredBytes: 2 * gi},
				Parameters:                map[string]string{"tier": "fast"},
				AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{topo("node-b")}},
			}
			tc.change(req)
			resp, err := d.CreateVolume(t.Context(), req)
			wantCode(t, err, tc.want)
			if err == nil && (resp.GetVolume().GetVolumeId() != first.GetVolumeId() || resp.GetVolume().GetCapacityBytes() != 2*gi) {
				t.Fatalf("got %v, want the first volume %v", resp.GetVolume(), first)
			}
		})
	}
	list, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 1 {
		t.Fatalf("ListVolumes: %v %v, want one volume", list, err)
	}

	// The ID is stable for the name, even after a delete.
	if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: first.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: first.GetVolumeId()}); err != nil {
		t.Fatalf("second DeleteVolume: %v", err)
	}
	if _, err := os.Stat(d.VolumePath(first.GetVolumeId())); !os.IsNotExist(err) {
		t.Fatalf("the directory of a deleted volume: %v", err)
	}
	again := mustCreate(t, d, createReq("pvc-1", 0))
	if again.GetVolumeId() != first.GetVolumeId() {
		t.Fatalf("re-created pvc-1 got ID %s, first %s", again.GetVolumeId(), first.GetVolumeId())
	}
	if again.GetCapacityBytes() != devcsi.DefaultVolumeSize {
		t.Fatalf("default capacity %d", again.GetCapacityBytes())
	}
}

func TestCreateVolumeRejects(t *testing.T) {
	d := start(t, devcsi.Options{Capacity: 10 << 30, MaxVolumeSize: 4 << 30})
	mustCreate(t, d, createReq("big", 4<<30))
	mustCreate(t, d, createReq("big2", 4<<30))
	block := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	for _, tc := range []struct {
		name   string
		change func(*csi.CreateVolumeRequest)
		want   codes.Code
	}{
		{"no name", func(r *csi.CreateVolumeRequest) { r.Name = "" }, codes.InvalidArgument},
		{"no capabilities", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = nil }, codes.InvalidArgument},
		{"block", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = []*csi.VolumeCapability{block} }, codes.InvalidArgument},
		{"no access mode", func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_UNKNOWN)}
		}, codes.InvalidArgument},
		{"negative bytes", func(r *csi.CreateVolumeRequest) { r.CapacityRange.RequiredBytes = -1 }, codes.InvalidArgument},
		{"required above limit", func(r *csi.CreateVolumeRequest) { r.CapacityRange.LimitBytes = 1 }, codes.InvalidArgument},
		{"mutable parameters it does not take", func(r *csi.CreateVolumeRequest) { r.MutableParameters = map[string]string{"tier": "gold"} }, codes.InvalidArgument},
		{"empty source", func(r *csi.CreateVolumeRequest) { r.VolumeContentSource = &csi.VolumeContentSource{} }, codes.InvalidArgument},
		{"missing source volume", func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
				Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "vol-nope"}}}
		}, codes.NotFound},
		{"missing source snapshot", func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "snap-nope"}}}
		}, codes.NotFound},
		{"above the largest volume", func(r *csi.CreateVolumeRequest) { r.CapacityRange.RequiredBytes = 5 << 30 }, codes.OutOfRange},
		{"above what is left", func(r *csi.CreateVolumeRequest) { r.CapacityRange.RequiredBytes = 3 << 30 }, codes.ResourceExhausted},
		{"a topology without the key", func(r *csi.CreateVolumeRequest) {
			r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{"zone": "a"}}}}
		}, codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := createReq("new-"+tc.name, 1<<20)
			tc.change(req)
			_, err := d.CreateVolume(t.Context(), req)
			wantCode(t, err, tc.want)
		})
	}
	if c, err := d.GetCapacity(t.Context(), &csi.GetCapacityRequest{}); err != nil || c.GetAvailableCapacity() != 2<<30 ||
		c.GetMaximumVolumeSize().GetValue() != 4<<30 {
		t.Fatalf("GetCapacity: %v %v, want 2 GiB left and 4 GiB the largest", c, err)
	}
}

func TestCreateVolumeTopology(t *testing.T) {
	d := start(t, devcsi.Options{NodeID: "node-a"})
	other := &csi.Topology{Segments: map[string]string{"zone": "z1"}}
	for _, tc := range []struct {
		name string
		tr   *csi.TopologyRequirement
		want string
	}{
		{"none: the driver's node", nil, "node-a"},
		{"empty: the driver's node", &csi.TopologyRequirement{}, "node-a"},
		{"the first requisite", &csi.TopologyRequirement{Requisite: []*csi.Topology{topo("node-b"), topo("node-c")}}, "node-b"},
		{"the first preferred over requisite", &csi.TopologyRequirement{
			Requisite: []*csi.Topology{topo("node-b"), topo("node-c")},
			Preferred: []*csi.Topology{topo("node-c"), topo("node-b")},
		}, "node-c"},
		{"preferred without the key is passed over", &csi.TopologyRequirement{
			Requisite: []*csi.Topology{topo("node-d")},
			Preferred: []*csi.Topology{other},
		}, "node-d"},
		{"other keys in a segment are ignored", &csi.TopologyRequirement{Requisite: []*csi.Topology{
			{Segments: map[string]string{"zone": "z1", devcsi.TopologyKey: "node-e"}},
		}}, "node-e"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := createReq("topo-"+tc.name, 0)
			req.AccessibilityRequirements = tc.tr
			v := mustCreate(t, d, req)
			if got := v.GetAccessibleTopology(); len(got) != 1 || got[0].GetSegments()[devcsi.TopologyKey] != tc.want || len(got[0].GetSegments()) != 1 {
				t.Fatalf("accessible_topology %v, want {%s: %s}", got, devcsi.TopologyKey, tc.want)
			}
		})
	}
}

func TestCloneAndRestoreCopyContent(t *testing.T) {
	d := start(t, devcsi.Options{})
	src := mustCreate(t, d, createReq("src", 2<<30))
	dir := d.VolumePath(src.GetVolumeId())
	writeFile(t, filepath.Join(dir, "a.txt"), "version 1")
	writeFile(t, filepath.Join(dir, "sub", "b.txt"), "nested")
	if err := os.Symlink("a.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	snap, err := d.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: src.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	if s := snap.GetSnapshot(); !s.GetReadyToUse() || s.GetSizeBytes() != 2<<30 || s.GetSourceVolumeId() != src.GetVolumeId() {
		t.Fatalf("snapshot %v", s)
	}
	// Changes after the snapshot reach a clone, not a restore.
	writeFile(t, filepath.Join(dir, "a.txt"), "version 2")

	fromSnap := createReq("restored", 1<<30) // smaller than the snapshot: grows to fit
	fromSnap.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}}
	restored := mustCreate(t, d, fromSnap)
	fromVol := createReq("clone", 0)
	fromVol.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}}
	clone := mustCreate(t, d, fromVol)

	for _, tc := range []struct {
		v     *csi.Volume
		wantA string
	}{{restored, "version 1"}, {clone, "version 2"}} {
		if tc.v.GetCapacityBytes() != 2<<30 || tc.v.GetContentSource() == nil {
			t.Fatalf("%s: capacity %d, source %v", tc.v.GetVolumeId(), tc.v.GetCapacityBytes(), tc.v.GetContentSource())
		}
		vd := d.VolumePath(tc.v.GetVolumeId())
		if got := readFile(t, filepath.Join(vd, "a.txt")); got != tc.wantA {
			t.Fatalf("%s: a.txt %q, want %q", tc.v.GetVolumeId(), got, tc.wantA)
		}
		if got := readFile(t, filepath.Join(vd, "sub", "b.txt")); got != "nested" {
			t.Fatalf("%s: sub/b.txt %q", tc.v.GetVolumeId(), got)
		}
		if l, err := os.Readlink(filepath.Join(vd, "link")); err != nil || l != "a.txt" {
			t.Fatalf("%s: link %q %v", tc.v.GetVolumeId(), l, err)
		}
	}
	// Copies are independent.
	writeFile(t, filepath.Join(d.VolumePath(clone.GetVolumeId()), "a.txt"), "clone's own")
	if got := readFile(t, filepath.Join(dir, "a.txt")); got != "version 2" {
		t.Fatalf("writing the clone changed the source: %q", got)
	}
	// A source too big for the limit is OutOfRange.
	tooSmall := createReq("too-small", 0)
	tooSmall.CapacityRange = &csi.CapacityRange{LimitBytes: 1 << 30}
	tooSmall.VolumeContentSource = fromSnap.VolumeContentSource
	_, err = d.CreateVolume(t.Context(), tooSmall)
	wantCode(t, err, codes.OutOfRange)

	// A snapshot name is bound to its source volume.
	_, err = d.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: clone.GetVolumeId()})
	wantCode(t, err, codes.AlreadyExists)
	again, err := d.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: src.GetVolumeId()})
	if err != nil || again.GetSnapshot().GetSnapshotId() != snap.GetSnapshot().GetSnapshotId() {
		t.Fatalf("CreateSnapshot again: %v %v", again, err)
	}
	// Deleting the source leaves the snapshot and the copies.
	if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: src.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.GetSnapshot(t.Context(), &csi.GetSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
		t.Fatalf("GetSnapshot after the source went: %v", err)
	}
	if _, err := d.DeleteSnapshot(t.Context(), &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	_, err = d.GetSnapshot(t.Context(), &csi.GetSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()})
	wantCode(t, err, codes.NotFound)
}

func TestStatePersistsAcrossRestart(t *testing.T) {
	root := t.TempDir()
	o := devcsi.Options{RootDir: root, NodeID: "node-a", PublishMode: devcsi.PublishSymlink}
	d := start(t, o)
	req := createReq("keep", 3<<30)
	req.AccessibilityRequirements = &csi.TopologyRequirement{Preferred: []*csi.Topology{topo("node-b")}}
	v := mustCreate(t, d, req)
	writeFile(t, filepath.Join(d.VolumePath(v.GetVolumeId()), "data"), "survives")
	snap, err := d.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "keep-snap", SourceVolumeId: v.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "target")
	if _, err := d.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{
		VolumeId: v.GetVolumeId(), TargetPath: target, VolumeCapability: rwo,
	}); err != nil {
		t.Fatal(err)
	}
	d.stop()
	// A crash mid-copy leaves a directory the state does not know.
	leftover := filepath.Join(root, "volumes", "vol-0123.tmp")
	writeFile(t, filepath.Join(leftover, "junk"), "x")

	d2 := start(t, o)
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Fatalf("leftover directory after restart: %v", err)
	}
	list, err := d2.ListVolumes(t.Context(), &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 1 {
		t.Fatalf("ListVolumes after restart: %v %v", list, err)
	}
	got := list.GetEntries()[0].GetVolume()
	if got.GetVolumeId() != v.GetVolumeId() || got.GetCapacityBytes() != 3<<30 ||
		got.GetAccessibleTopology()[0].GetSegments()[devcsi.TopologyKey] != "node-b" {
		t.Fatalf("volume after restart %v, before %v", got, v)
	}
	if s := readFile(t, filepath.Join(d2.VolumePath(v.GetVolumeId()), "data")); s != "survives" {
		t.Fatalf("content after restart %q", s)
	}
	if again := mustCreate(t, d2, req); again.GetVolumeId() != v.GetVolumeId() {
		t.Fatalf("CreateVolume after restart made %s, want %s", again.GetVolumeId(), v.GetVolumeId())
	}
	snaps, err := d2.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{})
	if err != nil || len(snaps.GetEntries()) != 1 || snaps.GetEntries()[0].GetSnapshot().GetSnapshotId() != snap.GetSnapshot().GetSnapshotId() {
		t.Fatalf("ListSnapshots after restart: %v %v", snaps, err)
	}
	// The publication is remembered: the volume is in use.
	_, err = d2.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()})
	wantCode(t, err, codes.FailedPrecondition)
	if _, err := d2.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: v.GetVolumeId(), TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
}

func TestListPaging(t *testing.T) {
	d := start(t, devcsi.Options{})
	var all []string
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		v := mustCreate(t, d, createReq("page-"+n, 0))
		all = append(all, v.GetVolumeId())
		if _, err := d.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{Name: "snap-" + n, SourceVolumeId: v.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(all)

	t.Run("volumes two at a time", func(t *testing.T) {
		var got []string
		token := ""
		for pages := 0; ; pages++ {
			if pages > 5 {
				t.Fatal("paging does not end")
			}
			resp, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{MaxEntries: 2, StartingToken: token})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetEntries()) > 2 {
				t.Fatalf("%d entries for max 2", len(resp.GetEntries()))
			}
			for _, e := range resp.GetEntries() {
				got = append(got, e.GetVolume().GetVolumeId())
			}
			if token = resp.GetNextToken(); token == "" {
				break
			}
		}
		if !slices.Equal(got, all) {
			t.Fatalf("paged %v, want %v", got, all)
		}
	})
	t.Run("deleting the last volume of a page keeps the token good", func(t *testing.T) {
		first, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{MaxEntries: 2})
		if err != nil {
			t.Fatal(err)
		}
		last := first.GetEntries()[1].GetVolume().GetVolumeId()
		if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: last}); err != nil {
			t.Fatal(err)
		}
		rest, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{StartingToken: first.GetNextToken()})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range rest.GetEntries() {
			got = append(got, e.GetVolume().GetVolumeId())
		}
		if !slices.Equal(got, all[2:]) || rest.GetNextToken() != "" {
			t.Fatalf("after the token: %v (next %q), want %v", got, rest.GetNextToken(), all[2:])
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		_, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{StartingToken: "invalid-token"})
		wantCode(t, err, codes.Aborted)
		_, err = d.ListVolumes(t.Context(), &csi.ListVolumesRequest{MaxEntries: -1})
		wantCode(t, err, codes.InvalidArgument)
		_, err = d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{StartingToken: "invalid-token"})
		wantCode(t, err, codes.Aborted)
	})
	t.Run("snapshots paged and filtered", func(t *testing.T) {
		p1, err := d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{MaxEntries: 3})
		if err != nil || len(p1.GetEntries()) != 3 || p1.GetNextToken() == "" {
			t.Fatalf("first page: %v %v", p1, err)
		}
		p2, err := d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{StartingToken: p1.GetNextToken()})
		if err != nil || len(p2.GetEntries()) != 2 || p2.GetNextToken() != "" {
			t.Fatalf("second page: %v %v", p2, err)
		}
		bySource, err := d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{SourceVolumeId: all[0]})
		if err != nil || len(bySource.GetEntries()) != 1 || bySource.GetEntries()[0].GetSnapshot().GetSourceVolumeId() != all[0] {
			t.Fatalf("by source: %v %v", bySource, err)
		}
		id := p2.GetEntries()[0].GetSnapshot().GetSnapshotId()
		byID, err := d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{SnapshotId: id})
		if err != nil || len(byID.GetEntries()) != 1 || byID.GetEntries()[0].GetSnapshot().GetSnapshotId() != id {
			t.Fatalf("by ID: %v %v", byID, err)
		}
		none, err := d.ListSnapshots(t.Context(), &csi.ListSnapshotsRequest{SnapshotId: "snap-none"})
		if err != nil || len(none.GetEntries()) != 0 {
			t.Fatalf("unknown ID: %v %v", none, err)
		}
	})
}

func TestExpandVolume(t *testing.T) {
	d := start(t, devcsi.Options{Capacity: 5 << 30})
	v := mustCreate(t, d, createReq("grow", 1<<30))
	for _, tc := range []struct {
		name      string
		cr        *csi.CapacityRange
		want      codes.Code
		wantBytes int64
	}{
		{"grow", &csi.CapacityRange{RequiredBytes: 2 << 30}, codes.OK, 2 << 30},
		{"already big enough", &csi.CapacityRange{RequiredBytes: 1 << 30}, codes.OK, 2 << 30},
		{"shrink below the limit", &csi.CapacityRange{RequiredBytes: 1 << 30, LimitBytes: 1 << 30}, codes.OutOfRange, 0},
		{"no range", nil, codes.InvalidArgument, 0},
		{"beyond what is left", &csi.CapacityRange{RequiredBytes: 6 << 30}, codes.ResourceExhausted, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := d.ControllerExpandVolume(t.Context(), &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: tc.cr})
			wantCode(t, err, tc.want)
			if err == nil && (resp.GetCapacityBytes() != tc.wantBytes || resp.GetNodeExpansionRequired()) {
				t.Fatalf("got %v", resp)
			}
		})
	}
	got, err := d.ControllerGetVolume(t.Context(), &csi.ControllerGetVolumeRequest{VolumeId: v.GetVolumeId()})
	if err != nil || got.GetVolume().GetCapacityBytes() != 2<<30 {
		t.Fatalf("ControllerGetVolume: %v %v", got, err)
	}
	_, err = d.ControllerExpandVolume(t.Context(), &csi.ControllerExpandVolumeRequest{VolumeId: "vol-none", CapacityRange: &csi.CapacityRange{RequiredBytes: 1}})
	wantCode(t, err, codes.NotFound)
}

// A root written by the older single-file layout keeps its volumes.
func TestLegacyStateFileIsConverted(t *testing.T) {
	root := t.TempDir()
	id := "vol-00112233445566778899aabbccddeeff"
	writeFile(t, filepath.Join(root, "state.json"), `{"volumes":{"`+id+`":{"id":"`+id+`","name":"old","capacityBytes":1073741824,"node":"node-a"}},"snapshots":{},"publications":{}}`)
	writeFile(t, filepath.Join(root, "volumes", id, "data"), "kept")
	d := start(t, devcsi.Options{RootDir: root, NodeID: "node-a", PublishMode: devcsi.PublishSymlink})
	resp, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{})
	if err != nil || len(resp.GetEntries()) != 1 || resp.GetEntries()[0].GetVolume().GetVolumeId() != id {
		t.Fatalf("volumes after conversion: %v %v", resp, err)
	}
	if _, err := os.Stat(filepath.Join(root, "state.json")); !os.IsNotExist(err) {
		t.Errorf("state.json still there: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(d.VolumePath(id), "data")); err != nil || string(b) != "kept" {
		t.Errorf("volume content %q %v", b, err)
	}
}
