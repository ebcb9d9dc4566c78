package devcsi_test

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/internal/devcsi"
)

// mountsUnder lists the mount points at or under dir, deepest last, from
// /proc/self/mountinfo.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := strings.ReplaceAll(fields[4], `\040`, " ")
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// kubeletDirs makes a kubelet-like directory tree in a temporary directory
// and, when the test ends, unmounts whatever is still mounted under it (so
// that a failing test neither leaves mounts behind nor lets TempDir's
// removal delete a volume's content through one).
func kubeletDirs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() {
		ms := mountsUnder(t, dir)
		for i := len(ms) - 1; i >= 0; i-- {
			_ = syscall.Unmount(ms[i], syscall.MNT_DETACH)
		}
	})
	return dir
}

// stagingPath is where the kubelet stages a volume (it makes the
// directory itself); targetPath where it publishes one for a pod (it makes
// the parent, the driver the target).
func stagingPath(t *testing.T, kubelet, handle string) string {
	t.Helper()
	p := filepath.Join(kubelet, "plugins", "kubernetes.io", "csi", devcsi.DefaultName, handle, "globalmount")
	if err := os.MkdirAll(p, 0o750); err != nil {
		t.Fatal(err)
	}
	return p
}

func targetPath(t *testing.T, kubelet, pod string) string {
	t.Helper()
	p := filepath.Join(kubelet, "pods", pod, "volumes", "kubernetes.io~csi", "pv", "mount")
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		t.Fatal(err)
	}
	return p
}

func isMounted(t *testing.T, path string) bool {
	t.Helper()
	for _, m := range mountsUnder(t, path) {
		if m == path {
			return true
		}
	}
	return false
}

func bytesUsed(t *testing.T, resp *csi.NodeGetVolumeStatsResponse) int64 {
	t.Helper()
	for _, u := range resp.GetUsage() {
		if u.GetUnit() == csi.VolumeUsage_BYTES {
			return u.GetUsed()
		}
	}
	t.Fatalf("no byte usage in %v", resp.GetUsage())
	return 0
}

// The kubelet's sequence with real mounts, as root: NodeStageVolume
// bind-mounts the volume's directory on the staging path, NodePublish
// binds the staging path on each pod's target (read-only when asked),
// NodeUnpublish unmounts and removes the target, NodeUnstage unmounts and
// leaves the staging directory to the kubelet; each is idempotent, and
// every guard is tried.
func TestNodeStageAndPublishMount(t *testing.T) {
	d := start(t, devcsi.Options{NodeID: "node-a"})
	if d.PublishMode() != devcsi.PublishBind {
		t.Skipf("this process may not mount (publish mode %q): run as root", d.PublishMode())
	}
	kl := kubeletDirs(t)
	v := mustCreate(t, d, createReq("staged", 1<<20)).GetVolumeId()
	writeFile(t, filepath.Join(d.VolumePath(v), "hello"), "hi")
	staging := stagingPath(t, kl, "h1")
	stage := func(id, path string, c *csi.VolumeCapability, ctx map[string]string) error {
		_, err := d.NodeStageVolume(t.Context(), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: path, VolumeCapability: c, VolumeContext: ctx})
		return err
	}
	publish := func(id, staging, target string, ro bool) error {
		_, err := d.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target,
			VolumeCapability: rwo, Readonly: ro, VolumeContext: map[string]string{"csi.storage.k8s.io/pod.name": "p"}})
		return err
	}
	unpublish := func(id, target string) error {
		_, err := d.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		return err
	}
	unstage := func(id, path string) error {
		_, err := d.NodeUnstageVolume(t.Context(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: path})
		return err
	}
	stats := func(id, path string) (*csi.NodeGetVolumeStatsResponse, error) {
		return d.NodeGetVolumeStats(t.Context(), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: path})
	}
	t1, t2 := targetPath(t, kl, "pod-1"), targetPath(t, kl, "pod-2")

	wantCode(t, publish(v, staging, t1, false), codes.FailedPrecondition) // not staged yet
	for range 2 {
		if err := stage(v, staging, rwo, nil); err != nil {
			t.Fatalf("NodeStageVolume: %v", err)
		}
	}
	if !isMounted(t, staging) || readFile(t, filepath.Join(staging, "hello")) != "hi" {
		t.Fatalf("staging path %s: mounted %v", staging, isMounted(t, staging))
	}
	if ms := mountsUnder(t, staging); len(ms) != 1 {
		t.Fatalf("a repeated stage mounted again: %v", ms)
	}

	other := mustCreate(t, d, createReq("other", 1<<20)).GetVolumeId()
	onB := createReq("on-b", 1<<20)
	onB.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{topo("node-b")}}
	elsewhere := mustCreate(t, d, onB).GetVolumeId()
	for _, tc := range []struct {
		name  string
		id    string
		path  string
		c     *csi.VolumeCapability
		ctx   map[string]string
		want  codes.Code
		about string // in the message
	}{
		{"another access mode", v, staging, mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER), nil, codes.AlreadyExists, ""},
		{"a second staging path", v, stagingPath(t, kl, "h2"), rwo, nil, codes.FailedPrecondition, "already staged"},
		{"another volume on the path", other, staging, rwo, nil, codes.FailedPrecondition, "another volume"},
		{"a volume of another node", elsewhere, stagingPath(t, kl, "h3"), rwo, nil, codes.FailedPrecondition, `on node "node-b"`},
		{"an unknown volume the context puts elsewhere", "vol-none", stagingPath(t, kl, "h4"), rwo,
			map[string]string{devcsi.NodeKey: "node-c"}, codes.FailedPrecondition, `on node "node-c"`},
		{"an unknown volume", "vol-none", stagingPath(t, kl, "h5"), rwo, nil, codes.NotFound, ""},
		{"no volume ID", "", staging, rwo, nil, codes.InvalidArgument, ""},
		{"no staging path", v, "", rwo, nil, codes.InvalidArgument, ""},
		{"a relative staging path", v, "rel/path", rwo, nil, codes.InvalidArgument, ""},
		{"no capability", v, staging, nil, nil, codes.InvalidArgument, ""},
	} {
		t.Run("stage "+tc.name, func(t *testing.T) {
			err := stage(tc.id, tc.path, tc.c, tc.ctx)
			wantCode(t, err, tc.want)
			if !strings.Contains(status.Convert(err).Message(), tc.about) {
				t.Errorf("message %q does not say %q", status.Convert(err).Message(), tc.about)
			}
		})
	}
	if ms := mountsUnder(t, kl); len(ms) != 1 {
		t.Fatalf("refused stagings mounted something: %v", ms)
	}

	for range 2 {
		if err := publish(v, staging, t1, false); err != nil {
			t.Fatalf("NodePublishVolume: %v", err)
		}
	}
	if err := publish(v, staging, t2, true); err != nil {
		t.Fatalf("NodePublishVolume read-only: %v", err)
	}
	writeFile(t, filepath.Join(t1, "from-pod-1"), "written by pod 1")
	if got := readFile(t, filepath.Join(d.VolumePath(v), "from-pod-1")); got != "written by pod 1" {
		t.Fatalf("in the volume: %q", got)
	}
	if got := readFile(t, filepath.Join(t2, "from-pod-1")); got != "written by pod 1" {
		t.Fatalf("through the read-only target: %q", got)
	}
	if err := os.WriteFile(filepath.Join(t2, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write through the read-only publication: %v, want EROFS", err)
	}
	wantCode(t, publish(v, stagingPath(t, kl, "h6"), targetPath(t, kl, "pod-3"), false), codes.FailedPrecondition) // staged elsewhere

	for _, path := range []string{t1, t2, staging} {
		resp, err := stats(v, path)
		if err != nil {
			t.Fatalf("NodeGetVolumeStats(%s): %v", path, err)
		}
		if got := bytesUsed(t, resp); got != int64(len("hi")+len("written by pod 1")) {
			t.Errorf("NodeGetVolumeStats(%s): %d bytes used", path, got)
		}
		if len(resp.GetUsage()) != 2 || resp.GetUsage()[1].GetUnit() != csi.VolumeUsage_INODES || resp.GetUsage()[1].GetUsed() != 3 {
			t.Errorf("NodeGetVolumeStats(%s): %v, want the inodes too (the directory and 2 files)", path, resp.GetUsage())
		}
	}
	_, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: v})
	wantCode(t, err, codes.FailedPrecondition)
	wantCode(t, unstage(v, staging), codes.FailedPrecondition) // still published

	for _, tg := range []string{t1, t2} {
		for range 2 {
			if err := unpublish(v, tg); err != nil {
				t.Fatalf("NodeUnpublishVolume(%s): %v", tg, err)
			}
		}
		if _, err := os.Lstat(tg); !os.IsNotExist(err) {
			t.Fatalf("target %s after unpublish: %v", tg, err)
		}
	}
	if err := unpublish(other, t1); err != nil {
		t.Fatalf("NodeUnpublishVolume of a volume not published there: %v", err)
	}
	_, err = d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: v})
	wantCode(t, err, codes.FailedPrecondition) // still staged
	if err := unstage(other, staging); err != nil {
		t.Fatalf("NodeUnstageVolume of a volume not staged there: %v", err)
	}
	if !isMounted(t, staging) {
		t.Fatal("unstaging another volume unmounted this one")
	}
	for range 2 {
		if err := unstage(v, staging); err != nil {
			t.Fatalf("NodeUnstageVolume: %v", err)
		}
	}
	if fi, err := os.Stat(staging); err != nil || !fi.IsDir() || isMounted(t, staging) {
		t.Fatalf("staging path after unstage: %v (mounted %v), want the kubelet's empty directory", err, isMounted(t, staging))
	}
	wantCode(t, unstage("vol-none", staging), codes.NotFound)
	_, err = stats(v, staging)
	wantCode(t, err, codes.NotFound)
	if got := readFile(t, filepath.Join(d.VolumePath(v), "from-pod-1")); got != "written by pod 1" {
		t.Fatalf("content after unstage: %q", got)
	}
	if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: v}); err != nil {
		t.Fatal(err)
	}
	if ms := mountsUnder(t, kl); len(ms) != 0 {
		t.Fatalf("mounts left: %v", ms)
	}
}

// A volume staged for readers only is mounted read-only on the staging
// path, and so in every pod.
func TestNodeStageReaderOnlyIsReadOnly(t *testing.T) {
	d := start(t, devcsi.Options{NodeID: "node-a"})
	if d.PublishMode() != devcsi.PublishBind {
		t.Skipf("this process may not mount (publish mode %q): run as root", d.PublishMode())
	}
	kl := kubeletDirs(t)
	v := mustCreate(t, d, createReq("readers", 1<<20)).GetVolumeId()
	staging, target := stagingPath(t, kl, "h"), targetPath(t, kl, "pod")
	roMany := mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)
	if _, err := d.NodeStageVolume(t.Context(), &csi.NodeStageVolumeRequest{VolumeId: v, StagingTargetPath: staging, VolumeCapability: roMany}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{VolumeId: v, StagingTargetPath: staging, TargetPath: target, VolumeCapability: roMany}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{staging, target} {
		if err := os.WriteFile(filepath.Join(p, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
			t.Errorf("write at %s: %v, want EROFS", p, err)
		}
	}
	if _, err := d.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: v, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodeUnstageVolume(t.Context(), &csi.NodeUnstageVolumeRequest{VolumeId: v, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}

// After a reboot the mounts are gone but the records stay: a node plugin
// that starts forgets them, so the volume can be deleted, and a kubelet
// that stages and publishes again gets new mounts.
func TestNodeRecordsOfMountsGoneAreForgotten(t *testing.T) {
	root := t.TempDir()
	o := devcsi.Options{RootDir: root, NodeID: "node-a"}
	d := start(t, o)
	if d.PublishMode() != devcsi.PublishBind {
		t.Skipf("this process may not mount (publish mode %q): run as root", d.PublishMode())
	}
	kl := kubeletDirs(t)
	v := mustCreate(t, d, createReq("rebooted", 1<<20)).GetVolumeId()
	staging, target := stagingPath(t, kl, "h"), targetPath(t, kl, "pod")
	stageAndPublish := func(d *driver) {
		t.Helper()
		if _, err := d.NodeStageVolume(t.Context(), &csi.NodeStageVolumeRequest{VolumeId: v, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{VolumeId: v, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo}); err != nil {
			t.Fatal(err)
		}
		if !isMounted(t, staging) || !isMounted(t, target) {
			t.Fatalf("mounted: staging %v, target %v", isMounted(t, staging), isMounted(t, target))
		}
	}
	stageAndPublish(d)
	d.stop()
	// The reboot.
	for _, p := range []string{target, staging} {
		if err := syscall.Unmount(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	// Without a node plugin's restart, the kubelet's repeated calls mount again.
	d2 := start(t, o)
	stageAndPublish(d2)
	d2.stop()
	for _, p := range []string{target, staging} {
		if err := syscall.Unmount(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	// A controller-only process trusts the records: it cannot see the node's mounts.
	ctrl := start(t, devcsi.Options{RootDir: root, NodeID: "node-a", Mode: devcsi.ModeController})
	_, err := ctrl.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: v})
	wantCode(t, err, codes.FailedPrecondition)
	// The node plugin starts and forgets them.
	start(t, devcsi.Options{RootDir: root, NodeID: "node-a", Mode: devcsi.ModeNode})
	if _, err := ctrl.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: v}); err != nil {
		t.Fatalf("DeleteVolume after the node plugin's restart: %v", err)
	}
}

// Without the right to mount, staging is a record and publishing makes
// the target a symbolic link to the volume's directory; the guards are the
// same.
func TestNodeStageAndPublishSymlink(t *testing.T) {
	d := start(t, devcsi.Options{NodeID: "node-a", PublishMode: devcsi.PublishSymlink})
	kl := t.TempDir()
	v := mustCreate(t, d, createReq("linked", 1<<20)).GetVolumeId()
	writeFile(t, filepath.Join(d.VolumePath(v), "hello"), "hi")
	staging, target := stagingPath(t, kl, "h"), targetPath(t, kl, "pod")
	pub := &csi.NodePublishVolumeRequest{VolumeId: v, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo}
	_, err := d.NodePublishVolume(t.Context(), pub)
	wantCode(t, err, codes.FailedPrecondition)
	if _, err := d.NodeStageVolume(t.Context(), &csi.NodeStageVolumeRequest{VolumeId: v, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodePublishVolume(t.Context(), pub); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(target, "hello")); got != "hi" {
		t.Fatalf("through the link: %q", got)
	}
	_, err = d.NodeUnstageVolume(t.Context(), &csi.NodeUnstageVolumeRequest{VolumeId: v, StagingTargetPath: staging})
	wantCode(t, err, codes.FailedPrecondition)
	if _, err := d.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: v, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodeUnstageVolume(t.Context(), &csi.NodeUnstageVolumeRequest{VolumeId: v, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("target after unpublish: %v", err)
	}
	if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: v}); err != nil {
		t.Fatal(err)
	}
}
