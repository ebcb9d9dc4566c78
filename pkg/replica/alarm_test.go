package replica

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/health"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	"github.com/volplane/volplane/test/harness/devenv"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Under etcd's NOSPACE alarm (its database at its quota: every write
// refused) a replica is NOT_SERVING, with "etcd: NOSPACE alarm" in its
// readiness log (the etcd-session check) and an error logged, although its
// session lives on; once the alarm is disarmed it serves again.
func TestNotServingUnderTheNoSpaceAlarm(t *testing.T) {
	e, err := devenv.StartEtcdWith(t.TempDir(), devenv.EtcdOptions{QuotaBackendBytes: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	co, err := coord.NewKeeper(coord.Options{Endpoints: e.Endpoints, Logger: log, AlarmPeriod: 100 * time.Millisecond}, "reclaimer", "reclaimer-0", "addr")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := grpcutil.NewServer(log, grpcutil.ServerOptions{TLS: grpcutil.TLSFiles{InsecurePlaintext: true}})
	if err != nil {
		t.Fatal(err)
	}
	r := &Replica{Coord: co, Server: srv, Log: log, Health: health.New(),
		cfg: Config{Service: "reclaimer", MemberID: "reclaimer-0", Etcd: coord.Options{Endpoints: e.Endpoints}}}
	r.Health.AddReadiness("etcd-session", r.etcdSession)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(2)
	go func() { defer wg.Done(); _ = co.Run(ctx) }()
	go func() {
		defer wg.Done()
		r.Readiness(ctx, 100*time.Millisecond, reclaimerv1.ReclaimerService_ServiceDesc.ServiceName)
	}()
	status := func() healthpb.HealthCheckResponse_ServingStatus {
		r, err := srv.Health.Check(ctx, &healthpb.HealthCheckRequest{Service: reclaimerv1.ReclaimerService_ServiceDesc.ServiceName})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return r.Status
	}
	waitFor := func(what string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for status() != want {
			if time.Now().After(deadline) {
				t.Fatalf("not %s within 30s: %v\n%s", what, status(), logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("SERVING with a session", healthpb.HealthCheckResponse_SERVING)

	// Another writer fills etcd past its quota.
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	value := strings.Repeat("x", 64<<10)
	for i := 0; ; i++ {
		if _, err := cli.Put(ctx, "/filler", value); errors.Is(err, rpctypes.ErrNoSpace) {
			break
		} else if err != nil || i > 1000 {
			t.Fatalf("filling etcd: %v after %d writes", err, i)
		}
	}
	waitFor("NOT_SERVING under the alarm", healthpb.HealthCheckResponse_NOT_SERVING)
	if !co.Ready() {
		t.Error("the session was counted as lost for an alarm")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "etcd-session: etcd: NOSPACE alarm") || !strings.Contains(logs.String(), "level=ERROR") {
		if time.Now().After(deadline) {
			t.Fatalf("the readiness log does not say etcd: NOSPACE alarm, or nothing at error level:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

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
	waitFor("SERVING once the alarm is disarmed", healthpb.HealthCheckResponse_SERVING)
}
