//go:build !unix

package devcsi

import "os"

// flock does nothing where there is no flock(2): one process per root
// directory.
func flock(f *os.File, exclusive, unlock bool) error { return nil }
