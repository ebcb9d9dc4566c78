package faultpoint

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]int // name: the hit that exits
	}{
		{"", nil},
		{"  ", nil},
		{ProvisionerAfterCreateVolume, map[string]int{ProvisionerAfterCreateVolume: 1}},
		{ProvisionerAfterCreateVolume + ":3", map[string]int{ProvisionerAfterCreateVolume: 3}},
		{BinderAfterClaimRef + ", " + ReclaimerAfterScrub + ":2", map[string]int{BinderAfterClaimRef: 1, ReclaimerAfterScrub: 2}},
		{BinderAfterClaimRef + ":0", nil},
		{BinderAfterClaimRef + ":x", nil},
	} {
		s := parse(tc.in)
		got := map[string]int{}
		if s != nil {
			for n, p := range s.points {
				got[n] = p.at
			}
		}
		if len(got) != len(tc.want) {
			t.Errorf("parse(%q) = %v, want %v", tc.in, got, tc.want)
			continue
		}
		for n, at := range tc.want {
			if got[n] != at {
				t.Errorf("parse(%q) = %v, want %v", tc.in, got, tc.want)
			}
		}
	}
}

func TestHitExitsAtTheNamedHit(t *testing.T) {
	defer func(old func(int), a *set) { exit, armed = old, a }(exit, armed)
	var code []int
	exit = func(c int) { code = append(code, c) }
	armed = parse(ReclaimerAfterScrub + ":2")
	Hit(BinderAfterClaimRef)
	Hit(ReclaimerAfterScrub)
	if len(code) != 0 {
		t.Fatalf("exited at the first hit: %v", code)
	}
	Hit(ReclaimerAfterScrub)
	if len(code) != 1 || code[0] != ExitCode {
		t.Fatalf("exits %v, want one with %d", code, ExitCode)
	}
	Hit(ReclaimerAfterScrub)
	if len(code) != 1 {
		t.Fatalf("exited again after the named hit: %v", code)
	}
}

func TestUnsetCostsNothing(t *testing.T) {
	defer func(a *set) { armed = a }(armed)
	armed = nil
	if n := testing.AllocsPerRun(100, func() { Hit(ProvisionerAfterCreateVolume) }); n != 0 {
		t.Errorf("Hit allocates %v times with the variable unset", n)
	}
}

// The real thing, in a child process: it exits with ExitCode, without
// running its deferred functions.
func TestProcessExitsWithoutDeferred(t *testing.T) {
	if os.Getenv("FAULTPOINT_CHILD") == "1" {
		defer os.Stdout.WriteString("deferred ran\n")
		Hit(ProvisionerAfterSaveVolume)
		os.Stdout.WriteString("not stopped\n")
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestProcessExitsWithoutDeferred$")
	cmd.Env = append(os.Environ(), "FAULTPOINT_CHILD=1", EnvVar+"="+ProvisionerAfterSaveVolume)
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != ExitCode {
		t.Fatalf("child ended with %v, want exit status %d\n%s", err, ExitCode, out)
	}
	if s := string(out); strings.Contains(s, "deferred ran") || strings.Contains(s, "not stopped") || !strings.Contains(s, "exiting at "+ProvisionerAfterSaveVolume) {
		t.Fatalf("child output:\n%s", s)
	}
}
