package provisioner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/reclaimjournal"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// hints is the cache (objectCache) a claim or class sent in a request is
// checked against: a sent object is used only when the cache holds an
// object of the same UID and resourceVersion, and then the cache's copy is
// used, never the bytes sent. A cache that may be behind answers
// errNotCurrent.
type hints interface {
	Claim(namespace, name string) (*corev1.PersistentVolumeClaim, error)
	StorageClass(name string) (*storagev1.StorageClass, error)
	// claimStored returns a channel closed when the cache next stores (or
	// drops) the claim named: readClaim waits a little for a version it
	// does not hold yet.
	claimStored(namespace, name string) <-chan struct{}
}

// newServer is the gRPC server over p, whose claim and StorageClass cache
// is objs: the claims and classes callers send are checked against it
// while it is current, and DeleteVolume's guard asks its claim index which
// claims to read (while it is not, it lists them from the API server).
func newServer(p *provisioner, objs *objectCache) *server {
	return &server{p: p, hints: objs, claims: cacheClaims{client: p.client, cache: objs}, orphans: newOrphanScanner(p)}
}

// hintWait bounds how long readClaim waits for the cache to store the
// version of a claim the caller sent. The binder sends the claim its own
// write returned (the storage-provisioner annotations), which the cache's
// feed brings a few milliseconds later; waiting for it spares the API
// server a quorum read of every provisioned claim. In a burst the feed
// lags the writes by more than 200 ms (issue 40: 0.67 extra claim GETs
// per claim at 200 claims with 200 ms), and the read it then makes is one
// more request to the API server that is behind; the wait ends as soon as
// the version arrives, and at once when the cache is not current.
const hintWait = time.Second

// readClaim returns the claim as the API server has it: the cache's copy
// when it has the UID and resourceVersion of the one sent (waiting up to
// hintWait for it), else a fresh read. The bytes sent are never used.
func (s *server) readClaim(ctx context.Context, namespace, name string, sent *corev1.PersistentVolumeClaim) (*corev1.PersistentVolumeClaim, error) {
	if sent != nil && sent.ResourceVersion != "" {
		look := func() (*corev1.PersistentVolumeClaim, error) {
			c, err := s.hints.Claim(namespace, name)
			if err == nil && (c.UID != sent.UID || c.ResourceVersion != sent.ResourceVersion) {
				c = nil
			}
			return c, err
		}
		var timeout <-chan time.Time
		for {
			c, err := look()
			if c != nil {
				return c.DeepCopy(), nil
			}
			if errors.Is(err, errNotCurrent) {
				break
			}
			stored := s.hints.claimStored(namespace, name)
			if c, _ := look(); c != nil { // stored since the first look
				return c.DeepCopy(), nil
			}
			if timeout == nil {
				t := time.NewTimer(hintWait)
				defer t.Stop()
				timeout = t.C
			}
			select {
			case <-stored:
				continue
			case <-timeout:
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			break
		}
	}
	c, err := s.p.client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, apiStatus(err, "claim "+namespace+"/"+name)
	}
	return c, nil
}

// readClass returns the StorageClass the claim names, as readClaim does.
func (s *server) readClass(ctx context.Context, name string, sent *storagev1.StorageClass) (*storagev1.StorageClass, error) {
	if sent != nil && sent.Name == name && sent.ResourceVersion != "" {
		if c, err := s.hints.StorageClass(name); err == nil && c.UID == sent.UID && c.ResourceVersion == sent.ResourceVersion {
			return c.DeepCopy(), nil
		}
	}
	c, err := s.p.client.StorageV1().StorageClasses().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, apiStatus(err, "StorageClass "+name)
	}
	return c, nil
}

// guardDelete refuses, with FailedPrecondition, to delete the backing
// volume of a PersistentVolume (as the API server has it) that is not
// Released or Failed, whose policy is not Delete, or that a live claim
// points at.
func (s *server) guardDelete(ctx context.Context, pv *corev1.PersistentVolume) error {
	err := guard.Volume(pv, corev1.PersistentVolumeReclaimDelete)
	if err == nil {
		err = guard.LiveClaim(ctx, s.claims, pv)
	}
	var refused *guard.Refusal
	switch {
	case err == nil:
		return nil
	case errors.As(err, &refused):
		return status.Errorf(codes.FailedPrecondition, "not deleting the backing volume of %s: %s", pv.Name, refused.Reason)
	}
	return apiStatus(err, "the claims of PersistentVolume "+pv.Name)
}

var (
	// errRecreated: the volume a caller sent is not the one whose
	// deletion is journaled.
	errRecreated = errors.New("the volume was recreated")
	// errBadRecord: a journal record this provisioner cannot read.
	errBadRecord = errors.New("unreadable journal record")
)

// deleteJournaled finishes a deletion of a PersistentVolume that is gone,
// from the copy of the volume in its reclaim record (pkg/reclaimjournal),
// which the reclaimer wrote, after its own guard, right before it first
// asked for the deletion; never from a volume a caller sent. found is false
// when no deletion of the volume is in flight there.
func (p *provisioner) deleteJournaled(ctx context.Context, name string, sent *corev1.PersistentVolume) (res result, found bool, err error) {
	rec, ok, err := p.journal.Get(ctx, reclaimjournal.Kind, name)
	if err != nil || !ok {
		return result{}, false, err
	}
	r, err := reclaimjournal.Decode(rec)
	if err != nil {
		return result{}, false, fmt.Errorf("%w: %w", errBadRecord, err)
	}
	pv, err := reclaimjournal.Deleting(r)
	if err != nil {
		return result{}, false, fmt.Errorf("%w: %w", errBadRecord, err)
	}
	if pv == nil {
		return result{}, false, nil
	}
	if sent != nil && sent.UID != pv.UID {
		return result{}, true, fmt.Errorf("%w: the volume sent has uid %s, the journaled deletion is of uid %s", errRecreated, sent.UID, pv.UID)
	}
	d := p.drivers.byDriver(pv.Spec.CSI.Driver)
	switch {
	case d == nil:
		return result{}, true, fmt.Errorf("CSI driver %q of the journaled deletion of %s is %w", pv.Spec.CSI.Driver, name, errNotServed)
	case !d.ready():
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: fmt.Sprintf("CSI driver %q is not ready: %s", d.name(), d.current().info.GetMessage())}, true, nil
	case !p.begin(kindDelete, name):
		return result{outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, message: "an attempt to delete " + name + " is running"}, true, nil
	}
	defer p.end(kindDelete, name)
	return p.runDelete(ctx, d, name, pv.Spec.CSI.VolumeHandle, p.deletionSecret(ctx, pv)), true, nil
}

// apiStatus turns an API server error reading what into a gRPC status.
func apiStatus(err error, what string) error {
	switch {
	case apierrors.IsNotFound(err):
		return status.Errorf(codes.NotFound, "%s not found", what)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return status.Errorf(codes.InvalidArgument, "read %s: %v", what, err)
	case apierrors.IsForbidden(err):
		return status.Errorf(codes.PermissionDenied, "read %s: %v", what, err)
	default:
		return status.Errorf(codes.Unavailable, "read %s: %v", what, err)
	}
}
