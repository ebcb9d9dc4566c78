package reclaimer

import (
	"context"
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/reclaimjournal"
)

// takeOver takes the reclaims whose replica stopped (their lock has no
// holder) and resumes them. In node-local mode a reclaim of another
// node's volume is left for that node's reclaimer.
func (c *controller) takeOver(ctx context.Context) {
	jctx, cancel := context.WithTimeout(ctx, journalTimeout)
	defer cancel()
	recs, err := c.journal.List(jctx, reclaimjournal.Kind)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("cannot list the reclaim journal", "error", err)
		}
		return
	}
	reportJournal(recs, c.now())
	for _, rec := range recs {
		if rec.Holder != "" && rec.Holder != c.member || c.heldRecord(rec.Name) != nil || c.stopping(ctx) {
			continue
		}
		if err := c.adopt(ctx, rec); err != nil && !errors.Is(err, coord.ErrReserved) {
			c.log.Warn("cannot take over a reclaim", "volume", rec.Name, "error", err)
		}
	}
}

// adopt takes over one orphaned journal record.
func (c *controller) adopt(ctx context.Context, rec coord.Record) error {
	r, err := reclaimjournal.Decode(rec)
	if err != nil {
		return err
	}
	v, err := c.kube.GetVolume(ctx, rec.Name)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	case string(v.UID) == r.VolumeUid && !c.plan(ctx, v).acts():
		return nil // another reclaimer's (e.g. a local volume of another node)
	}
	jctx, cancel := context.WithTimeout(ctx, journalTimeout)
	defer cancel()
	if err := c.journal.Acquire(jctx, reclaimjournal.Kind, rec.Name, c.member); err != nil {
		return err
	}
	c.log.Info("taking over a journaled reclaim", "volume", rec.Name, "state", r.State, "method", r.Method)
	return c.hold(jctx, r)
}
