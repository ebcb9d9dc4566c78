package provisioner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/logging"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// recoverAll goes through the journal once: provisionings of this replica
// that are not running, and provisionings whose replica is gone, are
// finished or undone. Deletions have no record of their own here: their
// reclaim record is the reclaimer's to resume (pkg/reclaimjournal).
func (p *provisioner) recoverAll(ctx context.Context) {
	recs, err := p.journal.List(ctx, kindProvision)
	if err != nil {
		p.log.Warn("list provisioning journal", "error", err)
	} else {
		observeJournal(recs, p.now())
	}
	for _, r := range recs {
		if ctx.Err() != nil {
			return
		}
		if (r.Holder != "" && r.Holder != p.member) || p.running(kindProvision, r.Name) {
			continue
		}
		if err := p.recoverProvision(ctx, r); err != nil {
			p.log.Warn("recover provisioning", "volume", r.Name, "error", err)
		}
	}
}

// recoverProvision finishes a journaled provisioning whose claim still
// wants it, and undoes one whose claim is gone, is being deleted or got
// another volume: the volume is created again with the same request (which
// returns the volume if it exists, or makes it) and then deleted, so that
// nothing is leaked whatever the driver did in the background.
func (p *provisioner) recoverProvision(ctx context.Context, r coord.Record) error {
	var op provisionOp
	if err := json.Unmarshal(r.Value, &op); err != nil {
		return fmt.Errorf("journal record: %w", err)
	}
	d := p.drivers.byProvisioner(op.Provisioner)
	if d == nil {
		return nil // another provisioner's operation
	}
	claim, err := p.client.CoreV1().PersistentVolumeClaims(op.ClaimNamespace).Get(ctx, op.ClaimName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		claim = nil
	case err != nil:
		return err
	}
	why := unwanted(claim, types.UID(op.ClaimUID), r.Name)
	if why == "" {
		class, err := p.client.StorageV1().StorageClasses().Get(ctx, op.Class, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("class %q of claim %s/%s: %w", op.Class, op.ClaimNamespace, op.ClaimName, err)
		}
		began := p.now()
		res, err := p.provision(ctx, claim, class, r.Name)
		p.noteRecovery(ctx, op.ClaimUID, r.Holder, began, res, err)
		if err != nil {
			return err
		}
		p.log.Info("recovered provisioning", "volume", r.Name, logging.ClaimRef(op.ClaimNamespace, op.ClaimName, op.ClaimUID), "outcome", res.outcome, "message", res.message)
		return nil
	}

	if !p.begin(kindProvision, r.Name) {
		return nil
	}
	defer p.end(kindProvision, r.Name)
	if err := p.journal.Acquire(ctx, kindProvision, r.Name, p.member); err != nil {
		if errors.Is(err, coord.ErrReserved) {
			return nil
		}
		return err
	}
	if _, err := p.client.CoreV1().PersistentVolumes().Get(ctx, r.Name, metav1.GetOptions{}); err == nil {
		// The PV was saved: the volume is the reclaimer's now.
		return p.journal.Finish(ctx, kindProvision, r.Name, p.member)
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	if !d.ready() {
		// Let a replica whose driver is ready take it.
		if err := p.journal.Unlock(ctx, kindProvision, r.Name, p.member); err != nil {
			p.log.Warn("unlock provisioning", "volume", r.Name, "error", err)
		}
		return fmt.Errorf("CSI driver %q is not ready to undo provisioning %s", op.Provisioner, r.Name)
	}
	return p.undo(ctx, d, r.Name, op, why)
}

// noteRecovery records on the claim's timeline a recovery that took a
// step (its CreateVolume and write PV are recorded by provision): the
// Provision call that began the operation returned before the volume or
// its PV was made, or its replica stopped, and this replica carries it
// on from the journal. A recovery that found the operation finished
// meanwhile did nothing and records nothing (the loop looks every period).
func (p *provisioner) noteRecovery(ctx context.Context, uid, holder string, began time.Time, res result, err error) {
	if p.timeline == nil || (err == nil && res.outcome == provisionerv1.Outcome_OUTCOME_NO_CHANGE && res.message == msgFinishedMeanwhile) {
		return
	}
	by := "this replica"
	if holder == "" {
		by = "a replica that stopped"
	}
	if err != nil {
		p.timeline.Add(ctx, uid, "recover", began, p.now(), status.Code(err).String(),
			fmt.Sprintf("carrying on a provisioning journaled by %s: %v", by, err))
		return
	}
	p.timeline.Add(ctx, uid, "recover", began, p.now(), strings.TrimPrefix(res.outcome.String(), "OUTCOME_"),
		fmt.Sprintf("carried on a provisioning journaled by %s: %s", by, res.message))
}
