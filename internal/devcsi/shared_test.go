package devcsi_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/internal/devcsi"
)

// Two controller parts (two provisioner replicas) and a node part share
// one root directory, as in a cluster: each sees what the others wrote
// (ListVolumes, GetCapacity, ControllerGetVolume, NodeStageVolume), the
// node's capacity holds across them, and one name still makes one volume.
func TestDriversShareARoot(t *testing.T) {
	const gi = 1 << 30
	root := t.TempDir()
	o := devcsi.Options{RootDir: root, NodeID: "node-a", NodeCapacity: 4 * gi, Mode: devcsi.ModeController}
	a, b := start(t, o), start(t, o)
	node := start(t, devcsi.Options{RootDir: root, NodeID: "node-a", Mode: devcsi.ModeNode, PublishMode: devcsi.PublishSymlink})

	va := mustCreate(t, a, createReq("from-a", 3*gi))
	list, err := b.ListVolumes(t.Context(), &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetVolume().GetVolumeId() != va.GetVolumeId() {
		t.Fatalf("b's ListVolumes after a's CreateVolume: %v %v", list, err)
	}
	if got, err := b.GetCapacity(t.Context(), &csi.GetCapacityRequest{AccessibleTopology: topo("node-a")}); err != nil || got.GetAvailableCapacity() != gi {
		t.Fatalf("b's GetCapacity: %v %v, want 1Gi left", got, err)
	}
	_, err = b.CreateVolume(t.Context(), createReq("from-b", 2*gi))
	wantCode(t, err, codes.ResourceExhausted)
	if again := mustCreate(t, b, createReq("from-a", 3*gi)); again.GetVolumeId() != va.GetVolumeId() {
		t.Fatalf("b made %s for a's name, a made %s", again.GetVolumeId(), va.GetVolumeId())
	}
	if _, err := node.NodeStageVolume(t.Context(), &csi.NodeStageVolumeRequest{VolumeId: va.GetVolumeId(),
		StagingTargetPath: filepath.Join(t.TempDir(), "staging"), VolumeCapability: rwo}); err != nil {
		t.Fatalf("the node part stages a volume a controller part made: %v", err)
	}
	_, err = a.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: va.GetVolumeId()})
	wantCode(t, err, codes.FailedPrecondition) // the node part staged it
	if _, err := b.ControllerGetVolume(t.Context(), &csi.ControllerGetVolumeRequest{VolumeId: va.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}

	// A node part serves no controller, a controller part no node.
	_, err = node.CreateVolume(t.Context(), createReq("x", 0))
	wantCode(t, err, codes.Unimplemented)
	_, err = a.NodeGetInfo(t.Context(), &csi.NodeGetInfoRequest{})
	wantCode(t, err, codes.Unimplemented)
}

// Controller parts creating volumes at once on one root never hand out
// more than the node holds: the root's lock makes each check and write of
// the state one step across processes.
func TestDriversShareCapacityUnderLoad(t *testing.T) {
	const gi = 1 << 30
	root := t.TempDir()
	o := devcsi.Options{RootDir: root, NodeID: "node-a", NodeCapacity: 10 * gi, Mode: devcsi.ModeController}
	drivers := []*driver{start(t, o), start(t, o), start(t, o)}
	var (
		mu      sync.Mutex
		created int
		wg      sync.WaitGroup
	)
	for i := range 30 {
		wg.Go(func() {
			d := drivers[i%len(drivers)]
			_, err := d.CreateVolume(t.Context(), createReq(fmt.Sprintf("load-%d", i), gi))
			switch status.Code(err) {
			case codes.OK:
				mu.Lock()
				created++
				mu.Unlock()
			case codes.ResourceExhausted:
			default:
				t.Errorf("CreateVolume %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if created != 10 {
		t.Errorf("%d volumes of 1Gi made on a node of 10Gi", created)
	}
	for _, d := range drivers {
		list, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{})
		if err != nil || len(list.GetEntries()) != 10 {
			t.Errorf("ListVolumes: %d volumes, %v", len(list.GetEntries()), err)
		}
	}
	dirs, err := os.ReadDir(filepath.Join(root, "volumes"))
	if err != nil || len(dirs) != 10 {
		t.Errorf("%d volume directories (%v), want 10", len(dirs), err)
	}
	// No temporary file is left in the state.
	err = filepath.WalkDir(filepath.Join(root, "state"), func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() && !strings.HasSuffix(p, ".json") && e.Name() != "lock" {
			t.Errorf("stray file %s", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
