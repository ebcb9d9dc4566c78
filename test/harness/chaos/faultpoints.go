package chaos

import (
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/faultpoint"
)

// ArmFault restarts r with the fault point armed (pkg/faultpoint) and
// waits until it serves again.
func (c *Cluster) ArmFault(t testing.TB, r *Replica, point string) {
	t.Helper()
	r.Kill()
	if err := r.StartWithEnv(faultpoint.EnvVar + "=" + point); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitServing(t.Context(), r, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// WaitFaultExit waits for r to exit at its armed fault point, failing t
// when it does not within 2 minutes or exits otherwise.
func WaitFaultExit(t testing.TB, r *Replica) {
	t.Helper()
	select {
	case <-r.Done():
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s did not reach its fault point within 2m (log %s)", r.Name, r.LogPath())
	}
	if code := r.ExitCode(); code != faultpoint.ExitCode {
		t.Fatalf("%s exited with %d, want the fault point's %d (log %s)", r.Name, code, faultpoint.ExitCode, r.LogPath())
	}
}
