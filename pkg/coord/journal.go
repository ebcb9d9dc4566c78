package coord

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNotOwner means a journal write was refused because the writer does not
// hold the operation's lock on its live lease (it never took it, another
// replica has it, or this replica's session is gone).
var ErrNotOwner = errors.New("operation lock not held by this replica")

// Record is one journaled operation: a value kept in etcd with no lease, so
// that it outlives the replica that wrote it.
type Record struct {
	// Kind groups records, e.g. "provision" or "reclaim".
	Kind string
	// Name identifies the operation within its kind, e.g. a PV name.
	Name string
	// Value is the caller's encoding of the operation.
	Value []byte
	// Holder is who holds the operation's lock now, "" when nobody does
	// (its owner died or released it): then any replica may take it over.
	Holder string
}

func (c *Coordinator) journalKey(kind, name string) string {
	return c.prefix + "/journal/" + kind + "/" + name
}

func lockResource(kind, name string) string { return "op/" + kind + "/" + name }

func validJournalName(kind, name string) error {
	if kind == "" || name == "" || strings.Contains(kind, "/") || strings.Contains(name, "/") {
		return fmt.Errorf("coord: invalid journal record %q of kind %q", name, kind)
	}
	return nil
}

// Acquire takes the lock of operation kind/name for holder on this
// session's lease (see Reserve): ErrReserved when another holder has it.
// Only the holder of the lock can write the operation's record.
func (c *Coordinator) Acquire(ctx context.Context, kind, name, holder string) error {
	if err := validJournalName(kind, name); err != nil {
		return err
	}
	return c.Reserve(ctx, lockResource(kind, name), holder)
}

// AcquireGet is Acquire and Get in one etcd transaction: it takes the lock
// of operation kind/name for holder (ErrReserved when another holder has
// it) and returns the operation's record, if any.
func (c *Coordinator) AcquireGet(ctx context.Context, kind, name, holder string) (r Record, ok bool, err error) {
	if err := validJournalName(kind, name); err != nil {
		return Record{}, false, err
	}
	select {
	case <-c.session.Done():
		return Record{}, false, ErrSessionLost
	default:
	}
	lock := c.reservationKey(lockResource(kind, name))
	rec := c.journalKey(kind, name)
	resp, err := c.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(lock), "=", 0)).
		Then(clientv3.OpPut(lock, holder, clientv3.WithLease(c.session.Lease())), clientv3.OpGet(rec)).
		Else(clientv3.OpGet(lock), clientv3.OpGet(rec)).
		Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return Record{}, false, ErrSessionLost
		}
		return Record{}, false, fmt.Errorf("acquire %s/%s in etcd: %w", kind, name, err)
	}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 1 && string(kvs[0].Value) != holder {
			return Record{}, false, fmt.Errorf("%s: %w %q", lockResource(kind, name), ErrReserved, string(kvs[0].Value))
		}
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Record{}, false, nil
	}
	return Record{Kind: kind, Name: name, Value: kvs[0].Value, Holder: holder}, true, nil
}

// Unlock drops holder's lock of operation kind/name and keeps its record,
// so that another replica (or this one, later) carries it on.
func (c *Coordinator) Unlock(ctx context.Context, kind, name, holder string) error {
	return c.Release(ctx, lockResource(kind, name), holder)
}

// fence is the condition every journal write carries: the operation's lock
// is held by holder on this session's live lease. A replica whose lease
// expired (and whose lock another replica may have taken since) can
// therefore never overwrite the new owner's record.
func (c *Coordinator) fence(kind, name, holder string) []clientv3.Cmp {
	lock := c.reservationKey(lockResource(kind, name))
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(lock), "=", holder),
		clientv3.Compare(clientv3.LeaseValue(lock), "=", c.session.Lease()),
	}
}

// Put writes the record of operation kind/name. The caller must hold its
// lock (Acquire); otherwise it fails with ErrNotOwner and writes nothing.
func (c *Coordinator) Put(ctx context.Context, kind, name, holder string, value []byte) error {
	if err := validJournalName(kind, name); err != nil {
		return err
	}
	resp, err := c.client.Txn(ctx).If(c.fence(kind, name, holder)...).
		Then(clientv3.OpPut(c.journalKey(kind, name), string(value))).Commit()
	if err != nil {
		return fmt.Errorf("journal %s/%s in etcd: %w", kind, name, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("journal %s/%s: %w", kind, name, ErrNotOwner)
	}
	return nil
}

// Finish deletes the record of operation kind/name and releases its lock in
// one transaction: the operation is done (or undone) and nothing is left
// to recover. The caller must hold the lock; otherwise ErrNotOwner.
func (c *Coordinator) Finish(ctx context.Context, kind, name, holder string) error {
	if err := validJournalName(kind, name); err != nil {
		return err
	}
	resp, err := c.client.Txn(ctx).If(c.fence(kind, name, holder)...).
		Then(clientv3.OpDelete(c.journalKey(kind, name)), clientv3.OpDelete(c.reservationKey(lockResource(kind, name)))).
		Commit()
	if err != nil {
		return fmt.Errorf("finish %s/%s in etcd: %w", kind, name, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("finish %s/%s: %w", kind, name, ErrNotOwner)
	}
	return nil
}

// Get reads the record of operation kind/name; ok is false when there is
// none.
func (c *Coordinator) Get(ctx context.Context, kind, name string) (r Record, ok bool, err error) {
	if err := validJournalName(kind, name); err != nil {
		return Record{}, false, err
	}
	resp, err := c.client.Txn(ctx).Then(
		clientv3.OpGet(c.journalKey(kind, name)),
		clientv3.OpGet(c.reservationKey(lockResource(kind, name))),
	).Commit()
	if err != nil {
		return Record{}, false, fmt.Errorf("read journal %s/%s in etcd: %w", kind, name, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Record{}, false, nil
	}
	r = Record{Kind: kind, Name: name, Value: kvs[0].Value}
	if locks := resp.Responses[1].GetResponseRange().Kvs; len(locks) == 1 {
		r.Holder = string(locks[0].Value)
	}
	return r, true, nil
}

// List returns every record of kind with its current lock holder, in name
// order, as of one etcd revision.
func (c *Coordinator) List(ctx context.Context, kind string) ([]Record, error) {
	if kind == "" || strings.Contains(kind, "/") {
		return nil, fmt.Errorf("coord: invalid journal kind %q", kind)
	}
	recPrefix := c.journalKey(kind, "")
	lockPrefix := c.reservationKey(lockResource(kind, ""))
	resp, err := c.client.Txn(ctx).Then(
		clientv3.OpGet(recPrefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)),
		clientv3.OpGet(lockPrefix, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("list journal %s in etcd: %w", kind, err)
	}
	holders := map[string]string{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		holders[strings.TrimPrefix(string(kv.Key), lockPrefix)] = string(kv.Value)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	out := make([]Record, 0, len(kvs))
	for _, kv := range kvs {
		name := strings.TrimPrefix(string(kv.Key), recPrefix)
		out = append(out, Record{Kind: kind, Name: name, Value: kv.Value, Holder: holders[name]})
	}
	return out, nil
}
