package logging

import (
	"log/slog"
	"sync"
	"time"
)

// Outage reports the outage of something a service depends on (the API
// server, etcd, a watcher stream, a CSI driver) as an operator wants to
// read it: one warning when it starts ("etcd unreachable", with the
// error), one info line when it ends ("etcd reachable again", with how
// long it lasted and how many attempts failed), and the failed retries in
// between at Debug only. It is safe for concurrent use; the zero value is
// not usable, call NewOutage.
type Outage struct {
	log  *slog.Logger
	what string
	now  func() time.Time

	mu       sync.Mutex
	since    time.Time // when the outage began; zero while reachable
	failures int
	upAt     time.Time // when the last outage ended
}

// NewOutage returns an Outage of what (e.g. "API server", "etcd"), logged
// to log with the attributes attrs on each of its lines.
func NewOutage(log *slog.Logger, what string, attrs ...any) *Outage {
	if log == nil {
		log = slog.Default()
	}
	return &Outage{log: log.With(attrs...), what: what, now: time.Now}
}

// Failed records a failed attempt to reach it, with its error and
// attributes: the first after a success starts the outage (Warn
// "<what> unreachable"), later ones are logged at Debug. It reports
// whether this failure started the outage.
func (o *Outage) Failed(err error, attrs ...any) bool {
	return o.FailedAt(time.Time{}, err, attrs...)
}

// FailedAt is Failed for an attempt that began at began: one that began
// before the last recovery is stale (a probe sent during the outage that
// timed out after another attempt succeeded) and is logged at Debug only,
// starting no outage. A zero began is never stale.
func (o *Outage) FailedAt(began time.Time, err error, attrs ...any) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !began.IsZero() && o.since.IsZero() && began.Before(o.upAt) {
		o.log.Debug(o.what+" attempt from before it was reachable again failed", append([]any{ErrorKey, err}, attrs...)...)
		return false
	}
	o.failures++
	args := append([]any{ErrorKey, err}, attrs...)
	if !o.since.IsZero() {
		o.log.Debug(o.what+" still unreachable", append(args, "for", o.now().Sub(o.since).Round(time.Millisecond))...)
		return false
	}
	o.since = o.now()
	o.log.Warn(o.what+" unreachable", args...)
	return true
}

// Recovered records a successful attempt: if it ends an outage, Info
// "<what> reachable again" with its duration ("after") and the number of
// failed attempts ("failures"). It reports whether it ended one.
func (o *Outage) Recovered(attrs ...any) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		return false
	}
	d := o.now().Sub(o.since).Round(time.Millisecond)
	o.log.Info(o.what+" reachable again", append([]any{"after", d, "failures", o.failures}, attrs...)...)
	o.since, o.failures, o.upAt = time.Time{}, 0, o.now()
	return true
}

// Down reports whether an outage is going on, and since when.
func (o *Outage) Down() (bool, time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.since.IsZero(), o.since
}
