package binder

import (
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/test/harness/devenv"
)

// etcd (real, embedded) is down for longer than the lease TTL: the binder
// keeps running, owns nothing and writes nothing from the moment its
// session is lost until a new one lists it again and the settle period
// has passed; then it acts again. Readiness (coordinated) follows.
func TestEtcdOutageStopsEveryWriteUntilANewSession(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	ctx := t.Context()
	etcd, err := devenv.StartEtcd(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Stop)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	const ttl, settle = 2 * time.Second, 300 * time.Millisecond
	k, err := coord.NewKeeper(coord.Options{Endpoints: etcd.Endpoints, TTL: ttl, DialTimeout: time.Second, Logger: log}, Service, "a", "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	keeperDone := make(chan error, 1)
	go func() { keeperDone <- k.Run(ctx) }()
	own := newOwnership("a", settle)
	peers := newPeers("a", own.current, grpcutil.TLSFiles{})
	defer peers.close()
	go followMembers(ctx, k, own, peers, func() {}, log)

	volume := testVolume("pv")
	volume.UID = "pv-uid"
	volume.Status.Phase = ""
	c, client := fedController(t, volume.DeepCopy())
	c.owns = own.owns
	c.canAct = own.ready
	var writes atomic.Int64
	client.PrependReactor("update", "persistentvolumes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		writes.Add(1)
		back := a.(k8stesting.UpdateAction).GetObject().(*corev1.PersistentVolume).DeepCopy()
		back.Status.Phase = "" // written again at every sync
		return true, back, nil
	})
	sync := func() error { return c.syncVolume(ctx, c.store.volume("pv")) }

	waitFor(t, func() bool { return c.coordinated() && own.owns("pv/pv") })
	if err := sync(); err != nil || writes.Load() != 1 {
		t.Fatalf("sync with a live session: %v, %d writes", err, writes.Load())
	}

	etcd.Stop()
	// Within the TTL the lease may still live (etcd keeps leases across a
	// restart); once the session is lost, nothing is the replica's.
	waitFor(t, func() bool { return !k.Ready() })
	if c.coordinated() || own.owns("pv/pv") {
		t.Fatal("the replica owns objects or is ready without an etcd session")
	}
	before := writes.Load()
	for range 20 {
		if err := sync(); !errors.Is(err, errNotOwner) {
			t.Fatalf("sync without a session: %v, want errNotOwner", err)
		}
	}
	if n := writes.Load() - before; n != 0 {
		t.Fatalf("%d writes without an etcd session", n)
	}
	select {
	case err := <-keeperDone:
		t.Fatalf("the keeper stopped during the outage: %v", err)
	default:
	}

	if err := etcd.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return k.Ready() })
	waitFor(t, func() bool { return c.coordinated() && own.owns("pv/pv") })
	if err := sync(); err != nil || writes.Load() != before+1 {
		t.Fatalf("sync after the outage: %v, %d writes", err, writes.Load()-before)
	}
}
