package coord

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// When etcd cannot be asked for its alarms (an etcd user without the
// admin rights Status needs), an alarm only writes showed does not keep
// the replica NOT_SERVING forever: it stands while writes keep showing
// it, and goes two periods after the last one that did.
func TestAnAlarmSeenOnlyInWritesGoesWhenWritesStopShowingIt(t *testing.T) {
	k, err := NewKeeper(Options{Endpoints: []string{"http://127.0.0.1:1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, "svc", "m1", "addr")
	if err != nil {
		t.Fatal(err)
	}
	werr := k.seen(fmt.Errorf("put: %w", rpctypes.ErrNoSpace))
	if k.alarms.err() != ErrNoSpaceAlarm || werr.Error() != "etcd: NOSPACE alarm: put: etcdserver: mvcc: database space exceeded" {
		t.Fatalf("after a write refused for space: alarm %v, error %q", k.alarms.err(), werr)
	}
	k.alarms.unconfirmed(k, time.Hour)
	if k.alarms.err() != ErrNoSpaceAlarm {
		t.Fatal("the alarm went while writes still show it")
	}
	time.Sleep(10 * time.Millisecond)
	k.alarms.unconfirmed(k, 5*time.Millisecond)
	if err := k.alarms.err(); err != nil {
		t.Fatalf("an alarm no write showed for longer than the TTL stays: %v", err)
	}
	if err := k.seen(fmt.Errorf("put: %w", rpctypes.ErrLeaseNotFound)); k.alarms.err() != nil || err == nil {
		t.Fatalf("another error raised an alarm: %v", k.alarms.err())
	}
}
