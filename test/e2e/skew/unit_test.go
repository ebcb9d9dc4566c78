package skew

import (
	"slices"
	"strings"
	"testing"
)

// The matrix's rows: both baselines, each service alone at each release,
// the upgrade order's middle steps, and no row twice.
func TestRows(t *testing.T) {
	all := rows()
	if len(all) != 2+2*len(services)+2 {
		t.Fatalf("%d rows, want %d", len(all), 2+2*len(services)+2)
	}
	seen := map[string]bool{}
	alone := map[string]map[bool]bool{}
	for _, r := range all {
		var key []string
		n := 0
		for _, s := range services {
			key = append(key, releaseName(r.prev[s]))
			if r.prev[s] {
				n++
			}
		}
		k := strings.Join(key, ",")
		if seen[k] {
			t.Errorf("row %s repeats %s", r.name, k)
		}
		seen[k] = true
		for _, s := range services {
			// s alone at prev (n == 1) or alone at HEAD (n == 4).
			if (n == 1 && r.prev[s]) || (n == len(services)-1 && !r.prev[s]) {
				if alone[s] == nil {
					alone[s] = map[bool]bool{}
				}
				alone[s][r.prev[s]] = true
			}
		}
	}
	for _, s := range services {
		if !alone[s][true] || !alone[s][false] {
			t.Errorf("%s is not alone at each release in some row: %v", s, alone[s])
		}
	}
	// Every prefix of the upgrade order at HEAD, the rest at prev.
	for k := range len(services) + 1 {
		var key []string
		for i := range services {
			key = append(key, releaseName(i >= k))
		}
		if !seen[strings.Join(key, ",")] {
			t.Errorf("no row with the first %d services of the upgrade order at HEAD", k)
		}
	}
}

// The flag pattern reads pflag's usage, long flags with and without a
// shorthand, and nothing from the descriptions; a removed flag is found.
func TestFlags(t *testing.T) {
	help := `Usage:
  reclaimer [flags]

Reclaimer flags:

      --provisioner-address string        gRPC address of the provisioner service, which
                                          deletes the CSI volumes
                                          --like-this, a description's line
      --standalone                        run without volplane's binder
  -h, --help      print this help and exit
`
	var got []string
	for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
		got = append(got, m[1])
	}
	if want := []string{"provisioner-address", "standalone", "help"}; !slices.Equal(got, want) {
		t.Errorf("flags %v, want %v", got, want)
	}
	added, removed := flagDiff([]string{"a", "c"}, []string{"a", "b"})
	if !slices.Equal(added, []string{"--c"}) || !slices.Equal(removed, []string{"--b"}) {
		t.Errorf("added %v removed %v, want [--c] [--b]", added, removed)
	}
}

// A service's release comes from its startup line: the previous release
// only with both its version and its commit.
func TestStartLine(t *testing.T) {
	for _, tc := range []struct {
		line, version, commit string
	}{
		{`time=2026-12-07T04:15:24.135Z level=INFO msg=starting component=watcher version=v0.1.0-prev commit=468427ac3e68 go=go1.26.8`, "v0.1.0-prev", "468427ac3e68"},
		{`time=2026-12-07T04:15:24.135Z level=INFO msg=starting component=binder version=v0.0.0-dev commit=unknown go=go1.26.8`, "v0.0.0-dev", "unknown"},
	} {
		m := startLine.FindStringSubmatch(tc.line)
		if m == nil || m[1] != tc.version || m[2] != tc.commit {
			t.Errorf("%s: got %v, want %s %s", tc.line, m, tc.version, tc.commit)
		}
	}
	if m := startLine.FindStringSubmatch(`level=INFO msg="starting reclaim" volume=pvc-1`); m != nil {
		t.Errorf("a line that is not the startup line matched: %v", m)
	}
}
