package coord

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNoSpaceAlarm is etcd's NOSPACE alarm: its database reached
// --quota-backend-bytes and it refuses every write (and every new lease)
// until it is compacted, defragmented and the alarm disarmed. Writes made
// through a Keeper meanwhile fail with an error that wraps it, and Health
// returns it.
var ErrNoSpaceAlarm = errors.New("etcd: NOSPACE alarm")

// ErrCorruptAlarm is etcd's CORRUPT alarm: a member's data differs from
// the others'; etcd refuses writes until an operator acts.
var ErrCorruptAlarm = errors.New("etcd: CORRUPT alarm")

// healthError is a reason for Health with its own text, matching a
// sentinel with errors.Is.
type healthError struct {
	msg string
	err error
}

func (e healthError) Error() string { return e.msg }
func (e healthError) Unwrap() error { return e.err }

// errNoSession is Health's answer while there is no session.
var errNoSession error = healthError{"etcd: no session", ErrSessionLost}

// alarms remembers etcd's active alarms as the Keeper last saw them.
type alarms struct {
	mu     sync.Mutex
	active []error // ErrNoSpaceAlarm, ErrCorruptAlarm, in that order
	logged time.Time
	// raised is when a write's error last showed the NOSPACE alarm.
	raised time.Time
}

// err is the first active alarm, nil when none is.
func (a *alarms) err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.active) == 0 {
		return nil
	}
	return a.active[0]
}

// set records the active alarms and logs a change: an error when one is
// raised (and again every minute while it lasts), info when they clear.
func (a *alarms) set(k *Keeper, active []error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	was := a.active
	a.active = active
	switch {
	case len(active) > 0 && (!sameErrors(was, active) || time.Since(a.logged) >= time.Minute):
		a.logged = time.Now()
		for _, e := range active {
			k.o.Logger.Error(e.Error()+": etcd refuses every write, so this replica is NOT_SERVING and takes no step that needs one; "+
				"volplane-etcd-member compacts, defragments and disarms it when the space is reclaimable, else raise --quota-backend-bytes (docs/etcd.md)",
				"service", k.service, "member", k.id, "alarm", strings.TrimPrefix(strings.TrimSuffix(e.Error(), " alarm"), "etcd: "))
		}
	case len(active) == 0 && len(was) > 0:
		k.o.Logger.Info("etcd alarm cleared: writes go through again", "service", k.service, "member", k.id)
	}
}

// raise records alarm as active (seen in a write's error) without waiting
// for the next poll.
func (a *alarms) raise(k *Keeper, alarm error) {
	a.mu.Lock()
	active := append([]error(nil), a.active...)
	a.mu.Unlock()
	a.mu.Lock()
	a.raised = time.Now()
	a.mu.Unlock()
	for _, e := range active {
		if e == alarm {
			return
		}
	}
	active = append(active, alarm)
	sort.Slice(active, func(i, j int) bool { return active[i] == ErrNoSpaceAlarm && active[j] != ErrNoSpaceAlarm })
	a.set(k, active)
}

// unconfirmed is called when etcd could not be asked for its alarms: an
// alarm only a write's error showed is dropped once no write has shown it
// for ttl (a poll would have confirmed it), so that readiness does not
// stay down on an alarm nobody can see anymore.
func (a *alarms) unconfirmed(k *Keeper, ttl time.Duration) {
	a.mu.Lock()
	stale := len(a.active) > 0 && time.Since(a.raised) > ttl
	a.mu.Unlock()
	if stale {
		a.set(k, nil)
	}
}

func sameErrors(a, b []error) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// isNoSpace reports whether err is etcd's "database space exceeded".
func isNoSpace(err error) bool {
	return err != nil && (errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(err, rpctypes.ErrGRPCNoSpace))
}

// seen looks at the error of a write: etcd's "database space exceeded"
// marks the NOSPACE alarm active at once, and the error returned wraps
// ErrNoSpaceAlarm as well as etcd's own.
func (k *Keeper) seen(err error) error {
	if !isNoSpace(err) {
		return err
	}
	k.alarms.raise(k, ErrNoSpaceAlarm)
	return fmt.Errorf("%w: %w", ErrNoSpaceAlarm, err)
}

// watchAlarms asks etcd for its alarms every AlarmPeriod until ctx ends.
// While etcd does not answer, an alarm a write showed stands for two
// periods after the last write that showed it.
func (k *Keeper) watchAlarms(ctx context.Context, client *clientv3.Client) {
	t := time.NewTicker(k.o.AlarmPeriod)
	defer t.Stop()
	warned := false
	for {
		began := time.Now()
		actx, cancel := context.WithTimeout(ctx, k.o.AlarmPeriod+time.Second)
		active, err := readAlarms(actx, client)
		cancel()
		switch {
		case err == nil:
			k.recovered()
			k.alarms.set(k, active)
		case ctx.Err() != nil:
			return
		default:
			if errors.Is(err, rpctypes.ErrPermissionDenied) {
				k.recovered() // it answered
			} else {
				// A poll sent during an outage may time out after the
				// session reopened: that is not a new outage.
				k.outage.FailedAt(began, fmt.Errorf("ask etcd for its status: %w", err))
			}
			if !warned && errors.Is(err, rpctypes.ErrPermissionDenied) {
				warned = true
				k.o.Logger.Warn("cannot read etcd's alarms (etcd's Status needs an admin user): an alarm is seen only in the errors of writes",
					"service", k.service, "member", k.id, "error", err)
			}
			k.alarms.unconfirmed(k, 2*k.o.AlarmPeriod)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// recovered ends an etcd outage when etcd answered the alarm poll and a
// session is live (an outage shorter than the lease TTL); without one, it
// ends when a session opens again (Run), so that an etcd that answers
// Status but cannot grant a lease yet does not end it twice.
func (k *Keeper) recovered() {
	if k.Ready() {
		k.outage.Recovered()
	}
}

// readAlarms asks the first member that answers for the cluster's alarms,
// through Status (a local read; listing alarms would be a raft proposal).
func readAlarms(ctx context.Context, client *clientv3.Client) ([]error, error) {
	var err error
	for _, ep := range client.Endpoints() {
		var st *clientv3.StatusResponse
		if st, err = client.Status(ctx, ep); err != nil {
			continue
		}
		var active []error
		for _, a := range []struct {
			typ pb.AlarmType
			err error
		}{{pb.AlarmType_NOSPACE, ErrNoSpaceAlarm}, {pb.AlarmType_CORRUPT, ErrCorruptAlarm}} {
			for _, e := range st.Errors {
				if strings.Contains(e, "alarm:"+a.typ.String()) {
					active = append(active, a.err)
					break
				}
			}
		}
		return active, nil
	}
	return nil, err
}

// Health is nil when this replica can work with etcd: a live session and
// no etcd alarm. Otherwise it says why not, in the words readiness
// reports: ErrNoSpaceAlarm ("etcd: NOSPACE alarm"), ErrCorruptAlarm, or
// "etcd: no session" (matching ErrSessionLost).
func (k *Keeper) Health() error {
	if err := k.alarms.err(); err != nil {
		return err
	}
	if k.Current() == nil {
		return errNoSession
	}
	return nil
}
