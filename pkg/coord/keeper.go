package coord

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/volplane/volplane/pkg/logging"
)

// Keeper keeps a replica in etcd through outages: it opens a session
// (retrying while etcd is unreachable), registers the replica as a member
// of its service, and, whenever the session is lost (etcd was down for
// longer than the lease TTL, or the lease was revoked), opens a new one and
// registers again. A replica built on a Keeper never has to stop because
// of etcd: while there is no session, every fenced write fails with
// ErrSessionLost and Ready is false.
//
// Locks taken on a lost session are gone with its lease (another replica
// may have taken them since): writes fenced on the new session's lease
// fail with ErrNotOwner for them until they are acquired again, so an
// operation begun before the loss is never carried on without its lock.
//
// The journal and reservation methods delegate to the current session's
// Coordinator; Get, List, Members and Holder read etcd without one.
type Keeper struct {
	o                 Options
	service, id, addr string
	// base has the client but no session: for reads.
	base    atomic.Pointer[Coordinator]
	cur     atomic.Pointer[Coordinator]
	mu      sync.Mutex
	changed chan struct{}
	alarms  alarms
	// outage says once when etcd stops answering and once when a session
	// is open again, not once per retry.
	outage *logging.Outage
}

// NewKeeper checks o and returns a Keeper for member id of service,
// reachable at addr. Nothing is dialed before Run.
func NewKeeper(o Options, service, id, addr string) (*Keeper, error) {
	if len(o.Endpoints) == 0 {
		return nil, fmt.Errorf("coord: no etcd endpoints (--etcd-endpoints)")
	}
	if service == "" || id == "" || strings.Contains(id, "/") {
		return nil, fmt.Errorf("coord: invalid member %q of service %q", id, service)
	}
	if o.TTL != 0 && o.TTL < time.Second {
		return nil, fmt.Errorf("coord: lease TTL must be at least 1s, got %s", o.TTL)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.AlarmPeriod <= 0 {
		o.AlarmPeriod = DefaultAlarmPeriod
	}
	outage := logging.NewOutage(o.Logger, "etcd", "endpoints", strings.Join(o.Endpoints, ","), "service", service, "member", id)
	return &Keeper{o: o, service: service, id: id, addr: addr, changed: make(chan struct{}), outage: outage}, nil
}

// Run keeps the session until ctx ends, then revokes it (so the member and
// its locks go at once), closes the client and returns nil.
func (k *Keeper) Run(ctx context.Context) error {
	sessionGauge.WithLabelValues(k.service).Set(0) // until the first session
	var client *clientv3.Client
	retry := backoff{min: 200 * time.Millisecond, max: 5 * time.Second}
	for client == nil {
		c, err := newClient(ctx, &k.o)
		if err != nil {
			k.outage.Failed(fmt.Errorf("cannot make an etcd client: %w", err), "retry_in", retry.next())
			if !retry.wait(ctx) {
				return nil
			}
			continue
		}
		client = c
	}
	defer client.Close()
	alarmsDone := make(chan struct{})
	actx, stopAlarms := context.WithCancel(ctx)
	go func() {
		defer close(alarmsDone)
		k.watchAlarms(actx, client)
	}()
	defer func() {
		stopAlarms()
		<-alarmsDone
	}()
	k.base.Store(&Coordinator{client: client, prefix: strings.TrimSuffix(k.o.Prefix, "/"), log: k.o.Logger})
	retry.reset()
	for {
		co, err := k.open(ctx, client)
		if ctx.Err() != nil {
			if co != nil {
				k.revoke(co)
			}
			return nil
		}
		if err != nil {
			k.outage.Failed(fmt.Errorf("cannot open an etcd session: %w", err), "retry_in", retry.next())
			if !retry.wait(ctx) {
				return nil
			}
			continue
		}
		retry.reset()
		k.set(co)
		k.outage.Recovered()
		k.o.Logger.Info("etcd session open", "service", k.service, "member", k.id, "lease", fmt.Sprintf("%x", co.Lease()))
		select {
		case <-ctx.Done():
			k.set(nil)
			k.revoke(co)
			return nil
		case <-co.Done():
			k.set(nil)
			sessionsLost.WithLabelValues(k.service).Inc()
			co.session.Orphan()
			k.o.Logger.Warn("etcd session lost: no fenced step until a new one is open", "service", k.service, "member", k.id, "lease", fmt.Sprintf("%x", co.Lease()))
		}
	}
}

// open grants a lease (bounded by the dial timeout), keeps it alive and
// registers the member on it.
func (k *Keeper) open(ctx context.Context, client *clientv3.Client) (*Coordinator, error) {
	ttl := int64(k.o.TTL.Round(time.Second) / time.Second)
	gctx, cancel := context.WithTimeout(ctx, k.o.DialTimeout)
	defer cancel()
	lease, err := client.Grant(gctx, ttl)
	if err != nil {
		return nil, k.seen(fmt.Errorf("grant a lease: %w", err))
	}
	session, err := concurrency.NewSession(client, concurrency.WithLease(lease.ID), concurrency.WithTTL(int(ttl)), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, fmt.Errorf("keep the lease alive: %w", err)
	}
	co := &Coordinator{client: client, session: session, prefix: strings.TrimSuffix(k.o.Prefix, "/"), log: k.o.Logger}
	if err := co.Register(gctx, k.service, k.id, k.addr); err != nil {
		k.revoke(co)
		return nil, k.seen(err)
	}
	return co, nil
}

func (k *Keeper) revoke(co *Coordinator) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = co.client.Revoke(ctx, co.session.Lease())
	co.session.Orphan()
}

func (k *Keeper) set(co *Coordinator) {
	k.cur.Store(co)
	up := 0.0
	if co != nil {
		up = 1
	}
	sessionGauge.WithLabelValues(k.service).Set(up)
	k.mu.Lock()
	close(k.changed)
	k.changed = make(chan struct{})
	k.mu.Unlock()
}

// Current is the Coordinator of the live session, nil while there is none.
func (k *Keeper) Current() *Coordinator {
	co := k.cur.Load()
	if co == nil {
		return nil
	}
	select {
	case <-co.Done():
		return nil
	default:
		return co
	}
}

// Ready reports whether a session is live. It stays true under an etcd
// alarm (the session and what it holds are intact); Health says whether
// the replica can work.
func (k *Keeper) Ready() bool { return k.Current() != nil }

// Changed is closed at the next change of session (opened or lost).
func (k *Keeper) Changed() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.changed
}

func (k *Keeper) live() (*Coordinator, error) {
	if co := k.Current(); co != nil {
		return co, nil
	}
	return nil, ErrSessionLost
}

func (k *Keeper) reader() (*Coordinator, error) {
	if co := k.base.Load(); co != nil {
		return co, nil
	}
	return nil, fmt.Errorf("etcd at %s not reached yet", strings.Join(k.o.Endpoints, ","))
}

// onLive runs f on the current session, with the NOSPACE alarm told of
// its error; ErrSessionLost when there is none.
func onLive[T any](k *Keeper, f func(*Coordinator) (T, error)) (T, error) {
	co, err := k.live()
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := f(co)
	return v, k.seen(err)
}

// onReader runs f on the session-less client (reads, and releases that
// need no lease), with the NOSPACE alarm told of its error.
func onReader[T any](k *Keeper, f func(*Coordinator) (T, error)) (T, error) {
	co, err := k.reader()
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := f(co)
	return v, k.seen(err)
}

// none adapts a call that returns only an error to onLive and onReader.
func none(err error) (struct{}, error) { return struct{}{}, err }

// Reserve is Coordinator.Reserve on the current session.
func (k *Keeper) Reserve(ctx context.Context, resource, holder string) error {
	_, err := onLive(k, func(co *Coordinator) (struct{}, error) { return none(co.Reserve(ctx, resource, holder)) })
	return err
}

// ReserveAll is Coordinator.ReserveAll on the current session.
func (k *Keeper) ReserveAll(ctx context.Context, rs []Reservation) ([]error, error) {
	return onLive(k, func(co *Coordinator) ([]error, error) { return co.ReserveAll(ctx, rs) })
}

// Release is Coordinator.Release.
func (k *Keeper) Release(ctx context.Context, resource, holder string) error {
	_, err := onReader(k, func(co *Coordinator) (struct{}, error) { return none(co.Release(ctx, resource, holder)) })
	return err
}

// ReleaseAll is Coordinator.ReleaseAll.
func (k *Keeper) ReleaseAll(ctx context.Context, rs []Reservation) error {
	_, err := onReader(k, func(co *Coordinator) (struct{}, error) { return none(co.ReleaseAll(ctx, rs)) })
	return err
}

// Acquire is Coordinator.Acquire on the current session.
func (k *Keeper) Acquire(ctx context.Context, kind, name, holder string) error {
	_, err := onLive(k, func(co *Coordinator) (struct{}, error) { return none(co.Acquire(ctx, kind, name, holder)) })
	return err
}

// AcquireGet is Coordinator.AcquireGet on the current session.
func (k *Keeper) AcquireGet(ctx context.Context, kind, name, holder string) (Record, bool, error) {
	var ok bool
	r, err := onLive(k, func(co *Coordinator) (r Record, err error) {
		r, ok, err = co.AcquireGet(ctx, kind, name, holder)
		return r, err
	})
	return r, ok, err
}

// Unlock is Coordinator.Unlock.
func (k *Keeper) Unlock(ctx context.Context, kind, name, holder string) error {
	_, err := onReader(k, func(co *Coordinator) (struct{}, error) { return none(co.Unlock(ctx, kind, name, holder)) })
	return err
}

// Put is Coordinator.Put, fenced on the current session's lease.
func (k *Keeper) Put(ctx context.Context, kind, name, holder string, value []byte) error {
	_, err := onLive(k, func(co *Coordinator) (struct{}, error) { return none(co.Put(ctx, kind, name, holder, value)) })
	return err
}

// Finish is Coordinator.Finish, fenced on the current session's lease.
func (k *Keeper) Finish(ctx context.Context, kind, name, holder string) error {
	_, err := onLive(k, func(co *Coordinator) (struct{}, error) { return none(co.Finish(ctx, kind, name, holder)) })
	return err
}

// Get is Coordinator.Get.
func (k *Keeper) Get(ctx context.Context, kind, name string) (Record, bool, error) {
	var ok bool
	r, err := onReader(k, func(co *Coordinator) (r Record, err error) { r, ok, err = co.Get(ctx, kind, name); return r, err })
	return r, ok, err
}

// List is Coordinator.List.
func (k *Keeper) List(ctx context.Context, kind string) ([]Record, error) {
	return onReader(k, func(co *Coordinator) ([]Record, error) { return co.List(ctx, kind) })
}

// Members is Coordinator.Members.
func (k *Keeper) Members(ctx context.Context, service string) ([]Member, error) {
	return onReader(k, func(co *Coordinator) ([]Member, error) { return co.Members(ctx, service) })
}

// backoff is a doubling retry delay.
type backoff struct{ min, max, cur time.Duration }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	}
	return b.cur
}

func (b *backoff) reset() { b.cur = 0 }

// wait sleeps the current delay (false when ctx ended first) and doubles it.
func (b *backoff) wait(ctx context.Context) bool {
	d := b.next()
	b.cur = min(2*d, b.max)
	select {
	case <-time.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}
