package devenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CPUSet is the CPUs a child process is confined to; empty means any CPU
// (no confinement).
type CPUSet []int

// String writes s as a cpuset list ("0", "1-3", "0,2").
func (s CPUSet) String() string {
	if len(s) == 0 {
		return "any"
	}
	c := slices.Sorted(slices.Values(s))
	var parts []string
	for i := 0; i < len(c); {
		j := i
		for j+1 < len(c) && c[j+1] == c[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", c[i], c[j]))
		} else {
			parts = append(parts, strconv.Itoa(c[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func (s CPUSet) mask() (*unix.CPUSet, error) {
	var m unix.CPUSet
	for _, c := range s {
		if c < 0 || c >= 1024 {
			return nil, fmt.Errorf("cpu %d out of range", c)
		}
		m.Set(c)
	}
	return &m, nil
}

// AvailableCPUs is the CPUs this process may run on.
func AvailableCPUs() (CPUSet, error) {
	var m unix.CPUSet
	if err := unix.SchedGetaffinity(0, &m); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var s CPUSet
	for c := range 1024 {
		if m.IsSet(c) {
			s = append(s, c)
		}
	}
	return s, nil
}

// startOn starts cmd confined to cpus and waits for it in the background,
// calling exited once it has. With cpus, the fork happens on an OS thread
// of its own whose affinity is cpus: the child inherits it, and every
// thread the child makes inherits it in turn, so no thread of the child
// ever runs elsewhere (setting the affinity of a running process's
// threads races with the threads it is making). The thread stays locked
// until the child exits: Pdeathsig follows the thread that forked, so it
// must outlive the child, and a thread with a changed affinity must not go
// back to the Go scheduler.
func startOn(cpus CPUSet, cmd *exec.Cmd, exited func()) error {
	if len(cpus) == 0 {
		if err := cmd.Start(); err != nil {
			return err
		}
		go func() { _ = cmd.Wait(); exited() }()
		return nil
	}
	mask, err := cpus.mask()
	if err != nil {
		return err
	}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := unix.SchedSetaffinity(0, mask); err != nil {
			started <- fmt.Errorf("sched_setaffinity %s: %w", cpus, err)
			return
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		exited()
	}()
	return <-started
}

// PinSelf confines every thread of this process to cpus: the threads it
// has now and, since a new thread inherits its maker's affinity, every
// thread it makes later. It repeats until a pass over /proc/self/task
// finds no thread left to move.
func PinSelf(cpus CPUSet) error {
	if len(cpus) == 0 {
		return nil
	}
	mask, err := cpus.mask()
	if err != nil {
		return err
	}
	for range 100 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		moved := 0
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			var cur unix.CPUSet
			if err := unix.SchedGetaffinity(tid, &cur); err != nil {
				continue // the thread has exited
			}
			if cur == *mask {
				continue
			}
			if err := unix.SchedSetaffinity(tid, mask); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("sched_setaffinity thread %d to %s: %w", tid, cpus, err)
			}
			moved++
		}
		if moved == 0 {
			return nil
		}
	}
	return fmt.Errorf("threads kept appearing with another affinity than %s", cpus)
}

// ParseCPUSet reads a cpuset list such as "0", "1-3" or "0,2-3".
func ParseCPUSet(s string) (CPUSet, error) {
	var out CPUSet
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b < a || b >= 1024 {
			return nil, fmt.Errorf("cpu list %q: %q is not a CPU number or range (e.g. 0 or 1-3)", s, part)
		}
		for c := a; c <= b; c++ {
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("cpu list %q names no CPU", s)
	}
	return out, nil
}

// Set reads a cpuset list (a command-line flag's value).
func (s *CPUSet) Set(v string) error {
	c, err := ParseCPUSet(v)
	if err != nil {
		return err
	}
	*s = c
	return nil
}

// Type is the flag's type in --help.
func (s *CPUSet) Type() string { return "cpus" }
