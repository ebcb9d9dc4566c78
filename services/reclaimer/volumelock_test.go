package reclaimer

import (
	"testing"
	"time"
)

// TestVolumeLocks: one volume's lock excludes a second holder of the same
// volume and no other volume's, and is forgotten once nobody holds it.
func TestVolumeLocks(t *testing.T) {
	var l volumeLocks
	unlockA := l.lock("a")
	unlockB := l.lock("b") // another volume: does not wait
	got := make(chan struct{})
	go func() {
		unlock := l.lock("a")
		close(got)
		unlock()
	}()
	select {
	case <-got:
		t.Fatal("a second holder got volume a's lock while it was held")
	case <-time.After(50 * time.Millisecond):
	}
	unlockA()
	<-got
	unlockB()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.locks) != 0 {
		t.Fatalf("%d locks kept after every holder left", len(l.locks))
	}
}
