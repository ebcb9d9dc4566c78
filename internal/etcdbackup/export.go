package etcdbackup

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Export is volplane's keys at one revision, with the TTL of every lease
// they hang on: what a restore needs, and nothing of etcd's database (its
// free pages, its history), so that it fits in a Secret. ExportKeys takes
// it; Restore writes it back as it writes a snapshot's keys.
type Export struct {
	// Prefix is the keys' prefix ("/volplane/").
	Prefix string `json:"prefix"`
	// Revision is etcd's revision the keys were read at.
	Revision int64 `json:"revision"`
	// Taken is when.
	Taken time.Time `json:"taken"`
	// Keys, sorted by key.
	Keys []ExportedKey `json:"keys"`
	// TTLs are the granted TTLs, in seconds, of the leases Keys hang on,
	// by lease ID. A key whose lease is not here lost it between the read
	// and the lease's query: Restore skips it, as it skips a snapshot's
	// key whose lease was being revoked.
	TTLs map[int64]int64 `json:"ttls"`
}

// ExportedKey is one key of an Export.
type ExportedKey struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
	Lease int64  `json:"lease,omitempty"`
}

// ExportKeys reads every key under prefix in one range (one revision) and
// the TTL of each lease they hang on.
func ExportKeys(ctx context.Context, cli *clientv3.Client, prefix string) (*Export, error) {
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read the keys under %s: %w", prefix, err)
	}
	e := &Export{Prefix: prefix, Revision: resp.Header.Revision, Taken: time.Now().UTC(), TTLs: map[int64]int64{}}
	for _, kv := range resp.Kvs {
		e.Keys = append(e.Keys, ExportedKey{Key: string(kv.Key), Value: kv.Value, Lease: kv.Lease})
		if kv.Lease == 0 {
			continue
		}
		if _, ok := e.TTLs[kv.Lease]; ok {
			continue
		}
		l, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err != nil {
			return nil, fmt.Errorf("read lease %x of key %s: %w", kv.Lease, kv.Key, err)
		}
		if l.TTL > 0 { // -1: the lease expired since the read
			e.TTLs[kv.Lease] = l.GrantedTTL
		}
	}
	sort.Slice(e.Keys, func(i, j int) bool { return e.Keys[i].Key < e.Keys[j].Key })
	return e, nil
}

// Encode is e as gzipped JSON.
func (e *Export) Encode() ([]byte, error) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if err := json.NewEncoder(zw).Encode(e); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// maxExport bounds what DecodeExport reads once decompressed: a Secret
// holds at most 1 MiB, gzipped JSON of etcd's keys inflates far less
// than 64 times.
const maxExport = 64 << 20

// DecodeExport reads what Encode wrote.
func DecodeExport(b []byte) (*Export, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("not a gzipped export of volplane's keys: %w", err)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, maxExport+1))
	if err != nil {
		return nil, fmt.Errorf("decompress the export: %w", err)
	}
	if len(raw) > maxExport {
		return nil, fmt.Errorf("the export decompresses to more than %d bytes: not one ExportKeys wrote", maxExport)
	}
	var e Export
	if err := json.Unmarshal(raw, &e); err != nil {
		return nil, fmt.Errorf("decode the export: %w", err)
	}
	if e.Prefix == "" || !strings.HasPrefix(e.Prefix, "/") {
		return nil, errors.New("the export names no key prefix: not one ExportKeys wrote")
	}
	return &e, nil
}

// keyValues are the export's keys under prefix as a snapshot's are read
// (readSnapshot), for Restore.
func (e *Export) keyValues(prefix string) ([]*mvccpb.KeyValue, map[int64]int64) {
	kvs := make([]*mvccpb.KeyValue, 0, len(e.Keys))
	for _, k := range e.Keys {
		if strings.HasPrefix(k.Key, prefix) {
			kvs = append(kvs, &mvccpb.KeyValue{Key: []byte(k.Key), Value: k.Value, Lease: k.Lease})
		}
	}
	return kvs, e.TTLs
}
