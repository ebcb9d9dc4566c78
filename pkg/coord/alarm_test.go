package coord_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/test/harness/devenv"
)

// syncBuffer is a log sink the Keeper's goroutines and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// etcd's quota alarm is raised visibly: once etcd refuses writes with
// "database space exceeded", the Keeper's writes fail with
// ErrNoSpaceAlarm, Health says "etcd: NOSPACE alarm" (the services turn
// NOT_SERVING with it) and an error is logged; the session itself is kept
// (Ready: nothing it holds is lost). Once etcd is compacted, defragmented
// and the alarm disarmed, Health is nil again and writes go through.
func TestKeeperReportsTheNoSpaceAlarm(t *testing.T) {
	e, err := devenv.StartEtcdWith(t.TempDir(), devenv.EtcdOptions{QuotaBackendBytes: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	k, err := coord.NewKeeper(coord.Options{Endpoints: e.Endpoints, TTL: 30 * time.Second, Logger: log, AlarmPeriod: 100 * time.Millisecond}, "svc", "m1", "addr-1")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	until(t, 10*time.Second, "a first session", k.Ready)
	if err := k.Health(); err != nil {
		t.Fatalf("Health before any alarm: %v", err)
	}
	if err := k.Acquire(ctx, "op", "x", "m1"); err != nil {
		t.Fatal(err)
	}
	// Rewrite one record until etcd's database passes its 2 MiB quota:
	// history, not live data, fills it (as reservations and the journal
	// do all day).
	value := bytes.Repeat([]byte("v"), 64<<10)
	var werr error
	for i := 0; i < 1000 && werr == nil; i++ {
		werr = k.Put(ctx, "op", "x", "m1", value)
	}
	if !errors.Is(werr, coord.ErrNoSpaceAlarm) {
		t.Fatalf("writes past the quota: %v, want ErrNoSpaceAlarm", werr)
	}
	if !strings.Contains(werr.Error(), "database space exceeded") {
		t.Errorf("the write's error %q does not carry etcd's own", werr)
	}
	if err := k.Health(); !errors.Is(err, coord.ErrNoSpaceAlarm) || err.Error() != "etcd: NOSPACE alarm" {
		t.Fatalf("Health under the alarm: %v, want %q", err, "etcd: NOSPACE alarm")
	}
	if !k.Ready() {
		t.Error("the session was counted as lost for an alarm")
	}
	// The alarm stays reported while it lasts (the poller sees it too).
	time.Sleep(300 * time.Millisecond)
	if err := k.Health(); !errors.Is(err, coord.ErrNoSpaceAlarm) {
		t.Fatalf("Health while the alarm lasts: %v", err)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "NOSPACE") {
		t.Fatalf("no error logged for the alarm:\n%s", logs.String())
	}

	// The operator's (or volplane-etcd-member's) recovery: compact,
	// defragment, disarm.
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	st, err := cli.Status(ctx, e.Endpoints[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, st.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Defragment(ctx, e.Endpoints[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{}); err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "the alarm seen cleared", func() bool { return k.Health() == nil })
	if err := k.Put(ctx, "op", "x", "m1", []byte("after")); err != nil {
		t.Fatalf("a write after the recovery: %v", err)
	}
	if !strings.Contains(logs.String(), "alarm cleared") {
		t.Errorf("the recovery was not logged:\n%s", logs.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// Without a session Health says so.
func TestKeeperHealthWithoutASession(t *testing.T) {
	k, err := coord.NewKeeper(coord.Options{Endpoints: []string{"http://127.0.0.1:1"}, Logger: quiet()}, "svc", "m1", "addr-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Health(); !errors.Is(err, coord.ErrSessionLost) || !strings.HasPrefix(err.Error(), "etcd: ") {
		t.Fatalf("Health before Run: %v, want an etcd: ... ErrSessionLost", err)
	}
}
