// Package version says which build of volplane is running: the release
// version and the commit it was built from, set at link time by the
// Makefile (-ldflags "-X github.com/volplane/volplane/pkg/version.Version=v0.1.0
// -X github.com/volplane/volplane/pkg/version.Commit=abc1234"), else read
// from the Go toolchain's build information. Every binary prints it for
// --version and in its startup log line; metrics can export it as
// volplane_build_info.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release version, e.g. "v0.1.0"; set by -ldflags -X.
// Empty: the main module's version from the build information, or
// "v0.0.0-dev" for a build from a work tree.
var Version string

// Commit is the commit the binary was built from (short hash, "-dirty"
// when the work tree had changes); set by -ldflags -X. Empty: the VCS
// information go build records, or "unknown".
var Commit string

// Info is a build's identity.
type Info struct {
	// Version is the release version, e.g. "v0.1.0".
	Version string
	// Commit is the commit hash, "unknown" when nothing recorded it.
	Commit string
	// GoVersion is the Go toolchain that built the binary, e.g. "go1.26.0".
	GoVersion string
}

// Get returns the running binary's Info.
func Get() Info {
	return get(Version, Commit, debug.ReadBuildInfo)
}

func get(v, c string, read func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: v, Commit: c, GoVersion: runtime.Version()}
	bi, ok := read()
	if ok && bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	if info.Version == "" {
		info.Version = "v0.0.0-dev"
		if ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
	}
	if info.Commit == "" {
		info.Commit = "unknown"
		if ok {
			var rev string
			var dirty bool
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					dirty = s.Value == "true"
				}
			}
			if rev != "" {
				if len(rev) > 12 {
					rev = rev[:12]
				}
				if dirty {
					rev += "-dirty"
				}
				info.Commit = rev
			}
		}
	}
	return info
}

// String is how --version prints it after the command's name:
// "v0.1.0 (commit abc1234, go1.26.0)".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s)", i.Version, i.Commit, i.GoVersion)
}
