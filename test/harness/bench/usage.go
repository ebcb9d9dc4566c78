package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// proc names a process whose CPU time and peak memory a run reports.
type proc struct {
	name  string
	pid   func() int // 0 when it does not run
	binds bool       // a process of what binds (not the control plane, the driver or the bench)
}

// procStat is what /proc says of a process at one moment.
type procStat struct {
	peakRSS int64         // VmHWM, bytes
	cpu     time.Duration // user+system time since it started
}

// ProcUsage is one process's cost in a run.
type ProcUsage struct {
	Name    string
	Binds   bool  // a process of what binds (volplane's services, kube-controller-manager, csi-provisioner)
	PeakRSS int64 // bytes, over the process's life
	// CPU is user+system time over the process's life; Measured only
	// over the measured phase (first claim created to the last request
	// of the last bind).
	CPU, Measured time.Duration
}

// readProc reads pid's peak RSS and CPU time from /proc.
func readProc(pid int) (procStat, error) {
	var s procStat
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	return parseProc(string(status), string(stat))
}

// parseProc reads VmHWM from a /proc/<pid>/status and utime+stime from a
// /proc/<pid>/stat.
func parseProc(status, stat string) (procStat, error) {
	var s procStat
	for _, line := range strings.Split(status, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return s, fmt.Errorf("VmHWM %q: %w", f[1], err)
			}
			s.peakRSS = kb << 10
		}
	}
	// The command name may hold spaces and parentheses: fields count from
	// the last ')'.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return s, fmt.Errorf("malformed stat %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return s, fmt.Errorf("malformed stat %q", stat)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return s, fmt.Errorf("malformed stat times %q %q", f[11], f[12])
	}
	s.cpu = time.Duration(ut+st) * time.Second / 100 // USER_HZ is 100 on Linux
	return s, nil
}

// sample reads every process once; one that does not run is left out.
func sample(procs []proc) map[string]procStat {
	out := make(map[string]procStat, len(procs))
	for _, p := range procs {
		if pid := p.pid(); pid > 0 {
			if s, err := readProc(pid); err == nil {
				out[p.name] = s
			}
		}
	}
	return out
}

// usage is each process's cost at the end of a measured phase that
// started at before.
func usage(procs []proc, before, after map[string]procStat) []ProcUsage {
	var out []ProcUsage
	for _, p := range procs {
		a, ok := after[p.name]
		if !ok {
			continue
		}
		out = append(out, ProcUsage{Name: p.name, Binds: p.binds, PeakRSS: a.peakRSS, CPU: a.cpu, Measured: a.cpu - before[p.name].cpu})
	}
	return out
}

// settle waits until procs together use less than a fifth of a core for
// two seconds in a row (the services have digested what was created
// before them), at most limit; it returns how long that took and whether
// they settled.
func settle(ctx context.Context, procs []proc, limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	total := func() time.Duration {
		var sum time.Duration
		for _, s := range sample(procs) {
			sum += s.cpu
		}
		return sum
	}
	last, quiet := total(), 0
	for time.Since(start) < limit {
		select {
		case <-ctx.Done():
			return time.Since(start), false
		case <-time.After(time.Second):
		}
		now := total()
		if now-last < 200*time.Millisecond {
			quiet++
		} else {
			quiet = 0
		}
		last = now
		if quiet >= 2 {
			return time.Since(start), true
		}
	}
	return time.Since(start), false
}
