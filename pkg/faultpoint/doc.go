// Package faultpoint makes a service exit at a named step, as if it had
// been killed there, so tests can prove that a crash at that step leaves
// state the next owner finishes or undoes.
//
// A fault point is one line at the step:
//
//	faultpoint.Hit(faultpoint.ProvisionerAfterCreateVolume)
//
// It does nothing unless the process was started with the environment
// variable VOLPLANE_FAULTPOINT naming that point, e.g.
//
//	VOLPLANE_FAULTPOINT=provisioner/after-create-volume      # the first hit
//	VOLPLANE_FAULTPOINT=provisioner/after-create-volume:3    # the third hit
//
// (several points separated by commas). At the named hit the process
// writes one line to stderr and exits at once with ExitCode: deferred
// functions do not run, nothing is flushed or released, no lease is
// revoked and no journal record ended, as with SIGKILL. This is the one
// deliberate os.Exit below a main in volplane.
//
// The variable is read once, when the package is initialized; with it
// unset a Hit is a single nil check. A name in the variable that is not
// one of Points is reported on stderr at start (a typo would otherwise
// silently test nothing) and still honoured.
package faultpoint
