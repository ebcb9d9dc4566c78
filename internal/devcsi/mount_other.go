//go:build !linux

package devcsi

import "errors"

var errNoMount = errors.New("bind mounts are only supported on Linux")

func bindMount(src, target string, readonly bool) error { return errNoMount }

func unmount(target string) error { return errNoMount }

func isMountPoint(path string) (bool, error) { return false, nil }

func freeBytes(dir string) (int64, error) { return 0, nil }
