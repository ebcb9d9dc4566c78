package etcdbackup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/lease/leasepb"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
)

// RestoreOptions configure Restore.
type RestoreOptions struct {
	// Client reaches the cluster to restore into.
	Client
	// Snapshot is the file to restore (--restore).
	Snapshot string
	// Secret, when Snapshot is empty, holds the export to restore
	// (--restore-secret): its newest, or the one before with Previous.
	Secret   SecretTarget
	Previous bool
	// Prefix restricts the restore to keys under it (--prefix); default
	// "/volplane/", volplane's keys.
	Prefix string
	Logger *slog.Logger
}

// RestoreResult counts what Restore did.
type RestoreResult struct {
	// Written keys were absent from the cluster and written.
	Written int
	// Present keys were in the cluster already and left as they are.
	Present int
	// Leases granted anew for the leased keys written.
	Leases int
}

// maxOps is the most keys written in one transaction (etcd's default
// --max-txn-ops is 128).
const maxOps = 100

// Restore writes every key of the snapshot under Prefix, as of the
// snapshot's last revision, into the cluster, where the cluster has no
// such key: a key written since (by a replica working on the new cluster)
// wins over the snapshot's. A key that hung on a lease is written on a
// new lease with the old lease's TTL, so a reservation restored expires as
// it would have, unless its holder takes it again. Revisions are not
// restored (the keys get the cluster's); volplane reads none.
func Restore(ctx context.Context, o RestoreOptions) (RestoreResult, error) {
	var res RestoreResult
	if len(o.Endpoints) == 0 {
		return res, errors.New("no etcd endpoints (--etcd-endpoints)")
	}
	if o.Prefix == "" {
		o.Prefix = "/volplane/"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	kvs, ttls, source, err := o.read(ctx)
	if err != nil {
		return res, err
	}
	cfg, err := o.config(o.Endpoints)
	if err != nil {
		return res, err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return res, fmt.Errorf("connect to etcd %s: %w", strings.Join(o.Endpoints, ","), err)
	}
	defer cli.Close()
	leases := map[int64]clientv3.LeaseID{}
	skipped := 0
	for start := 0; start < len(kvs); start += maxOps {
		batch := kvs[start:min(start+maxOps, len(kvs))]
		ops := make([]clientv3.Op, 0, len(batch))
		written := make([]*mvccpb.KeyValue, 0, len(batch))
		for _, kv := range batch {
			var opts []clientv3.OpOption
			if kv.Lease != 0 {
				ttl, ok := ttls[kv.Lease]
				if !ok {
					skipped++ // its lease was being revoked with it
					continue
				}
				id, ok := leases[kv.Lease]
				if !ok {
					l, err := cli.Grant(ctx, ttl)
					if err != nil {
						return res, fmt.Errorf("grant a lease of %ds for the restored keys of lease %x: %w", ttl, kv.Lease, err)
					}
					id, leases[kv.Lease] = l.ID, l.ID
					res.Leases++
				}
				opts = append(opts, clientv3.WithLease(id))
			}
			key := string(kv.Key)
			ops = append(ops, clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
				[]clientv3.Op{clientv3.OpPut(key, string(kv.Value), opts...)}, nil))
			written = append(written, kv)
		}
		if len(ops) == 0 {
			continue
		}
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return res, fmt.Errorf("write %d restored keys: %w", len(ops), err)
		}
		for i := range written {
			if resp.Responses[i].GetResponseTxn().GetSucceeded() {
				res.Written++
			} else {
				res.Present++
			}
		}
	}
	o.Logger.Info("etcd snapshot restored", "snapshot", source, "prefix", o.Prefix, "written", res.Written,
		"present", res.Present, "leases", res.Leases, "skipped_lease_gone", skipped)
	return res, nil
}

// read reads the keys to restore, from the snapshot file or the Secret's
// export, and names where they came from.
func (o RestoreOptions) read(ctx context.Context) ([]*mvccpb.KeyValue, map[int64]int64, string, error) {
	switch {
	case o.Snapshot != "" && o.Secret.Name != "":
		return nil, nil, "", errors.New("restore a snapshot file (--restore) or a Secret's export (--restore-secret), not both")
	case o.Snapshot != "":
		kvs, ttls, err := readSnapshot(o.Snapshot, o.Prefix)
		return kvs, ttls, o.Snapshot, err
	case o.Secret.Name != "":
		key := SecretLatest
		if o.Previous {
			key = SecretPrevious
		}
		e, err := loadExport(ctx, o.Secret, key)
		if err != nil {
			return nil, nil, "", err
		}
		kvs, ttls := e.keyValues(o.Prefix)
		return kvs, ttls, fmt.Sprintf("secret %s/%s %s (revision %d, taken %s)", o.Secret.Namespace, o.Secret.Name, key, e.Revision, e.Taken.Format(time.RFC3339)), nil
	}
	return nil, nil, "", errors.New("nothing to restore: give a snapshot file (--restore) or a Secret (--restore-secret)")
}

// readSnapshot reads the keys under prefix as of the snapshot's last
// revision, sorted, and the TTL of each lease, from a snapshot file as
// etcd's Snapshot API gives it (a bbolt database followed by its SHA-256,
// which is checked).
func readSnapshot(path, prefix string) ([]*mvccpb.KeyValue, map[int64]int64, error) {
	db, cleanup, err := openSnapshot(path)
	if err != nil {
		return nil, nil, err
	}
	defer cleanup()
	latest := map[string]*mvccpb.KeyValue{}
	ttls := map[int64]int64{}
	err = db.View(func(tx *bolt.Tx) error {
		kb := tx.Bucket(schema.Key.Name())
		if kb == nil {
			return errors.New("no key bucket: not an etcd v3 snapshot")
		}
		// Revisions in order: the last one of a key says what it is.
		if err := kb.ForEach(func(rev, v []byte) error {
			var kv mvccpb.KeyValue
			if err := kv.Unmarshal(v); err != nil {
				return fmt.Errorf("revision %x: %w", rev, err)
			}
			if !strings.HasPrefix(string(kv.Key), prefix) {
				return nil
			}
			if mvcc.IsTombstone(rev) {
				delete(latest, string(kv.Key))
			} else {
				latest[string(kv.Key)] = &kv
			}
			return nil
		}); err != nil {
			return err
		}
		if lb := tx.Bucket(schema.Lease.Name()); lb != nil {
			return lb.ForEach(func(_, v []byte) error {
				var l leasepb.Lease
				if err := l.Unmarshal(v); err != nil {
					return err
				}
				ttls[l.ID] = l.TTL
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read snapshot %s: %w", path, err)
	}
	kvs := make([]*mvccpb.KeyValue, 0, len(latest))
	for _, kv := range latest {
		kvs = append(kvs, kv)
	}
	sort.Slice(kvs, func(i, j int) bool { return bytes.Compare(kvs[i].Key, kvs[j].Key) < 0 })
	return kvs, ttls, nil
}

// openSnapshot checks the snapshot's trailing SHA-256 and opens the
// database before it read-only, in place (as etcdutl's snapshot status
// does: bbolt ignores the trailing bytes), so that a restore needs no
// writable directory.
func openSnapshot(path string) (*bolt.DB, func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	size := st.Size()
	if size%512 != sha256.Size {
		return nil, nil, fmt.Errorf("snapshot %s: %d bytes, not a database followed by its SHA-256 (as etcd's Snapshot API gives it)", path, size)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, size-sha256.Size)); err != nil {
		return nil, nil, fmt.Errorf("read snapshot %s: %w", path, err)
	}
	want := make([]byte, sha256.Size)
	if _, err := io.ReadFull(f, want); err != nil {
		return nil, nil, fmt.Errorf("read snapshot %s: %w", path, err)
	}
	if !bytes.Equal(h.Sum(nil), want) {
		return nil, nil, fmt.Errorf("snapshot %s: SHA-256 mismatch: the file is damaged", path)
	}
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: 10 * time.Second})
	if err != nil {
		return nil, nil, fmt.Errorf("open snapshot %s: %w", path, err)
	}
	return db, func() { db.Close() }, nil
}
