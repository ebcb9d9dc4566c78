package binder

import (
	"context"
	"sync"
	"time"

	"github.com/volplane/volplane/pkg/coord"
)

// reserveBatcher takes etcd reservations for the workers, several in one
// transaction (group commit): a worker's reservation goes at once when no
// transaction is in flight; those asked for while one is in flight go
// together in the next, up to coord.MaxReserveBatch. A burst of binds so
// costs etcd one reservation transaction per batch instead of one per
// bind, and a lone bind waits for nothing but its own transaction. Each
// reservation is still taken or refused on its own, before its bind
// writes anything to the API.
type reserveBatcher struct {
	// reserveAll is reservations.ReserveAll.
	reserveAll func(ctx context.Context, rs []coord.Reservation) ([]error, error)
	// release gives back a reservation taken for a worker that stopped
	// waiting for it.
	release func(coord.Reservation)

	mu      sync.Mutex
	pending []*reserveRequest
	busy    bool // a drain goroutine is committing
}

type reserveRequest struct {
	r    coord.Reservation
	done chan error // buffered: the drain never blocks on a caller
}

// reserveTimeout bounds one reservation transaction.
const reserveTimeout = 10 * time.Second

// reserve takes r.Resource for r.Holder as coord.Coordinator.Reserve does.
func (b *reserveBatcher) reserve(ctx context.Context, r coord.Reservation) error {
	req := &reserveRequest{r: r, done: make(chan error, 1)}
	b.mu.Lock()
	b.pending = append(b.pending, req)
	if !b.busy {
		b.busy = true
		go b.drain()
	}
	b.mu.Unlock()
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		// The transaction may still take it: give it back if so.
		go func() {
			if err := <-req.done; err == nil {
				b.release(r)
			}
		}()
		return ctx.Err()
	}
}

// drain commits what is pending, batch after batch, until nothing is.
func (b *reserveBatcher) drain() {
	for {
		b.mu.Lock()
		batch := b.next()
		if len(batch) == 0 {
			b.busy = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.commit(batch)
	}
}

// next takes up to coord.MaxReserveBatch pending requests of distinct
// resources (etcd refuses a key twice in one transaction; a repeated one
// waits for the next batch). Called with mu held.
func (b *reserveBatcher) next() []*reserveRequest {
	if len(b.pending) == 0 {
		return nil
	}
	batch := make([]*reserveRequest, 0, min(len(b.pending), coord.MaxReserveBatch))
	seen := make(map[string]bool, cap(batch))
	rest := b.pending[:0]
	for _, req := range b.pending {
		if len(batch) == coord.MaxReserveBatch || seen[req.r.Resource] {
			rest = append(rest, req)
			continue
		}
		seen[req.r.Resource] = true
		batch = append(batch, req)
	}
	clear(b.pending[len(rest):])
	b.pending = rest
	return batch
}

func (b *reserveBatcher) commit(batch []*reserveRequest) {
	ctx, cancel := context.WithTimeout(context.Background(), reserveTimeout)
	defer cancel()
	rs := make([]coord.Reservation, len(batch))
	for i, req := range batch {
		rs[i] = req.r
	}
	errs, err := b.reserveAll(ctx, rs)
	for i, req := range batch {
		if err != nil {
			req.done <- err
		} else {
			req.done <- errs[i]
		}
	}
}
