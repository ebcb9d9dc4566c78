package devcsi_test

import (
	"context"
	"strings"
	"testing"

	"github.com/volplane/volplane/internal/devcsi"
)

// volplane-csi refuses options that cannot work, every mistake at once,
// each naming its flag.
func TestRunRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*devcsi.Options)
		want   []string
	}{
		{"no endpoint, no root", func(o *devcsi.Options) { o.Endpoint, o.RootDir = "", "" }, []string{"--endpoint", "--root-dir"}},
		{"negative capacity", func(o *devcsi.Options) { o.Capacity = -1 }, []string{"--capacity"}},
		{"negative node capacity", func(o *devcsi.Options) { o.NodeCapacity = -1 }, []string{"--node-capacity"}},
		{"negative volume limit", func(o *devcsi.Options) { o.MaxVolumesPerNode = -1 }, []string{"--max-volumes-per-node"}},
		{"unknown publish mode", func(o *devcsi.Options) { o.PublishMode = "copy" }, []string{"--publish-mode"}},
		{"bad driver name", func(o *devcsi.Options) { o.Name = "-bad-" }, []string{"--driver-name"}},
		{"bad fault", func(o *devcsi.Options) { o.Faults = []string{"nonsense"} }, []string{"--fault"}},
		{"all at once", func(o *devcsi.Options) { o.Endpoint, o.Capacity, o.PublishMode = "", -1, "copy" },
			[]string{"--endpoint", "--capacity", "--publish-mode"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := devcsi.Options{Endpoint: "unix://" + t.TempDir() + "/csi.sock", RootDir: t.TempDir()}
			tc.modify(&o)
			ctx, cancel := context.WithCancel(t.Context())
			cancel() // valid options would serve until ctx ends: here at once
			err := devcsi.Run(ctx, o)
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v does not say %s", err, w)
				}
			}
		})
	}
}
