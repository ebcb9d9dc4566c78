// Package memstat measures the Go heap for the memory benchmarks of the
// services (what their caches hold per object).
package memstat

import "runtime"

// HeapInUse is the heap still allocated after two garbage collections:
// what the live objects hold.
func HeapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
