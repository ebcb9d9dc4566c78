package reclaimer

import "sync"

// volumeLocks serializes what changes one volume's held reclaim (its
// journal writes and its entry) while the reclaims of other volumes go on
// at once: a journal write is an etcd round trip, and one lock for every
// volume would make the workers wait for each other's.
type volumeLocks struct {
	mu    sync.Mutex
	locks map[string]*volumeLock
}

type volumeLock struct {
	sync.Mutex
	refs int // holders and waiters; the lock is forgotten at 0
}

// lock locks the volume's lock and returns its unlock.
func (l *volumeLocks) lock(name string) (unlock func()) {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[string]*volumeLock{}
	}
	v := l.locks[name]
	if v == nil {
		v = &volumeLock{}
		l.locks[name] = v
	}
	v.refs++
	l.mu.Unlock()
	v.Lock()
	return func() {
		v.Unlock()
		l.mu.Lock()
		if v.refs--; v.refs == 0 {
			delete(l.locks, name)
		}
		l.mu.Unlock()
	}
}
