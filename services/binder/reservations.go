package binder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/coord"
)

// etcdReservations is what the binder needs of etcd coordination.
type etcdReservations interface {
	ReserveAll(ctx context.Context, rs []coord.Reservation) ([]error, error)
	Release(ctx context.Context, resource, holder string) error
	ReleaseAll(ctx context.Context, rs []coord.Reservation) error
}

// reservations hold free volumes for the claims being bound to them, over
// their whole life (kube-controller-manager has one replica and needs
// none):
//
//   - a sync chooses a volume and holds it in this replica's memory in one
//     step (findAndReserve), against the replica's other workers;
//   - the bind holds it in etcd (reserve), against the other replicas, the
//     reservations of many binds in one transaction (reserveInEtcd);
//   - the bind gives it back (the release func of reserve): lingering
//     when the bind was written, since the API keeps everyone away from
//     then on, at once when it failed; the releases of many binds go in
//     one transaction (releaser);
//   - a volume another replica holds in etcd is skipped for
//     foreignReservationTTL, and an etcd reservation expires with the
//     session lease of the replica that took it.
type reservations struct {
	log *slog.Logger
	// memory is the cache whose index keeps this replica's holds
	// (store.reserved, store.foreign): a choice and its hold are one step
	// under the cache's lock.
	memory *store
	// etcd holds volumes against the other replicas; nil: this replica's
	// memory only.
	etcd etcdReservations

	// Reservations asked for while a transaction is in flight: the next
	// batch (reserveInEtcd).
	reserveMu sync.Mutex
	pending   []*reserveRequest
	busy      bool // a drain goroutine is committing

	// Reservations to release: the next batch (releaser).
	releases chan queuedRelease
	linger   time.Duration // releaseLinger; shorter in tests
	// unreleased: the reservations queued for release and not yet
	// released, resource → holder (see releaseQueued).
	releaseMu  sync.Mutex
	unreleased map[string]string
}

func newReservations(log *slog.Logger, memory *store) *reservations {
	return &reservations{
		log:        log,
		memory:     memory,
		releases:   make(chan queuedRelease, 4096),
		linger:     releaseLinger,
		unreleased: map[string]string{},
	}
}

// findAndReserve chooses the claim's volume among those not held for
// other claims and holds it for the claim in this replica's memory
// (store.findAndReserve); unreserve gives it back.
func (r *reservations) findAndReserve(claim *corev1.PersistentVolumeClaim, delay bool) (*corev1.PersistentVolume, error) {
	return r.memory.findAndReserve(claim, delay)
}

// unreserve drops the in-memory hold findAndReserve took (the sync's
// choice, syncView.choose); reserve adds the etcd reservation. A volume
// another replica holds in etcd makes the bind fail, and the claim is
// synced again with backoff.
func (r *reservations) unreserve(volume *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) {
	r.memory.unreserve(volume.Name, claim.UID)
}

// reserve takes a free volume for a claim: in memory against the other
// workers of this replica, then in etcd against the other replicas.
// release gives it back, after a while when the bind was written (the API
// then keeps everyone away), at once when it failed.
func (r *reservations) reserve(ctx context.Context, volume *corev1.PersistentVolume, claim *corev1.PersistentVolumeClaim) (release func(bound bool), err error) {
	if !r.memory.reserve(volume.Name, claim.UID) {
		return nil, fmt.Errorf("bind %s to %s: %w", claimKey(claim), volume.Name, errReserved)
	}
	if r.etcd == nil {
		return func(bool) { r.memory.unreserve(volume.Name, claim.UID) }, nil
	}
	held := coord.Reservation{Resource: "pv/" + volume.Name, Holder: string(claim.UID)}
	r.releaseQueued(ctx, held.Resource, held.Holder)
	if err := r.reserveInEtcd(ctx, held); err != nil {
		r.memory.unreserve(volume.Name, claim.UID)
		if errors.Is(err, coord.ErrReserved) {
			// Another replica is binding it: look elsewhere for a while.
			r.memory.markForeign(volume.Name, foreignReservationTTL)
			return nil, fmt.Errorf("bind %s to %s: %w (%w)", claimKey(claim), volume.Name, errReserved, err)
		}
		return nil, fmt.Errorf("bind %s to %s: %w: %w", claimKey(claim), volume.Name, errEtcd, err)
	}
	return func(bound bool) {
		r.memory.unreserve(volume.Name, claim.UID)
		if bound {
			r.releaseLater(held.Resource, held.Holder)
		} else {
			r.releaseSoon(held.Resource, held.Holder)
		}
	}, nil
}

// foreignReservationTTL is how long a volume another replica reserved is
// skipped: longer than a bind takes, short enough that a replica that gave
// up does not keep the volume from the others.
const foreignReservationTTL = 2 * time.Second

// errEtcd says a reservation could not be written to etcd.
var errEtcd = errors.New("etcd")

// reserveRequest is a reservation waiting for its transaction.
type reserveRequest struct {
	r    coord.Reservation
	done chan error // buffered: the drain never blocks on a caller
}

// reserveTimeout bounds one reservation transaction.
const reserveTimeout = 10 * time.Second

// reserveInEtcd takes held.Resource for held.Holder as
// coord.Coordinator.Reserve does, several reservations in one transaction
// (group commit): a reservation goes at once when no transaction is in
// flight; those asked for while one is in flight go together in the next,
// up to coord.MaxReserveBatch. A burst of binds so costs etcd one
// reservation transaction per batch instead of one per bind, and a lone
// bind waits for nothing but its own transaction. Each reservation is
// still taken or refused on its own, before its bind writes anything to
// the API.
func (r *reservations) reserveInEtcd(ctx context.Context, held coord.Reservation) error {
	req := &reserveRequest{r: held, done: make(chan error, 1)}
	r.reserveMu.Lock()
	r.pending = append(r.pending, req)
	if !r.busy {
		r.busy = true
		go r.drain()
	}
	r.reserveMu.Unlock()
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		// The transaction may still take it: give it back if so.
		go func() {
			if err := <-req.done; err == nil {
				r.releaseSoon(held.Resource, held.Holder)
			}
		}()
		return ctx.Err()
	}
}

// drain commits what is pending, batch after batch, until nothing is.
func (r *reservations) drain() {
	for {
		r.reserveMu.Lock()
		batch := r.next()
		if len(batch) == 0 {
			r.busy = false
			r.reserveMu.Unlock()
			return
		}
		r.reserveMu.Unlock()
		r.commit(batch)
	}
}

// next takes up to coord.MaxReserveBatch pending requests of distinct
// resources (etcd refuses a key twice in one transaction; a repeated one
// waits for the next batch). Called with reserveMu held.
func (r *reservations) next() []*reserveRequest {
	if len(r.pending) == 0 {
		return nil
	}
	batch := make([]*reserveRequest, 0, min(len(r.pending), coord.MaxReserveBatch))
	seen := make(map[string]bool, cap(batch))
	rest := r.pending[:0]
	for _, req := range r.pending {
		if len(batch) == coord.MaxReserveBatch || seen[req.r.Resource] {
			rest = append(rest, req)
			continue
		}
		seen[req.r.Resource] = true
		batch = append(batch, req)
	}
	clear(r.pending[len(rest):])
	r.pending = rest
	return batch
}

// commit reserves a batch in one transaction and answers each request.
func (r *reservations) commit(batch []*reserveRequest) {
	ctx, cancel := context.WithTimeout(context.Background(), reserveTimeout)
	defer cancel()
	rs := make([]coord.Reservation, len(batch))
	for i, req := range batch {
		rs[i] = req.r
	}
	errs, err := r.etcd.ReserveAll(ctx, rs)
	for i, req := range batch {
		if err != nil {
			req.done <- err
		} else {
			req.done <- errs[i]
		}
	}
}

// queuedRelease is a reservation to drop; soon: without waiting for more.
type queuedRelease struct {
	coord.Reservation
	soon bool
}

// releaseLinger is how long a release waits for others to share its etcd
// transaction. Nothing waits for it: the bind it guarded is written to the
// API, which keeps every replica away from the volume from then on.
const releaseLinger = 250 * time.Millisecond

// releaseLater drops the etcd reservation of a finished bind in the
// background, with the others of the next releaseLinger.
func (r *reservations) releaseLater(resource, holder string) {
	r.queueRelease(queuedRelease{Reservation: coord.Reservation{Resource: resource, Holder: holder}})
}

// releaseSoon drops the reservation of a bind that failed, without
// lingering: the volume is still free, and other claims may want it.
func (r *reservations) releaseSoon(resource, holder string) {
	r.queueRelease(queuedRelease{Reservation: coord.Reservation{Resource: resource, Holder: holder}, soon: true})
}

// queueRelease hands q to the releaser, or releases it now when the
// releaser is that far behind.
func (r *reservations) queueRelease(q queuedRelease) {
	r.releaseMu.Lock()
	r.unreleased[q.Resource] = q.Holder
	r.releaseMu.Unlock()
	select {
	case r.releases <- q:
	default:
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.release(ctx, q.Resource, q.Holder)
		r.released(q.Reservation)
	}
}

// releaser drops the reservations queued for release in batches: a batch
// goes when it is full (coord.MaxReleaseBatch), when its first has waited
// r.linger, or at once when one of them is to go soon. A burst of binds so
// costs one release transaction per batch, not one per bind.
func (r *reservations) releaser(ctx context.Context) {
	batch := make([]coord.Reservation, 0, coord.MaxReleaseBatch)
	timer := time.NewTimer(0)
	<-timer.C
	for {
		var soon bool
		select {
		case q := <-r.releases:
			batch, soon = append(batch[:0], q.Reservation), q.soon
		case <-ctx.Done():
			return
		}
		timer.Reset(r.linger)
	more:
		for !soon && len(batch) < coord.MaxReleaseBatch {
			select {
			case q := <-r.releases:
				batch, soon = append(batch, q.Reservation), q.soon
			case <-timer.C:
				break more
			case <-ctx.Done():
				return
			}
		}
		if !timer.Stop() {
			select { // drain a fired timer before the next Reset
			case <-timer.C:
			default:
			}
		}
		r.releaseBatch(ctx, batch)
	}
}

// releaseBatch releases a batch of the releaser in one transaction.
func (r *reservations) releaseBatch(ctx context.Context, batch []coord.Reservation) {
	if len(batch) == 1 {
		r.release(ctx, batch[0].Resource, batch[0].Holder)
	} else if err := r.etcd.ReleaseAll(ctx, batch); err != nil && ctx.Err() == nil {
		// The reservations live on the session lease: they go when
		// this replica does.
		r.log.Warn("release reservations", "count", len(batch), "error", err)
	}
	r.released(batch...)
}

// releaseQueued drops, at once, a reservation of resource queued for
// release by a holder other than holder, and reports whether there was
// one: a volume bound, released and recycled within a linger would
// otherwise be refused to its next claim by this replica's own lingering
// reservation.
func (r *reservations) releaseQueued(ctx context.Context, resource, holder string) bool {
	r.releaseMu.Lock()
	queued, ok := r.unreleased[resource]
	r.releaseMu.Unlock()
	if !ok || queued == holder {
		return false
	}
	r.release(ctx, resource, queued)
	r.released(coord.Reservation{Resource: resource, Holder: queued})
	return true
}

// released forgets reservations queued for release once they are.
func (r *reservations) released(rs ...coord.Reservation) {
	r.releaseMu.Lock()
	defer r.releaseMu.Unlock()
	for _, q := range rs {
		if r.unreleased[q.Resource] == q.Holder {
			delete(r.unreleased, q.Resource)
		}
	}
}

// release drops one reservation in etcd.
func (r *reservations) release(ctx context.Context, resource, holder string) {
	if err := r.etcd.Release(ctx, resource, holder); err != nil && ctx.Err() == nil {
		// The reservation lives on the session lease: it goes when this
		// replica does.
		r.log.Warn("release reservation", "resource", resource, "error", err)
	}
}
