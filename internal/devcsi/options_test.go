package devcsi_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
		{"socket mode beyond permissions", func(o *devcsi.Options) { o.SocketMode = 0o4770 }, []string{"--socket-mode"}},
		{"socket mode of a TCP endpoint", func(o *devcsi.Options) { o.Endpoint, o.SocketMode = "127.0.0.1:0", 0o660 }, []string{"--socket-mode"}},
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

// --socket-mode gives the socket the permissions asked, so that a client
// of another user in the socket directory's group may connect; without
// it the socket stays as the umask made it.
func TestRunSocketMode(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode fs.FileMode
	}{
		{"group may connect", 0o660},
		{"owner only", 0o600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "csi.sock")
			o := devcsi.Options{Endpoint: "unix://" + sock, RootDir: t.TempDir(), SocketMode: tc.mode}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- devcsi.Run(ctx, o) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()
			deadline := time.Now().Add(10 * time.Second)
			for {
				fi, err := os.Stat(sock)
				if err == nil && fi.Mode()&fs.ModeSocket != 0 && fi.Mode().Perm() == tc.mode {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("socket %s: %v, %v; want mode %v", sock, fi, err, tc.mode)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
