package reclaimer

import (
	"context"

	"github.com/volplane/volplane/pkg/coord"
)

// journal is what the reclaimer needs of pkg/coord: a lock per reclaim on
// this replica's lease, and a record that outlives the replica
// (pkg/reclaimjournal).
type journal interface {
	Acquire(ctx context.Context, kind, name, holder string) error
	AcquireGet(ctx context.Context, kind, name, holder string) (coord.Record, bool, error)
	Put(ctx context.Context, kind, name, holder string, value []byte) error
	Finish(ctx context.Context, kind, name, holder string) error
	Unlock(ctx context.Context, kind, name, holder string) error
	Get(ctx context.Context, kind, name string) (coord.Record, bool, error)
	List(ctx context.Context, kind string) ([]coord.Record, error)
}

var _ journal = (*coord.Coordinator)(nil)
