package provisioner

import (
	"context"
	"encoding/json"
	"time"

	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/reclaimjournal"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// journal is what the provisioner needs of etcd: operation records fenced
// on per-operation locks (pkg/coord).
type journal interface {
	Acquire(ctx context.Context, kind, name, holder string) error
	AcquireGet(ctx context.Context, kind, name, holder string) (coord.Record, bool, error)
	Unlock(ctx context.Context, kind, name, holder string) error
	Put(ctx context.Context, kind, name, holder string, value []byte) error
	Finish(ctx context.Context, kind, name, holder string) error
	List(ctx context.Context, kind string) ([]coord.Record, error)
	Get(ctx context.Context, kind, name string) (coord.Record, bool, error)
}

var _ journal = (*coord.Coordinator)(nil)

// Journal kinds.
const (
	kindProvision = "provision"
	kindDelete    = "delete"
)

// provisionOp is the journal record of a provisioning: written before
// CreateVolume is first called and removed once the PV exists, or once the
// volume is known not to exist (a final error, or undone after the claim
// went away). Its request is reused on every retry, so the driver always
// sees the same name and parameters.
type provisionOp struct {
	ClaimNamespace string     `json:"claimNamespace"`
	ClaimName      string     `json:"claimName"`
	ClaimUID       string     `json:"claimUID"`
	Class          string     `json:"class"`
	Provisioner    string     `json:"provisioner"`
	Request        []byte     `json:"request"` // csi.CreateVolumeRequest without secrets
	Secret         *secretRef `json:"secret,omitempty"`
	Attempts       int32      `json:"attempts"`
	LastError      string     `json:"lastError,omitempty"`
	Start          time.Time  `json:"start"`
	// LastCode and LastMessage are the gRPC code and message of the last
	// error (the driver's, or Unknown for one before the call), and
	// LastAttempt when that attempt ended, for ListOperations and explain.
	LastCode    string    `json:"lastCode,omitempty"`
	LastMessage string    `json:"lastMessage,omitempty"`
	LastAttempt time.Time `json:"lastAttempt,omitzero"`
	// Node is, for a node-deployed driver, the node whose sidecar is asked
	// (the claim's selected node, or the one an Immediate claim was placed
	// on): every attempt of the journaled request goes there.
	Node string `json:"node,omitempty"`
}

// failed records the error an attempt ended with.
func (op *provisionOp) failed(err error, now time.Time) {
	st := status.Convert(err)
	op.LastError, op.LastCode, op.LastMessage, op.LastAttempt = err.Error(), st.Code().String(), st.Message(), now
}

// deletion is a deletion of a backing volume in flight, as its reclaim
// record journals it (pkg/reclaimjournal): the reclaim, and the volume as
// it was when the deletion began.
type deletion struct {
	reclaim *reclaimerv1.Reclaim
	volume  *corev1.PersistentVolume
}

// deletions lists the deletions in flight, of every driver. A record that
// does not decode is skipped: it is the reclaimer's to report.
func (p *provisioner) deletions(ctx context.Context) ([]deletion, error) {
	recs, err := p.journal.List(ctx, reclaimjournal.Kind)
	if err != nil {
		return nil, err
	}
	var out []deletion
	for _, rec := range recs {
		r, err := reclaimjournal.Decode(rec)
		if err != nil {
			continue
		}
		if v, err := reclaimjournal.Deleting(r); err == nil && v != nil {
			out = append(out, deletion{reclaim: r, volume: v})
		}
	}
	return out, nil
}

func (p *provisioner) put(ctx context.Context, kind, name string, op any) error {
	b, err := json.Marshal(op)
	if err != nil {
		return err
	}
	return p.journal.Put(ctx, kind, name, p.member, b)
}

// operations lists the journal for ListOperations.
func (p *provisioner) operations(ctx context.Context, kind string) ([]*provisionerv1.Operation, error) {
	var out []*provisionerv1.Operation
	if kind == "" || kind == kindProvision {
		recs, err := p.journal.List(ctx, kindProvision)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			if o := provisionOperation(r); o != nil {
				out = append(out, o)
			}
		}
	}
	if kind == "" || kind == kindDelete {
		dels, err := p.deletions(ctx)
		if err != nil {
			return nil, err
		}
		for _, d := range dels {
			r := d.reclaim
			o := &provisionerv1.Operation{Kind: kindDelete, VolumeName: r.VolumeName, Attempts: r.Attempts,
				StartTime: r.CreateTime, Owner: r.Owner, Provisioner: d.volume.Spec.CSI.Driver}
			if r.Message != reclaimjournal.DeletingMessage {
				o.LastError, o.LastAttemptTime = r.Message, r.UpdateTime
			}
			out = append(out, o)
		}
	}
	return out, nil
}

// claimOperation is the provisioning of the claim with uid in the journal,
// nil when there is none: one read, its volume's name derives from the UID.
func (p *provisioner) claimOperation(ctx context.Context, uid string) (*provisionerv1.Operation, error) {
	var r coord.Record
	for _, n := range p.namings() {
		name := n.name(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}})
		rec, ok, err := p.journal.Get(ctx, kindProvision, name)
		if err != nil {
			return nil, err
		}
		if ok {
			r = rec
			break
		}
	}
	if r.Name == "" {
		return nil, nil
	}
	o := provisionOperation(r)
	if o == nil || o.ClaimUid != uid {
		return nil, nil
	}
	return o, nil
}

// provisionOperation is a provisioning record as ListOperations shows it,
// nil when it does not decode.
func provisionOperation(r coord.Record) *provisionerv1.Operation {
	var op provisionOp
	if err := json.Unmarshal(r.Value, &op); err != nil {
		return nil
	}
	return &provisionerv1.Operation{Kind: kindProvision, VolumeName: r.Name, ClaimNamespace: op.ClaimNamespace,
		ClaimName: op.ClaimName, ClaimUid: op.ClaimUID, Attempts: op.Attempts, LastError: op.LastError,
		StartTime: timestamp(op.Start), Owner: r.Holder, Provisioner: op.Provisioner,
		LastErrorCode: op.LastCode, LastErrorMessage: op.LastMessage, LastAttemptTime: timestamp(op.LastAttempt)}
}
