package skew

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// flagLine is a flag's line in a service's --help (pkg/cmdutil's pflag
// usage: "  -x, --name type   text" or "      --name type   text"); a
// description's continuation lines are indented further and never match.
var flagLine = regexp.MustCompile(`(?m)^(?:  -\w, |      )--([a-z0-9][a-z0-9-]*)`)

// flagsOf lists the flags bin's --help names.
func flagsOf(t *testing.T, bin string) []string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), bin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", bin, err, out)
	}
	var flags []string
	for _, m := range flagLine.FindAllStringSubmatch(string(out), -1) {
		flags = append(flags, m[1])
	}
	slices.Sort(flags)
	return slices.Compact(flags)
}

// compareFlags checks each service's command line across the releases:
// a flag the previous release knows and HEAD does not would fail the
// same manifest at the upgrade, so it fails the test; the flags only HEAD
// knows are logged (the matrix gives none of them, so both releases run
// one configuration).
func compareFlags(t *testing.T, head, prev string) {
	t.Helper()
	var b strings.Builder
	for _, s := range services {
		h, p := flagsOf(t, filepath.Join(head, s)), flagsOf(t, filepath.Join(prev, s))
		if len(p) == 0 {
			t.Fatalf("no flag found in %s --help: the pattern no longer reads it", s)
		}
		added, removed := flagDiff(h, p)
		if len(removed) > 0 {
			t.Errorf("%s at HEAD lacks flags the previous release has: %s", s, strings.Join(removed, " "))
		}
		if len(added) == 0 {
			added = []string{"(none)"}
		}
		fmt.Fprintf(&b, "  %-12s %s\n", s, strings.Join(added, " "))
	}
	t.Logf("flags only HEAD knows (not given in the matrix):\n%s", b.String())
}

// flagDiff returns the flags only head has and those only prev has, as
// --name.
func flagDiff(head, prev []string) (added, removed []string) {
	for _, f := range head {
		if !slices.Contains(prev, f) {
			added = append(added, "--"+f)
		}
	}
	for _, f := range prev {
		if !slices.Contains(head, f) {
			removed = append(removed, "--"+f)
		}
	}
	return added, removed
}
