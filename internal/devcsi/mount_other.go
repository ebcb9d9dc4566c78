//go:build !linux

package devcsi

import (
	"errors"
	"math"
)

var errNoMount = errors.New("bind mounts are only supported on Linux")

func bindMount(src, target string, readonly bool) error { return errNoMount }

func unmount(target string) error { return errNoMount }

func unmountAll(target string) error { return errNoMount }

func isMountPoint(path string) (bool, error) { return false, nil }

func freeBytes(dir string) (int64, error) { return 0, nil }

type fsStats struct {
	availBytes         int64
	inodes, freeInodes int64
}

// statFS knows nothing here: no limit from the file system.
func statFS(dir string) (fsStats, error) { return fsStats{availBytes: math.MaxInt64}, nil }
