// Package served is the one client of volplane's provisioner's served
// drivers, for the services that must know whether a volume or a claim
// is volplane's to provision or delete (the binder, the reclaimer).
//
// A Cache answers from the provisioner's last ListDrivers. No lock is held
// across the RPC: concurrent refreshes share one call (singleflight), and
// a caller that does not need a fresh answer gets the cached one while a
// refresh runs in the background.
package served

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc"

	"github.com/volplane/volplane/pkg/paging"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// Lister is the part of the provisioner's API the cache calls.
type Lister interface {
	ListDrivers(ctx context.Context, in *provisionerv1.ListDriversRequest, opts ...grpc.CallOption) (*provisionerv1.ListDriversResponse, error)
}

var _ Lister = provisionerv1.ProvisionerServiceClient(nil)

// Defaults of Options.
const (
	// DefaultTimeout bounds one refresh (every page of ListDrivers).
	DefaultTimeout = 5 * time.Second
	// DefaultRetry is the least time between two ListDrivers calls made
	// for a name missing from the list, or while the provisioner fails.
	DefaultRetry = 2 * time.Second
)

// Set is what the provisioner serves, as of its last answer.
type Set struct {
	// Known is false while the provisioner has not answered once: then
	// no volume or claim can be judged volplane's or another's.
	Known bool
	// Err says why the set is not known.
	Err error
	// Drivers are the CSI driver names (Driver.driver_name).
	Drivers map[string]bool
	// Provisioners are the StorageClass provisioner names
	// (Driver.provisioner_name), as in pv.kubernetes.io/provisioned-by.
	Provisioners map[string]bool
	// Unidentified are the endpoints the provisioner lists without a CSI
	// driver name: not probed yet, or unreachable at the last probe (a
	// driver restarting). Any of them may serve a name missing from
	// Drivers and Provisioners, so while there are any, a missing name
	// does not prove that volplane does not serve it.
	Unidentified []string
}

// Has reports whether name is a served driver or provisioner name.
func (s Set) Has(name string) bool { return s.Drivers[name] || s.Provisioners[name] }

// Options configures a Cache.
type Options struct {
	// Period is how long an answer is trusted; an older one is refreshed
	// in the background (the caller gets it meanwhile).
	Period time.Duration
	// WaitForMissing makes Get wait for a fresh answer when it is asked
	// about a name the cached list lacks (a driver just added), instead of
	// answering from the cache and refreshing in the background.
	WaitForMissing bool
	// Timeout bounds one refresh; 0 means DefaultTimeout.
	Timeout time.Duration
	// Retry is the least time between two calls made because of a missing
	// name or a failure; 0 means DefaultRetry.
	Retry time.Duration
}

// Cache is the provisioner's served drivers, shared by a service's
// workers. Its zero value is not usable: call New.
type Cache struct {
	l   Lister // nil: nothing is served
	o   Options
	log *slog.Logger
	now func() time.Time

	group singleflight.Group

	mu      sync.Mutex
	cur     Set
	fetched time.Time // of cur
	tried   time.Time // start of the last ListDrivers call
}

// New returns the cache of l's drivers. l nil means no provisioner is
// configured: the set is known and empty.
func New(l Lister, o Options, log *slog.Logger) *Cache {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Retry <= 0 {
		o.Retry = DefaultRetry
	}
	c := &Cache{l: l, o: o, log: log, now: time.Now}
	if l == nil {
		c.cur = Set{Known: true}
	} else {
		c.cur = Set{Err: errors.New("the provisioner has not answered ListDrivers yet")}
	}
	return c
}

// Get returns the served set. Until the provisioner has answered once the
// caller waits for an answer (at most Timeout, shared with every other
// caller waiting). After that it answers from the cache, refreshing in
// the background when the answer is older than Period; with
// WaitForMissing, a name in names the list lacks makes it wait for a
// fresh answer (at most once per Retry).
func (c *Cache) Get(ctx context.Context, names ...string) Set {
	if c.l == nil {
		return c.cur
	}
	c.mu.Lock()
	cur, now := c.cur, c.now()
	missing := false
	for _, n := range names {
		if n != "" && !cur.Has(n) {
			missing = true
		}
	}
	throttled := now.Sub(c.tried) < c.o.Retry
	background := cur.Known && !(missing && c.o.WaitForMissing) && now.Sub(c.fetched) >= c.o.Period && !throttled
	if background {
		// One background refresh per Retry, however many readers.
		c.tried = now
	}
	c.mu.Unlock()
	switch {
	case background:
		go c.refresh(context.WithoutCancel(ctx), time.Time{})
	case !cur.Known || (missing && c.o.WaitForMissing && !throttled):
		return c.refresh(ctx, now)
	}
	return cur
}

// Refresh asks the provisioner now and returns the new set (the cached one
// when the call fails). Concurrent calls share one ListDrivers.
func (c *Cache) Refresh(ctx context.Context) Set { return c.refresh(ctx, time.Time{}) }

// refresh shares one ListDrivers among concurrent callers. An answer
// fetched at or after since is good enough: a caller that read the cache
// just before the call in flight ended takes that answer instead of
// starting another call (a zero since always calls).
func (c *Cache) refresh(ctx context.Context, since time.Time) Set {
	ch := c.group.DoChan("", func() (any, error) {
		c.mu.Lock()
		if !since.IsZero() && c.cur.Known && c.cur.Err == nil && !c.fetched.Before(since) {
			defer c.mu.Unlock()
			return c.cur, nil
		}
		c.tried = c.now()
		c.mu.Unlock()
		// The call is shared: it must not end with the first caller's
		// context, only with its own timeout.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.o.Timeout)
		defer cancel()
		s, err := list(cctx, c.l)
		c.mu.Lock()
		defer c.mu.Unlock()
		if err != nil {
			c.log.Warn("cannot read the provisioner's drivers", "error", err)
			if !c.cur.Known {
				c.cur.Err = err
			}
			return c.cur, nil
		}
		c.cur, c.fetched = s, c.now()
		return s, nil
	})
	select {
	case r := <-ch:
		return r.Val.(Set)
	case <-ctx.Done():
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.cur
	}
}

// list reads every page of the provisioner's drivers.
func list(ctx context.Context, l Lister) (Set, error) {
	s := Set{Known: true, Drivers: map[string]bool{}, Provisioners: map[string]bool{}}
	req := &provisionerv1.ListDriversRequest{PageSize: paging.MaxSize}
	for {
		resp, err := l.ListDrivers(ctx, req)
		if err != nil {
			return Set{}, err
		}
		for _, d := range resp.GetDrivers() {
			if d.GetDriverName() != "" {
				s.Drivers[d.GetDriverName()] = true
			} else {
				s.Unidentified = append(s.Unidentified, d.GetEndpoint())
			}
			if d.GetProvisionerName() != "" {
				s.Provisioners[d.GetProvisionerName()] = true
			}
		}
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			return s, nil
		}
	}
}
