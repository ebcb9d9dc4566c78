package devcsi

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// bindMount mounts the directory src at target (an existing directory),
// read-only if asked: a bind mount, then a read-only remount of it (the
// kernel ignores MS_RDONLY on the first call). The remount keeps the
// flags the bind mount got from src's mount (nosuid, nodev, noexec, atime
// flags), which the kernel requires where they are locked (in a user
// namespace) and which should not be lost anywhere.
func bindMount(src, target string, readonly bool) error {
	if err := syscall.Mount(src, target, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s at %s: %w", src, target, err)
	}
	if readonly {
		var st syscall.Statfs_t
		err := syscall.Statfs(target, &st)
		if err == nil {
			err = syscall.Mount("", target, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY|keptFlags(st.Flags), "")
		}
		if err != nil {
			_ = syscall.Unmount(target, 0)
			return fmt.Errorf("remount %s read-only: %w", target, err)
		}
	}
	return nil
}

// keptFlags are the mount flags of statfs(2)'s f_flags that a bind
// remount must repeat.
func keptFlags(f int64) uintptr {
	var out uintptr
	for _, m := range []struct {
		st    int64
		mount uintptr
	}{
		{stNoSUID, syscall.MS_NOSUID}, {stNoDev, syscall.MS_NODEV}, {stNoExec, syscall.MS_NOEXEC},
		{stNoAtime, syscall.MS_NOATIME}, {stNoDirAtime, syscall.MS_NODIRATIME}, {stRelAtime, syscall.MS_RELATIME},
	} {
		if f&m.st != 0 {
			out |= m.mount
		}
	}
	return out
}

// statfs(2) f_flags (<sys/statvfs.h>), which package syscall lacks.
const (
	stNoSUID     = 0x2
	stNoDev      = 0x4
	stNoExec     = 0x8
	stNoAtime    = 0x400
	stNoDirAtime = 0x800
	stRelAtime   = 0x1000
)

// unmount unmounts target; a target that is not a mount point (EINVAL) or
// not there is fine: the caller wants nothing mounted there.
func unmount(target string) error {
	err := syscall.Unmount(target, 0)
	if err == nil || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmount %s: %w", target, err)
}

// unmountAll unmounts target until it is no mount point (a retried mount
// may have stacked two).
func unmountAll(target string) error {
	for range 8 {
		mounted, err := isMountPoint(target)
		if err != nil || !mounted {
			return err
		}
		if err := unmount(target); err != nil {
			return err
		}
	}
	return fmt.Errorf("unmount %s: still a mount point after 8 unmounts", target)
}

// isMountPoint reports whether path is a mount point, from
// /proc/self/mountinfo (a bind mount of a directory on the same file
// system has the same device number as its parent, so stat cannot tell).
func isMountPoint(path string) (bool, error) {
	path, err := filepath.Abs(path)
	if err != nil {
		return false, err
	}
	if p, err := filepath.EvalSymlinks(path); err == nil {
		path = p
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ...
		fields := strings.Fields(sc.Text())
		if len(fields) >= 5 && unescapeMountinfo(fields[4]) == path {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of a
// mountinfo path.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// freeBytes is the space unprivileged users may still use on dir's file
// system.
func freeBytes(dir string) (int64, error) {
	fs, err := statFS(dir)
	return fs.availBytes, err
}

// fsStats is what statfs(2) says of a file system.
type fsStats struct {
	availBytes         int64
	inodes, freeInodes int64
}

func statFS(dir string) (fsStats, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fsStats{}, err
	}
	return fsStats{availBytes: int64(st.Bavail) * int64(st.Bsize), inodes: int64(st.Files), freeInodes: int64(st.Ffree)}, nil
}
