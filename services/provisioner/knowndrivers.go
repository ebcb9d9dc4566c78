package provisioner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/volplane/volplane/pkg/coord"
)

// kindKnownDriver is the journal kind (pkg/coord, the provisioner's keys)
// of the discovered drivers' names: one record per driver ever
// discovered, so that a restarted provisioner lists it (not ready) before
// its sidecars are seen again, and a volume of it is never taken for
// another provisioner's.
const kindKnownDriver = "csidriver"

// knownDriver is the record of a discovered driver: when and in which pod
// one of its sidecars was last seen.
type knownDriver struct {
	LastSeen time.Time `json:"lastSeen"`
	Pod      string    `json:"pod"`
}

// knownDrivers keeps the discovered drivers' names in etcd. A write that
// fails is logged and made again at the next check of a registration of
// the driver (every renewal); a driver seen is written again at most once
// a minute, so "last seen" is that precise.
type knownDrivers struct {
	log    *slog.Logger
	j      journal // nil: nothing is kept (tests)
	member string

	mu      sync.Mutex
	written map[string]knownDriver
}

func newKnownDrivers(log *slog.Logger, j journal, member string) *knownDrivers {
	return &knownDrivers{log: log, j: j, member: member, written: map[string]knownDriver{}}
}

// load adds to reg, not ready, every driver etcd remembers.
func (k *knownDrivers) load(ctx context.Context, reg *registry) error {
	if k.j == nil {
		return nil
	}
	recs, err := k.j.List(ctx, kindKnownDriver)
	if err != nil {
		return fmt.Errorf("list the discovered CSI drivers in etcd: %w", err)
	}
	for _, rec := range recs {
		var v knownDriver
		if err := json.Unmarshal(rec.Value, &v); err != nil {
			k.log.Warn("discovered CSI driver record does not decode; listing the driver anyway", "driver", rec.Name, "error", err)
		}
		d, _ := reg.sidecarDriver(rec.Name)
		d.sidecars.seen(v.LastSeen, v.Pod)
		d.state.Store(missingState(d.sidecars))
		k.mu.Lock()
		k.written[rec.Name] = v
		k.mu.Unlock()
	}
	return nil
}

// remember writes that driver was seen at in pod, unless the record says
// so already to within a minute.
func (k *knownDrivers) remember(ctx context.Context, driver string, at time.Time, pod string) {
	if k.j == nil {
		return
	}
	k.mu.Lock()
	old, ok := k.written[driver]
	k.mu.Unlock()
	if ok && old.Pod == pod && at.Sub(old.LastSeen) < time.Minute {
		return
	}
	v := knownDriver{LastSeen: at.UTC(), Pod: pod}
	if err := k.write(ctx, driver, v); err != nil {
		k.log.Warn("cannot record the discovered CSI driver in etcd; trying again at its next sighting", "driver", driver, "error", err)
		return
	}
	k.mu.Lock()
	k.written[driver] = v
	k.mu.Unlock()
}

// write puts the record of driver under its journal lock.
func (k *knownDrivers) write(ctx context.Context, driver string, v knownDriver) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := k.j.Acquire(ctx, kindKnownDriver, driver, k.member); err != nil {
		if errors.Is(err, coord.ErrReserved) {
			return nil // another replica writes it now
		}
		return err
	}
	defer func() {
		if err := k.j.Unlock(context.WithoutCancel(ctx), kindKnownDriver, driver, k.member); err != nil {
			k.log.Warn("unlock discovered CSI driver record", "driver", driver, "error", err)
		}
	}()
	return k.j.Put(ctx, kindKnownDriver, driver, k.member, b)
}
