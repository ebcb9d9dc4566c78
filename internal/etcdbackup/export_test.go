package etcdbackup_test

import (
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/volplane/volplane/internal/etcdbackup"
)

// backupSecret is the empty Secret the manifests create for the exports.
func backupSecret() *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "volplane-etcd-backup", Namespace: "volplane-system"}}
}

// An export into a Secret (the manifests' default backup: no volume, so
// nothing volplane must bind) restores into a new cluster as a snapshot
// does: the journal records, the reservations on leases of their old
// TTL, and a record the new cluster wrote since kept. The Secret keeps
// the newest export and the one before; a second restore writes nothing.
func TestAnExportInASecretRestoresIntoANewCluster(t *testing.T) {
	ctx := t.Context()
	old := startEtcd(t)
	p := newCoord(t, old.Endpoints, time.Minute)
	for i := range 10 {
		name := fmt.Sprintf("pv-%d", i)
		if err := p.Acquire(ctx, "provision", name, "provisioner-0"); err != nil {
			t.Fatal(err)
		}
		if err := p.Put(ctx, "provision", name, "provisioner-0", []byte("create "+name)); err != nil {
			t.Fatal(err)
		}
		if err := p.Reserve(ctx, fmt.Sprintf("pv/static-%d", i), fmt.Sprintf("claim-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	kube := fake.NewClientset(backupSecret())
	target := etcdbackup.SecretTarget{Client: kube, Namespace: "volplane-system", Name: "volplane-etcd-backup"}
	o := etcdbackup.Options{Client: etcdbackup.Client{Endpoints: old.Endpoints}, Secret: target, Logger: quiet()}
	if err := etcdbackup.Run(ctx, o); err != nil { // a CronJob's run: the first export
		t.Fatal(err)
	}
	if err := p.Acquire(ctx, "provision", "pv-late", "provisioner-0"); err != nil {
		t.Fatal(err)
	}
	if err := p.Put(ctx, "provision", "pv-late", "provisioner-0", []byte("after the first export")); err != nil {
		t.Fatal(err)
	}
	if err := etcdbackup.Run(ctx, o); err != nil {
		t.Fatal(err)
	}
	sec, err := kube.CoreV1().Secrets("volplane-system").Get(ctx, "volplane-etcd-backup", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.Data[etcdbackup.SecretLatest]) == 0 || len(sec.Data[etcdbackup.SecretPrevious]) == 0 {
		t.Fatalf("the Secret holds %d bytes of the newest export and %d of the one before, want both", len(sec.Data[etcdbackup.SecretLatest]), len(sec.Data[etcdbackup.SecretPrevious]))
	}
	if sec.Annotations["volplane.io/backup-keys"] == "" || sec.Annotations["volplane.io/backup-taken"] == "" {
		t.Errorf("the Secret does not say what it holds: %v", sec.Annotations)
	}

	fresh := startEtcd(t)
	n := newCoord(t, fresh.Endpoints, time.Minute)
	if err := n.Acquire(ctx, "provision", "pv-7", "provisioner-1"); err != nil {
		t.Fatal(err)
	}
	if err := n.Put(ctx, "provision", "pv-7", "provisioner-1", []byte("newer")); err != nil {
		t.Fatal(err)
	}
	ro := etcdbackup.RestoreOptions{Client: etcdbackup.Client{Endpoints: fresh.Endpoints}, Secret: target, Logger: quiet()}
	res, err := etcdbackup.Restore(ctx, ro)
	if err != nil {
		t.Fatal(err)
	}
	if res.Written == 0 || res.Present != 2 || res.Leases == 0 {
		t.Errorf("restore: %+v, want keys written, 2 present (pv-7's record and lock), leases granted", res)
	}
	recs, err := n.List(ctx, "provision")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range recs {
		got[r.Name] = string(r.Value)
	}
	for i := range 10 {
		name := fmt.Sprintf("pv-%d", i)
		want := "create " + name
		if name == "pv-7" {
			want = "newer"
		}
		if got[name] != want {
			t.Errorf("record %s after the restore: %q, want %q", name, got[name], want)
		}
	}
	if got["pv-late"] != "after the first export" {
		t.Errorf("the newest export's record pv-late: %q", got["pv-late"])
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: fresh.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	kv, err := cli.Get(ctx, "/volplane/reservations/pv/static-3")
	if err != nil || len(kv.Kvs) != 1 || kv.Kvs[0].Lease == 0 {
		t.Fatalf("the restored reservation hangs on no lease: %v %v", kv, err)
	}
	if ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Kvs[0].Lease)); err != nil || ttl.GrantedTTL != 60 {
		t.Fatalf("the restored reservation's lease: %+v %v, want a granted TTL of 60s", ttl, err)
	}
	if again, err := etcdbackup.Restore(ctx, ro); err != nil || again.Written != 0 {
		t.Fatalf("a second restore: %+v %v, want nothing written", again, err)
	}

	// The export before the newest lacks pv-late.
	other := startEtcd(t)
	ro.Endpoints, ro.Previous = other.Endpoints, true
	if _, err := etcdbackup.Restore(ctx, ro); err != nil {
		t.Fatal(err)
	}
	oc := newCoord(t, other.Endpoints, time.Minute)
	prev, err := oc.List(ctx, "provision")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range prev {
		if r.Name == "pv-late" {
			t.Errorf("the export before the newest holds pv-late, written after it")
		}
	}
	if len(prev) != 10 {
		t.Errorf("the export before the newest restored %d records, want 10", len(prev))
	}
}

// What cannot be a backup is refused with a message that says what to
// do, and nothing is written: no Secret to write into (the backup may
// not create one), an export too big for a Secret, a Secret with no
// export yet, an export that is not
// one, both a snapshot and a Secret to restore.
func TestSecretBackupsRefuseWhatTheyCannotUse(t *testing.T) {
	ctx := t.Context()
	e := startEtcd(t)
	c := newCoord(t, e.Endpoints, time.Minute)
	if err := c.Reserve(ctx, "pv/x", "claim-x"); err != nil {
		t.Fatal(err)
	}
	none := etcdbackup.SecretTarget{Client: fake.NewClientset(), Namespace: "volplane-system", Name: "volplane-etcd-backup"}
	err := etcdbackup.Run(ctx, etcdbackup.Options{Client: etcdbackup.Client{Endpoints: e.Endpoints}, Secret: none, Logger: quiet()})
	if err == nil || !strings.Contains(err.Error(), "the manifests create it") {
		t.Errorf("an export with no Secret to write into: %v", err)
	}
	if err := etcdbackup.Run(ctx, etcdbackup.Options{Client: etcdbackup.Client{Endpoints: e.Endpoints}, Logger: quiet()}); err == nil || !strings.Contains(err.Error(), "--secret") {
		t.Errorf("a backup with nowhere to go: %v", err)
	}

	// More than a Secret holds (random values do not compress): refused
	// with the way out, and the Secret's export before it left as it was.
	big := startEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: big.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	value := make([]byte, 1<<10)
	for i := range 1100 {
		_, _ = rand.Read(value)
		if _, err := cli.Put(ctx, fmt.Sprintf("/volplane/journal/provision/pv-%d", i), string(value)); err != nil {
			t.Fatal(err)
		}
	}
	kept := backupSecret()
	kept.Data = map[string][]byte{etcdbackup.SecretLatest: []byte("the export before")}
	full := etcdbackup.SecretTarget{Client: fake.NewClientset(kept), Namespace: "volplane-system", Name: "volplane-etcd-backup"}
	err = etcdbackup.Run(ctx, etcdbackup.Options{Client: etcdbackup.Client{Endpoints: big.Endpoints}, Secret: full, Logger: quiet()})
	if err == nil || !strings.Contains(err.Error(), "more than a Secret holds") || !strings.Contains(err.Error(), "--dir") {
		t.Errorf("an export too big for a Secret: %v", err)
	}
	if sec, _ := full.Client.CoreV1().Secrets("volplane-system").Get(ctx, "volplane-etcd-backup", metav1.GetOptions{}); string(sec.Data[etcdbackup.SecretLatest]) != "the export before" {
		t.Errorf("a refused export changed the Secret: %d bytes", len(sec.Data[etcdbackup.SecretLatest]))
	}

	fresh := startEtcd(t)
	empty := etcdbackup.SecretTarget{Client: fake.NewClientset(backupSecret()), Namespace: "volplane-system", Name: "volplane-etcd-backup"}
	garbage := backupSecret()
	garbage.Data = map[string][]byte{etcdbackup.SecretLatest: []byte("not gzip")}
	bad := etcdbackup.SecretTarget{Client: fake.NewClientset(garbage), Namespace: "volplane-system", Name: "volplane-etcd-backup"}
	for _, tc := range []struct {
		name string
		o    etcdbackup.RestoreOptions
		want string
	}{
		{"no export yet", etcdbackup.RestoreOptions{Secret: empty}, "no backup has been written"},
		{"not an export", etcdbackup.RestoreOptions{Secret: bad}, "not a gzipped export"},
		{"no Secret", etcdbackup.RestoreOptions{Secret: none}, "not found"},
		{"both", etcdbackup.RestoreOptions{Secret: empty, Snapshot: "/x.db"}, "not both"},
	} {
		tc.o.Client, tc.o.Logger = etcdbackup.Client{Endpoints: fresh.Endpoints}, quiet()
		if _, err := etcdbackup.Restore(ctx, tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %q", tc.name, err, tc.want)
		}
	}
	n := newCoord(t, fresh.Endpoints, time.Minute)
	if h, err := n.Holder(ctx, "pv/x"); err != nil || h != "" {
		t.Fatalf("a refused restore wrote into the cluster: %q %v", h, err)
	}
}
