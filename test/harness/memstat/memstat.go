// Package memstat measures what the services' benchmarks hold and spend:
// the Go heap their caches keep per object, the process's CPU, and the
// objects they hold (BoundPair).
package memstat

import (
	"runtime"
	"syscall"
	"time"
)

// HeapInUse is the heap still allocated after two garbage collections:
// what the live objects hold.
func HeapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// CPUTime is the CPU the process has used so far, user and system.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
