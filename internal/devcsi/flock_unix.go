//go:build unix

package devcsi

import (
	"errors"
	"os"
	"syscall"
)

// flock takes (exclusive or shared) or, with unlock, drops the advisory
// lock of f, waiting for it. The lock belongs to the open file: another
// process (or another Driver of this one) with its own descriptor of the
// same file waits for it, also from another container sharing the
// directory through a hostPath.
func flock(f *os.File, exclusive, unlock bool) error {
	how := syscall.LOCK_SH
	switch {
	case unlock:
		how = syscall.LOCK_UN
	case exclusive:
		how = syscall.LOCK_EX
	}
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
