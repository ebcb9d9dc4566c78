package version

import (
	"runtime/debug"
	"testing"
)

func TestGet(t *testing.T) {
	vcs := func(settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{GoVersion: "go1.99.0", Main: debug.Module{Version: "(devel)"}, Settings: settings}, true
		}
	}
	for name, tc := range map[string]struct {
		version, commit string
		read            func() (*debug.BuildInfo, bool)
		want            string
	}{
		"set by ldflags": {"v0.1.0", "abc1234", vcs(debug.BuildSetting{Key: "vcs.revision", Value: "ffffffffffffffffffff"}), "v0.1.0 (commit abc1234, go1.99.0)"},
		"from vcs": {"", "", vcs(debug.BuildSetting{Key: "vcs.revision", Value: "0123456789abcdef0123"}, debug.BuildSetting{Key: "vcs.modified", Value: "true"}),
			"v0.0.0-dev (commit 0123456789ab-dirty, go1.99.0)"},
		"module version": {"", "", func() (*debug.BuildInfo, bool) {
			return &debug.BuildInfo{GoVersion: "go1.99.0", Main: debug.Module{Version: "v0.2.0"}}, true
		}, "v0.2.0 (commit unknown, go1.99.0)"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := get(tc.version, tc.commit, tc.read).String(); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	if got := get("", "", func() (*debug.BuildInfo, bool) { return nil, false }); got.Version != "v0.0.0-dev" || got.Commit != "unknown" || got.GoVersion == "" {
		t.Fatalf("without build information: %+v", got)
	}
}
