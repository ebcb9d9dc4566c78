// Package version says which build of volplane is running: the release
// version and the commit, set at link time (-ldflags "-X
// github.com/volplane/volplane/pkg/version.Version=v0.1.0 -X
// github.com/volplane/volplane/pkg/version.Commit=abc1234").
package version

import "runtime"

// Version is the release version; set by -ldflags -X.
var Version = "dev"

// Commit is the commit the binary was built from; set by -ldflags -X.
var Commit = "unknown"

// Info is a build's identity.
type Info struct {
	// Version is the release version, e.g. "v0.1.0".
	Version string
	// Commit is the commit hash, "unknown" when nothing recorded it.
	Commit string
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string
}

// Get returns the running binary's Info.
func Get() Info { return Info{Version: Version, Commit: Commit, GoVersion: runtime.Version()} }
