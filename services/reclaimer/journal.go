package reclaimer

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/volplane/volplane/pkg/coord"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// journalKind is the kind of the reclaimer's records in coord's journal;
// each record is named by its volume and holds a reclaimerv1.Reclaim.
const journalKind = "reclaim"

// journal is what the reclaimer needs of pkg/coord: a lock per reclaim on
// this replica's lease, and a record that outlives the replica.
type journal interface {
	Acquire(ctx context.Context, kind, name, holder string) error
	Put(ctx context.Context, kind, name, holder string, value []byte) error
	Finish(ctx context.Context, kind, name, holder string) error
	Unlock(ctx context.Context, kind, name, holder string) error
	Get(ctx context.Context, kind, name string) (coord.Record, bool, error)
	List(ctx context.Context, kind string) ([]coord.Record, error)
}

var _ journal = (*coord.Coordinator)(nil)

func encodeRecord(r *reclaimerv1.Reclaim) ([]byte, error) {
	b, err := proto.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode reclaim record of %s: %w", r.GetVolumeName(), err)
	}
	return b, nil
}

// decodeRecord reads a journal record; its owner is whoever holds its lock
// now.
func decodeRecord(rec coord.Record) (*reclaimerv1.Reclaim, error) {
	r := &reclaimerv1.Reclaim{}
	if err := proto.Unmarshal(rec.Value, r); err != nil {
		return nil, fmt.Errorf("decode reclaim record of %s: %w", rec.Name, err)
	}
	if r.VolumeName != rec.Name {
		return nil, fmt.Errorf("reclaim record %s names volume %q", rec.Name, r.VolumeName)
	}
	r.Owner = rec.Holder
	return r, nil
}
