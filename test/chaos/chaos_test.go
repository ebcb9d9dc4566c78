package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/volplane/volplane/test/harness/chaos"
)

// A short seeded chaos run, with the rebind of Released volumes on for
// most static PVs and a Retain class (docs/rebind.md): every invariant
// holds, and some volumes are rebound. Under two minutes on a two-core
// machine, binaries built.
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every service as processes against a real kube-apiserver and etcd")
	}
	bin := t.TempDir()
	began := time.Now()
	if err := chaos.Build(t.Context(), bin); err != nil {
		t.Fatal(err)
	}
	t.Logf("binaries built in %s", time.Since(began).Round(time.Millisecond))
	dir := t.TempDir()
	var out strings.Builder
	rep, err := chaos.Run(t.Context(), chaos.Options{
		Cluster:        chaos.ClusterOptions{Dir: dir, BinDir: bin},
		Seed:           42,
		Duration:       40 * time.Second,
		StaticPairs:    40,
		DynamicClaims:  20,
		Deletions:      20,
		RebindReleased: true,
		KillEvery:      4 * time.Second,
		Converge:       chaos.ShortRunConverge,
		Out:            &out,
	})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		dumpLogs(t, dir)
		t.Fatal(err)
	}
}

// dumpLogs prints the end of every process's log.
func dumpLogs(t *testing.T, dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		if len(b) > 8<<10 {
			b = b[len(b)-8<<10:]
		}
		t.Logf("---- %s (end) ----\n%s", filepath.Base(l), b)
	}
}
