package devcsi_test

import (
	"os"
	"path/filepath"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/volplane/volplane/internal/devcsi"
)

func TestNodePublish(t *testing.T) {
	for _, mode := range []devcsi.PublishMode{devcsi.PublishSymlink, devcsi.PublishBind} {
		t.Run(string(mode), func(t *testing.T) {
			o := devcsi.Options{PublishMode: mode}
			if mode == devcsi.PublishBind {
				o.PublishMode = devcsi.PublishAuto
			}
			d := start(t, o)
			if d.PublishMode() != mode {
				t.Skipf("this process may not mount (publish mode %q)", d.PublishMode())
			}
			v := mustCreate(t, d, createReq("pub", 1<<20))
			other := mustCreate(t, d, createReq("other", 1<<20))
			writeFile(t, filepath.Join(d.VolumePath(v.GetVolumeId()), "hello"), "hi")
			pods := t.TempDir()
			target := filepath.Join(pods, "pod-1", "mount")
			publish := func(volID, target string, c *csi.VolumeCapability, ro bool) error {
				_, err := d.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{
					VolumeId: volID, TargetPath: target, VolumeCapability: c, Readonly: ro,
				})
				return err
			}
			if err := publish(v.GetVolumeId(), target, rwo, false); err != nil {
				t.Fatal(err)
			}
			if got := readFile(t, filepath.Join(target, "hello")); got != "hi" {
				t.Fatalf("through the target: %q", got)
			}
			writeFile(t, filepath.Join(target, "from-pod"), "written by the pod")
			if got := readFile(t, filepath.Join(d.VolumePath(v.GetVolumeId()), "from-pod")); got != "written by the pod" {
				t.Fatalf("in the volume: %q", got)
			}
			for _, tc := range []struct {
				name   string
				volID  string
				target string
				c      *csi.VolumeCapability
				ro     bool
				want   codes.Code
			}{
				{"again", v.GetVolumeId(), target, rwo, false, codes.OK},
				{"again read-only", v.GetVolumeId(), target, rwo, true, codes.AlreadyExists},
				{"another volume there", other.GetVolumeId(), target, rwo, false, codes.AlreadyExists},
				{"a second target", v.GetVolumeId(), filepath.Join(pods, "pod-2", "mount"), rwo, false, codes.OK},
				{"a single writer elsewhere", v.GetVolumeId(), filepath.Join(pods, "pod-3", "mount"),
					mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER), false, codes.FailedPrecondition},
				{"no volume ID", "", target, rwo, false, codes.InvalidArgument},
				{"no target", v.GetVolumeId(), "", rwo, false, codes.InvalidArgument},
				{"a relative target", v.GetVolumeId(), "rel/target", rwo, false, codes.InvalidArgument},
				{"no capability", v.GetVolumeId(), target, nil, false, codes.InvalidArgument},
				{"an unknown volume", "vol-none", filepath.Join(pods, "pod-4", "mount"), rwo, false, codes.NotFound},
			} {
				t.Run(tc.name, func(t *testing.T) {
					wantCode(t, publish(tc.volID, tc.target, tc.c, tc.ro), tc.want)
				})
			}

			stats, err := d.NodeGetVolumeStats(t.Context(), &csi.NodeGetVolumeStatsRequest{VolumeId: v.GetVolumeId(), VolumePath: target})
			if err != nil {
				t.Fatal(err)
			}
			if u := stats.GetUsage(); len(u) != 2 || u[0].GetUnit() != csi.VolumeUsage_BYTES ||
				u[0].GetUsed() != int64(len("hi")+len("written by the pod")) || u[0].GetTotal() != 1<<20 {
				t.Fatalf("stats %v", u)
			}
			_, err = d.NodeGetVolumeStats(t.Context(), &csi.NodeGetVolumeStatsRequest{VolumeId: v.GetVolumeId(), VolumePath: pods})
			wantCode(t, err, codes.NotFound)

			if mode == devcsi.PublishBind {
				ro := filepath.Join(pods, "pod-ro", "mount")
				if err := publish(other.GetVolumeId(), ro, rwo, true); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(ro, "x"), nil, 0o644); err == nil {
					t.Fatal("wrote through a read-only publication")
				}
				if _, err := d.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: other.GetVolumeId(), TargetPath: ro}); err != nil {
					t.Fatal(err)
				}
			}

			_, err = d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()})
			wantCode(t, err, codes.FailedPrecondition)
			for _, tg := range []string{target, filepath.Join(pods, "pod-2", "mount")} {
				for range 2 { // the second time finds nothing to do
					if _, err := d.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: v.GetVolumeId(), TargetPath: tg}); err != nil {
						t.Fatalf("NodeUnpublishVolume(%s): %v", tg, err)
					}
				}
				if _, err := os.Lstat(tg); !os.IsNotExist(err) {
					t.Fatalf("target %s after unpublish: %v", tg, err)
				}
			}
			_, err = d.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-none", TargetPath: target})
			wantCode(t, err, codes.NotFound)
			if got := readFile(t, filepath.Join(d.VolumePath(v.GetVolumeId()), "from-pod")); got != "written by the pod" {
				t.Fatalf("content after unpublish: %q", got)
			}
			if _, err := d.DeleteVolume(t.Context(), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
