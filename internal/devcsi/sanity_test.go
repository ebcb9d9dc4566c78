package devcsi_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
)

// sanityEnv names the csi-sanity binary; the Makefile installs the pinned
// version into ./bin and exports it for `make test`.
const sanityEnv = "VOLPLANE_CSI_SANITY"

// TestCSISanity runs the CSI conformance suite, kubernetes-csi's csi-sanity,
// against the driver in this process, in two layouts: one driver serving
// the controller and the node endpoints (two unix sockets), as a CO with
// separate controller and node plugins would reach them; and, as in a
// cluster, a controller-only driver and a node-only driver, two Drivers
// sharing one root directory through its lock and state files. Nothing is
// skipped by name: the specs csi-sanity skips are those of capabilities
// the driver does not advertise (node expansion, health, group snapshots,
// ...). ModifyVolume runs with mutable parameters the driver takes.
func TestCSISanity(t *testing.T) {
	if testing.Short() {
		t.Skip("csi-sanity runs the whole conformance suite; skipped with -short")
	}
	bin := os.Getenv(sanityEnv)
	if bin == "" {
		t.Fatalf("%s is not set: run `make test`, which installs the pinned csi-sanity into ./bin and sets it (or set it to a csi-sanity v5.6.0 binary)", sanityEnv)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s=%s: %v (`make test` installs it)", sanityEnv, bin, err)
	}
	for _, tc := range []struct {
		name                 string
		controller, nodeMode devcsi.Mode
	}{
		{"one driver", devcsi.ModeAll, ""},
		{"controller and node parts on one root", devcsi.ModeController, devcsi.ModeNode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sanity(t, bin, tc.controller, tc.nodeMode)
		})
	}
}

// sanity runs csi-sanity against a driver of mode controller on the
// controller endpoint and, on the node endpoint, the same driver (nodeMode
// empty) or another of nodeMode on the same root.
func sanity(t *testing.T, bin string, controllerMode, nodeMode devcsi.Mode) {
	dir := t.TempDir()
	newDriver := func(mode devcsi.Mode) *devcsi.Driver {
		d, err := devcsi.New(devcsi.Options{
			Mode:    mode,
			RootDir: filepath.Join(dir, "root"),
			NodeID:  "sanity-node",
			Logger:  slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	controllerDriver := newDriver(controllerMode)
	nodeDriver := controllerDriver
	if nodeMode != "" {
		nodeDriver = newDriver(nodeMode)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var runs []chan error
	endpoint := func(d *devcsi.Driver, name string) string {
		addr := "unix://" + filepath.Join(dir, name+".sock")
		lis, err := grpcutil.Listen(addr)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx, lis) }()
		runs = append(runs, done)
		return addr
	}
	controller, node := endpoint(controllerDriver, "controller"), endpoint(nodeDriver, "node")
	t.Cleanup(func() {
		cancel()
		for _, done := range runs {
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	})

	mutable := filepath.Join(dir, "mutable.yaml")
	if err := os.WriteFile(mutable, []byte("iops: \"3000\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin,
		"--csi.testvolumemutableparameters", mutable,
		"--csi.endpoint", node,
		"--csi.controllerendpoint", controller,
		// csi-sanity creates these itself (and fails if they exist).
		"--csi.mountdir", filepath.Join(dir, "mount"),
		"--csi.stagingdir", filepath.Join(dir, "staging"),
		"--ginkgo.no-color",
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("csi-sanity (node publish mode %s) failed: %v\n%s", nodeDriver.PublishMode(), err, out)
	}
	summary := regexp.MustCompile(`(?m)^(Ran \d+ of \d+ Specs.*|SUCCESS!.*)$`).FindAll(out, -1)
	for _, line := range summary {
		t.Logf("csi-sanity: %s", line)
	}
	if len(summary) == 0 {
		t.Fatalf("csi-sanity passed but printed no summary:\n%s", out)
	}
}
