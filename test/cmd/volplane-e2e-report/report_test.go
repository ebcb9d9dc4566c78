package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	exec  = "[Testpattern: Dynamic PV (default fs)] volumes should allow exec of files on the volume"
	clone = "[Testpattern: Dynamic PV (default fs)] provisioning should provision storage with pvc data source"
	block = "[Testpattern: Dynamic PV (block volmode)] volumes should store data"
	onA   = "[Testpattern: Dynamic PV (default fs)] provisioning should fail on A"
)

// TestReadReport: specs by name without the driver's prefix; suite nodes
// dropped; the specs the focus left out counted, not listed; a skip's and
// a failure's reason on one line.
func TestReadReport(t *testing.T) {
	r, err := readReport("testdata/a.xml")
	if err != nil {
		t.Fatal(err)
	}
	if r.filtered != 1 || len(r.specs) != 4 {
		t.Fatalf("filtered %d, specs %v", r.filtered, names(r))
	}
	for name, want := range map[string]spec{
		clone: {result: "passed"},
		block: {result: "skipped", reason: "Driver hostpath.csi.volplane.io doesn't support Block -- skipping"},
		onA:   {result: "failed", reason: "[FAILED] timed out waiting for the condition"},
		exec:  {result: "passed"},
	} {
		got := r.specs[name]
		if got.result != want.result || got.reason != want.reason {
			t.Errorf("%s: %+v, want %+v", name, got, want)
		}
	}
}

func TestSummary(t *testing.T) {
	var out bytes.Buffer
	code, err := run([]string{"summary", "testdata/a.xml"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if code != 1 {
		t.Errorf("exit %d with a failed spec, want 1", code)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || lines[4] != "2 passed, 1 failed, 1 skipped while running, 1 left out by the focus" {
		t.Fatalf("summary:\n%s", out.String())
	}
	if !strings.HasPrefix(lines[1], "FAILED") || !strings.Contains(lines[1], "timed out") {
		t.Errorf("the failed spec's line: %q", lines[1])
	}
	// Without a failure: 0.
	dir := t.TempDir()
	b, err := os.ReadFile("testdata/a.xml")
	if err != nil {
		t.Fatal(err)
	}
	ok := strings.Replace(string(b), `status="failed"`, `status="passed"`, 1)
	if err := os.WriteFile(filepath.Join(dir, "ok.xml"), []byte(ok), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _ := run([]string{"summary", filepath.Join(dir, "ok.xml")}, &out); code != 0 {
		t.Errorf("exit %d without a failed spec, want 0", code)
	}
}

// TestTable: a spec that passes on A and fails on B is a difference (and
// the exit code says so); one that fails on A and passes on B is not.
func TestTable(t *testing.T) {
	var out bytes.Buffer
	code, err := run([]string{"table", "A=testdata/a.xml", "B=testdata/b.xml"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if code != 1 {
		t.Errorf("exit %d with a difference, want 1", code)
	}
	s := out.String()
	if !strings.Contains(s, "DIFFERENCE "+exec+": B failed") || strings.Count(s, "DIFFERENCE") != 1 {
		t.Errorf("differences:\n%s", s)
	}
	out.Reset()
	if code, _ := run([]string{"table", "-markdown", "A=testdata/a.xml", "A2=testdata/a.xml"}, &out); code != 0 {
		t.Errorf("exit %d for a run against itself, want 0", code)
	}
	lines := strings.Split(out.String(), "\n")
	if lines[0] != "| SPEC | A | A2 |" || lines[1] != "|---|---|---|" {
		t.Errorf("markdown header:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "| "+clone+" | passed (12s) | passed (12s) |") {
		t.Errorf("markdown rows:\n%s", out.String())
	}
}

// TestRunRefuses tries every wrong command line.
func TestRunRefuses(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"nope"},
		{"summary"},
		{"summary", "a", "b"},
		{"summary", "testdata/missing.xml"},
		{"table", "A=testdata/a.xml"},
		{"table", "testdata/a.xml", "B=testdata/b.xml"},
		{"table", "=testdata/a.xml", "B=testdata/b.xml"},
		{"table", "A=main.go", "B=testdata/b.xml"},
		{"table", "-nope", "A=testdata/a.xml", "B=testdata/b.xml"},
	} {
		var out bytes.Buffer
		if code, err := run(args, &out); code != 2 || err == nil {
			t.Errorf("%q: exit %d, %v; want 2 and an error", args, code, err)
		}
	}
}
