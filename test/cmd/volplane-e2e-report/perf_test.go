package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestParsePerf: the figures of both suites from one log; the baseline's
// dump (logged before the run's own) is not taken for the run's metrics.
func TestParsePerf(t *testing.T) {
	f, err := readPerf("testdata/perf-a.log")
	if err != nil {
		t.Fatal(err)
	}
	if f.claims != 3 || f.avgLatency != 2500*time.Millisecond || f.throughput != 1.0004 {
		t.Errorf("volume-lifecycle-performance: %+v", f)
	}
	if f.deleteAll != 4012300*time.Microsecond || len(f.deletePV) != 3 {
		t.Errorf("pvc-deletion-performance: %+v", f)
	}
	if mean, most := meanMax(f.deletePV); mean != 2333666666 || most != 3001*time.Millisecond {
		t.Errorf("mean %v, max %v", mean, most)
	}
}

// TestParsePerfBroken: a log without the suites' lines has no figures;
// a figure that is not a number is an error, not a zero.
func TestParsePerfBroken(t *testing.T) {
	f, err := parsePerf("Driver hostpath.csi.volplane.io doesn't specify performance test options -- skipping", "x")
	if err != nil || f.claims != 0 || f.avgLatency != 0 || f.deleteAll != 0 || f.deletePV != nil {
		t.Errorf("a skipped run: %+v, %v", f, err)
	}
	for _, log := range []string{
		"Metrics to evaluate: (*framework.Metrics)({\n AvgLatency: (time.Duration) soon,\n Throughput: (float64) 1\n})",
		"Metrics to evaluate: (*framework.Metrics)({\n AvgLatency: (time.Duration) 5,\n Throughput: (float64) 1.2.3\n})",
		"Deleted PV pvc-1, PVC c in forever",
		"Deleted all PVC/PVs in 3parsecs",
	} {
		if _, err := parsePerf(log, "x"); err == nil {
			t.Errorf("no error for %q", log)
		}
	}
	if _, err := readPerf("testdata/missing.log"); err == nil {
		t.Error("no error for a missing log")
	}
}

// TestPerfTable: A beside B, Markdown too; a run without figures is
// named and makes the exit 1; bad arguments exit 2.
func TestPerfTable(t *testing.T) {
	dir := t.TempDir()
	b, err := os.ReadFile("testdata/perf-a.log")
	if err != nil {
		t.Fatal(err)
	}
	faster := strings.NewReplacer("2500000000", "1250000000", "1.0004", "2.5", "in 4.0123s", "in 1m2s").Replace(string(b))
	bLog := filepath.Join(dir, "b.log")
	if err := os.WriteFile(bLog, []byte(faster), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	code, err := run([]string{"perf", "-markdown", "A=testdata/perf-a.log", "B=" + bLog}, &out)
	if err != nil || code != 0 {
		t.Fatalf("exit %d, %v\n%s", code, err, out.String())
	}
	for _, want := range []string{
		"| FIGURE | A | B |",
		"| volume-lifecycle-performance: average latency, creation to Bound | 2.5s | 1.25s |",
		"| volume-lifecycle-performance: throughput (claims/s) | 1.00 | 2.50 |",
		"| pvc-deletion-performance: all claims deleted, PVs gone | 4.012s | 1m2s |",
		"| pvc-deletion-performance: one PV's deletion, mean / max | 2.334s / 3.001s | 2.334s / 3.001s |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no line %q in\n%s", want, out.String())
		}
	}
	empty := filepath.Join(dir, "empty.log")
	if err := os.WriteFile(empty, []byte("Ran 0 of 7909 Specs\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	code, err = run([]string{"perf", "A=testdata/perf-a.log", "B=" + empty}, &out)
	if err != nil || code != 1 || !strings.Contains(out.String(), "NO FIGURES in B's log") {
		t.Errorf("a run without figures: exit %d, %v\n%s", code, err, out.String())
	}
	for _, args := range [][]string{{"perf"}, {"perf", "testdata/perf-a.log"}, {"perf", "=x"}, {"perf", "A=testdata/missing.log"}, {"perf", "-x"}} {
		if code, err := run(args, &out); code != 2 || err == nil {
			t.Errorf("%v: exit %d, %v", args, code, err)
		}
	}
}
