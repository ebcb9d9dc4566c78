package etcdbackup_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/volplane/volplane/internal/etcdbackup"
	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/test/harness/devenv"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startEtcd(t *testing.T) *devenv.Etcd {
	t.Helper()
	e, err := devenv.StartEtcd(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return e
}

func newCoord(t *testing.T, endpoints []string, ttl time.Duration) *coord.Coordinator {
	t.Helper()
	c, err := coord.New(t.Context(), coord.Options{Endpoints: endpoints, TTL: ttl, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A snapshot taken while volplane works (journal records rewritten,
// reservations taken) restores into a new cluster: the journal records
// and reservations of the snapshot are there, records finished before it
// are not, a record the new cluster wrote since is kept, and restored
// reservations hang on leases of their old TTL.
func TestASnapshotTakenWhileVolplaneWorksRestoresIntoANewCluster(t *testing.T) {
	ctx := t.Context()
	old := startEtcd(t)
	p := newCoord(t, old.Endpoints, time.Minute)
	if err := p.Register(ctx, "provisioner", "provisioner-0", "addr-0"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("pv-%d", i)
		if err := p.Acquire(ctx, "provision", name, "provisioner-0"); err != nil {
			t.Fatal(err)
		}
		if err := p.Put(ctx, "provision", name, "provisioner-0", []byte("create "+name)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 5; i++ { // finished before the snapshot: not restored
		if err := p.Finish(ctx, "provision", fmt.Sprintf("pv-%d", i), "provisioner-0"); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 10; i++ {
		if err := p.Reserve(ctx, fmt.Sprintf("pv/static-%d", i), fmt.Sprintf("claim-%d", i)); err != nil {
			t.Fatal(err)
		}
	}

	// volplane keeps working while the snapshots are taken.
	busy := newCoord(t, old.Endpoints, time.Minute)
	if err := busy.Acquire(ctx, "provision", "pv-busy", "binder-0"); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var writes int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; wctx.Err() == nil; i++ {
			if busy.Put(wctx, "provision", "pv-busy", "binder-0", []byte(fmt.Sprint("step ", i))) == nil &&
				busy.Reserve(wctx, fmt.Sprintf("pv/churn-%d", i%20), "claim-churn") == nil {
				writes++
			}
		}
	}()
	dir := t.TempDir()
	var path string
	for i := 0; i < 4; i++ {
		o := etcdbackup.Options{Client: etcdbackup.Client{Endpoints: old.Endpoints}, Dir: dir, Keep: 2, Logger: quiet()}
		if i == 0 { // a member down: the next one gives the snapshot
			o.Endpoints = append([]string{"http://127.0.0.1:1"}, old.Endpoints...)
		}
		var err error
		if path, err = etcdbackup.Save(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	wg.Wait()
	if writes == 0 {
		t.Fatal("volplane wrote nothing while the snapshots were taken")
	}
	kept, err := etcdbackup.Snapshots(dir)
	if err != nil || len(kept) != 2 || kept[1] != path {
		t.Fatalf("snapshots kept: %v %v, want the 2 newest, the last %s", kept, err, path)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, "*.part")); len(leftovers) > 0 {
		t.Fatalf("partial snapshots left: %v", leftovers)
	}

	// The old cluster is lost; a new one runs, and volplane has already
	// written one record into it.
	fresh := startEtcd(t)
	n := newCoord(t, fresh.Endpoints, time.Minute)
	if err := n.Acquire(ctx, "provision", "pv-7", "provisioner-1"); err != nil {
		t.Fatal(err)
	}
	if err := n.Put(ctx, "provision", "pv-7", "provisioner-1", []byte("newer")); err != nil {
		t.Fatal(err)
	}
	// A restore Job has a read-only root and the backup volume mounted
	// read-only: it needs no writable directory.
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "absent"))
	res, err := etcdbackup.Restore(ctx, etcdbackup.RestoreOptions{Client: etcdbackup.Client{Endpoints: fresh.Endpoints}, Snapshot: path, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Written == 0 || res.Present != 2 || res.Leases == 0 {
		// Present: the record pv-7 and its lock, which the new cluster has.
		t.Errorf("restore: %+v, want keys written, 2 present, leases granted", res)
	}
	t.Logf("restore: %+v (volplane made %d writes during the snapshots)", res, writes)

	recs, err := n.List(ctx, "provision")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range recs {
		names = append(names, r.Name)
		switch {
		case r.Name == "pv-7" && string(r.Value) != "newer":
			t.Errorf("pv-7, written on the new cluster since, was overwritten: %q", r.Value)
		case r.Name == "pv-busy" && !strings.HasPrefix(string(r.Value), "step "):
			t.Errorf("pv-busy: %q", r.Value)
		case r.Name != "pv-7" && r.Name != "pv-busy" && string(r.Value) != "create "+r.Name:
			t.Errorf("%s: %q", r.Name, r.Value)
		}
	}
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("pv-%d", i)
		if has := slices.Contains(names, name); has != (i >= 5) {
			t.Errorf("record %s restored: %v, want %v (records %v)", name, has, i >= 5, names)
		}
	}
	if !slices.Contains(names, "pv-busy") {
		t.Errorf("the record volplane rewrote during the snapshot is missing: %v", names)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: fresh.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for i := 0; i < 10; i++ {
		res := fmt.Sprintf("pv/static-%d", i)
		holder, err := n.Holder(ctx, res)
		if err != nil || holder != fmt.Sprintf("claim-%d", i) {
			t.Fatalf("reservation %s: %q %v", res, holder, err)
		}
	}
	kv, err := cli.Get(ctx, "/volplane/reservations/pv/static-3")
	if err != nil || len(kv.Kvs) != 1 || kv.Kvs[0].Lease == 0 {
		t.Fatalf("the restored reservation hangs on no lease: %v %v", kv, err)
	}
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Kvs[0].Lease))
	if err != nil || ttl.GrantedTTL != 60 {
		t.Fatalf("the restored reservation's lease: %+v %v, want a granted TTL of 60s", ttl, err)
	}
	ms, err := n.Members(ctx, "provisioner")
	if err != nil || len(ms) != 1 || ms[0].ID != "provisioner-0" {
		t.Fatalf("members restored: %v %v", ms, err)
	}

	// Restoring again writes nothing: everything is there.
	again, err := etcdbackup.Restore(ctx, etcdbackup.RestoreOptions{Client: etcdbackup.Client{Endpoints: fresh.Endpoints}, Snapshot: path, Logger: quiet()})
	if err != nil || again.Written != 0 {
		t.Fatalf("a second restore: %+v %v, want nothing written", again, err)
	}
}

// A damaged snapshot is refused, and nothing is written from it.
func TestADamagedSnapshotIsRefused(t *testing.T) {
	ctx := t.Context()
	e := startEtcd(t)
	c := newCoord(t, e.Endpoints, time.Minute)
	if err := c.Reserve(ctx, "pv/x", "claim-x"); err != nil {
		t.Fatal(err)
	}
	path, err := etcdbackup.Save(ctx, etcdbackup.Options{Client: etcdbackup.Client{Endpoints: e.Endpoints}, Dir: t.TempDir(), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	damaged := filepath.Join(t.TempDir(), "damaged.db")
	if err := os.WriteFile(damaged, b, 0o600); err != nil {
		t.Fatal(err)
	}
	truncated := filepath.Join(t.TempDir(), "truncated.db")
	if err := os.WriteFile(truncated, b[:len(b)-100], 0o600); err != nil {
		t.Fatal(err)
	}
	fresh := startEtcd(t)
	for _, f := range []string{damaged, truncated} {
		_, err := etcdbackup.Restore(ctx, etcdbackup.RestoreOptions{Client: etcdbackup.Client{Endpoints: fresh.Endpoints}, Snapshot: f, Logger: quiet()})
		if err == nil {
			t.Errorf("%s restored", filepath.Base(f))
		}
	}
	n := newCoord(t, fresh.Endpoints, time.Minute)
	if h, err := n.Holder(ctx, "pv/x"); err != nil || h != "" {
		t.Fatalf("a damaged snapshot wrote into the cluster: %q %v", h, err)
	}
	if err := etcdbackup.Run(ctx, etcdbackup.Options{Client: etcdbackup.Client{Endpoints: []string{"http://127.0.0.1:1"}}, Dir: t.TempDir(), Logger: quiet()}); err == nil {
		t.Error("a one-off backup with no etcd to reach succeeded")
	}
}
