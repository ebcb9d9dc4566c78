package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/metrics"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// sync takes the next step of a held reclaim. It re-reads the volume from
// the API server and decides again from what it finds, so it is
// idempotent and resumes any reclaim from its record. nil means done or
// waiting for an event (a recycler pod's status); an error is retried with
// backoff.
func (c *controller) sync(ctx context.Context, r *reclaimerv1.Reclaim) error {
	v, err := c.kube.GetVolume(ctx, r.VolumeName)
	if apierrors.IsNotFound(err) {
		v, err = nil, nil
	}
	if err != nil {
		return c.transient(ctx, r, fmt.Errorf("read volume %s: %w", r.VolumeName, err))
	}
	if v == nil || string(v.UID) != r.VolumeUid {
		c.removePod(ctx, r)
		if r.DataRemoved && r.Method == reclaimerv1.Method_METHOD_PROVISIONER {
			return c.finish(ctx, r, reclaimerv1.State_STATE_SUCCEEDED, "the backing volume is deleted and the PersistentVolume is gone")
		}
		if v == nil && r.Method == reclaimerv1.Method_METHOD_PROVISIONER {
			if err := c.finishGone(ctx, r); !errors.Is(err, errNothingInFlight) {
				return err
			}
		}
		return c.finish(ctx, r, reclaimerv1.State_STATE_CANCELLED, "the volume is gone (deleted, or recreated with another UID) before its reclaim finished")
	}
	if r.DataRemoved && isRecycle(r) && !claimRefBound(v) {
		// The claimRef was cleared already; only the phase may be left.
		return c.makeAvailable(ctx, r)
	}
	if why := notReleased(v, r); why != "" {
		c.removePod(ctx, r)
		return c.finish(ctx, r, reclaimerv1.State_STATE_CANCELLED, why)
	}
	p := c.plan(ctx, v)
	switch {
	case !p.acts():
		c.removePod(ctx, r)
		return c.finish(ctx, r, p.state, p.message)
	case p.method == reclaimerv1.Method_METHOD_UNSPECIFIED:
		r.Message = p.message
		return c.recordAndRetry(ctx, r, errors.New(p.message))
	case p.method == reclaimerv1.Method_METHOD_UNSUPPORTED:
		r.Method = p.method
		return c.fail(ctx, r, v, p.reason, p.message)
	}
	if r.Method != p.method || r.Driver != p.driver || r.Policy != string(v.Spec.PersistentVolumeReclaimPolicy) {
		c.removePod(ctx, r)
		r.Method, r.Driver, r.Policy, r.DataRemoved = p.method, p.driver, string(v.Spec.PersistentVolumeReclaimPolicy), false
		r.DeletingVolume = nil
		r.RecyclerPod, r.RecyclerPodUid = "", ""
	}
	switch p.method {
	case reclaimerv1.Method_METHOD_PROVISIONER:
		return c.deleteBacking(ctx, r, v)
	case reclaimerv1.Method_METHOD_RECYCLER_POD:
		return c.recycleWithPod(ctx, r, v)
	case reclaimerv1.Method_METHOD_NODE_LOCAL:
		return c.recycleOnNode(ctx, r, v)
	}
	return fmt.Errorf("no way to carry out method %s", p.method)
}

func isRecycle(r *reclaimerv1.Reclaim) bool {
	return r.Method == reclaimerv1.Method_METHOD_RECYCLER_POD || r.Method == reclaimerv1.Method_METHOD_NODE_LOCAL
}

// claimRefBound: the volume's claimRef names a claim by UID (a bind, not a
// user's pre-bind by name alone).
func claimRefBound(v *corev1.PersistentVolume) bool {
	return v.Spec.ClaimRef != nil && v.Spec.ClaimRef.UID != ""
}

// notReleased says why the volume no longer needs this reclaim, or "".
func notReleased(v *corev1.PersistentVolume, r *reclaimerv1.Reclaim) string {
	switch {
	case v.Status.Phase != corev1.VolumeReleased && v.Status.Phase != corev1.VolumeFailed:
		return fmt.Sprintf("the volume is %s, no longer Released", phaseName(v.Status.Phase))
	case v.Spec.ClaimRef == nil:
		return "the volume's claimRef was cleared"
	case string(v.Spec.ClaimRef.UID) != r.ClaimUid:
		return fmt.Sprintf("the volume's claimRef now names claim %s/%s (uid %q), not the released one",
			v.Spec.ClaimRef.Namespace, v.Spec.ClaimRef.Name, v.Spec.ClaimRef.UID)
	}
	return ""
}

// begin records that a destructive step starts. The journal write is
// fenced on the reclaim's lock: a replica that lost it stops here.
func (c *controller) begin(ctx context.Context, r *reclaimerv1.Reclaim, what string) error {
	r.State, r.Message, r.NextAttemptTime = reclaimerv1.State_STATE_RUNNING, what, nil
	r.Attempts++
	if err := c.save(ctx, r); err != nil {
		return err
	}
	c.log.Info("reclaim step", "volume", r.VolumeName, logging.ClaimRef(r.ClaimNamespace, r.ClaimName, r.ClaimUid), "step", what, "attempt", r.Attempts)
	return nil
}

// recordAndRetry records the reclaim's state and message, then has the
// step retried after the backoff.
func (c *controller) recordAndRetry(ctx context.Context, r *reclaimerv1.Reclaim, err error) error {
	if serr := c.save(ctx, r); serr != nil {
		return serr
	}
	return recorded{err}
}

// transient records an error that the next attempt may not meet (the API
// server, the provisioner, a driver still working); the volume's phase is
// left alone.
func (c *controller) transient(ctx context.Context, r *reclaimerv1.Reclaim, err error) error {
	r.Message = err.Error()
	return c.recordAndRetry(ctx, r, err)
}

// fail is a reclaim that failed: the volume goes Failed with a Warning
// Event (reason as Kubernetes gives it), and the reclaim is retried with
// backoff.
func (c *controller) fail(ctx context.Context, r *reclaimerv1.Reclaim, v *corev1.PersistentVolume, reason, msg string) error {
	r.State, r.Message = reclaimerv1.State_STATE_FAILED, msg
	if err := c.save(ctx, r); err != nil {
		return err
	}
	if err := c.markFailed(ctx, v, reason, msg); err != nil {
		return fmt.Errorf("%s; and marking the volume Failed: %w", msg, err)
	}
	reclaimFailures.WithLabelValues(r.Policy, reason).Inc()
	if r.Policy == string(corev1.PersistentVolumeReclaimDelete) {
		metrics.VolumeOperationFailed(r.Driver, metrics.OperationDelete)
	}
	return recorded{failedStep{msg}}
}

// markFailed sets the volume's phase Failed with the message and emits the
// Event, once per new message (Kubernetes emits it on the change to
// Failed).
//
// In standalone mode the phase is kube-controller-manager's to set:
// external-provisioner only emits the Event, at every failed attempt, and
// so does the reclaimer.
func (c *controller) markFailed(ctx context.Context, v *corev1.PersistentVolume, reason, msg string) error {
	if c.cfg.standalone {
		c.recorder.Event(v, corev1.EventTypeWarning, reason, msg)
		return nil
	}
	if v.Status.Phase == corev1.VolumeFailed && v.Status.Message == msg {
		return nil
	}
	clone := v.DeepCopy()
	clone.Status.Phase, clone.Status.Message = corev1.VolumeFailed, msg
	updated, err := c.kube.UpdateVolumeStatus(ctx, clone)
	if err != nil {
		return err
	}
	c.recorder.Event(updated, corev1.EventTypeWarning, reason, msg)
	c.log.Info("volume Failed", "volume", v.Name, "reason", reason, "message", msg)
	return nil
}

// refusal is a destructive step refused because the volume is still in
// use; it is tried again after the backoff.
type refusal struct {
	reason string
	pods   []string // pods using the released claim (Recycle)
}

func (e *refusal) Error() string { return e.reason }

// cancellation: the reclaim is not needed any more; gone says why: the
// volume does not exist.
type cancellation struct {
	reason string
	gone   bool
}

func (e *cancellation) Error() string { return e.reason }

// guard re-reads the volume and the claims from the API server right
// before a destructive step and refuses it while a live claim points at
// the volume (guard.LiveClaim: the claim of its claimRef exists with the
// same UID, or any claim not being deleted asks for the volume by
// spec.volumeName, e.g. a claim recreated with the old name, pre-bound to
// the volume) or its policy no longer asks for the step. With pods,
// it also refuses while a pod that has not terminated uses the released
// claim. It returns the volume as read.
func (c *controller) guard(ctx context.Context, r *reclaimerv1.Reclaim, pods bool) (*corev1.PersistentVolume, error) {
	v, err := c.kube.GetVolume(ctx, r.VolumeName)
	switch {
	case apierrors.IsNotFound(err):
		return nil, &cancellation{reason: "the volume is gone", gone: true}
	case err != nil:
		return nil, fmt.Errorf("read volume %s: %w", r.VolumeName, err)
	case string(v.UID) != r.VolumeUid:
		return nil, &cancellation{reason: "the volume was recreated with another UID"}
	}
	if why := notReleased(v, r); why != "" {
		return nil, &cancellation{reason: why}
	}
	if err := guard.LiveClaim(ctx, c.kube, v); err != nil {
		var refused *guard.Refusal
		if errors.As(err, &refused) {
			return nil, &refusal{reason: refused.Reason}
		}
		return nil, err
	}
	// Defence in depth: the plan chose the step from the policy; a policy
	// changed since is planned again after the backoff.
	allowed := corev1.PersistentVolumeReclaimRecycle
	if r.Method == reclaimerv1.Method_METHOD_PROVISIONER {
		allowed = corev1.PersistentVolumeReclaimDelete
	}
	if err := guard.Volume(v, allowed); err != nil {
		return nil, &refusal{reason: err.Error()}
	}
	ref := v.Spec.ClaimRef
	if pods {
		using, err := c.podsUsing(ctx, ref.Namespace, ref.Name)
		if err != nil {
			return nil, err
		}
		if len(using) > 0 {
			return nil, &refusal{reason: "Volume is used by pods: " + strings.Join(using, ","), pods: using}
		}
	}
	return v, nil
}

// podsUsing lists the pods, not terminated, that mount the claim.
func (c *controller) podsUsing(ctx context.Context, namespace, claim string) ([]string, error) {
	pods, err := c.kube.ListPods(ctx, namespace)
	if err != nil {
		return nil, fmt.Errorf("list pods in %s: %w", namespace, err)
	}
	var out []string
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, vol := range p.Spec.Volumes {
			if vol.PersistentVolumeClaim != nil && vol.PersistentVolumeClaim.ClaimName == claim {
				out = append(out, p.Namespace+"/"+p.Name)
				break
			}
		}
	}
	return out, nil
}

// blocked handles a guard that did not let a step go: a cancellation
// finishes the reclaim, a refusal waits (PENDING) and retries, anything
// else is transient.
func (c *controller) blocked(ctx context.Context, r *reclaimerv1.Reclaim, err error) error {
	var cancelled *cancellation
	var refused *refusal
	switch {
	case errors.As(err, &cancelled):
		c.removePod(ctx, r)
		return c.finish(ctx, r, reclaimerv1.State_STATE_CANCELLED, cancelled.reason)
	case errors.As(err, &refused):
		r.State, r.Message = reclaimerv1.State_STATE_PENDING, "refused, will check again: "+refused.reason
		if len(refused.pods) > 0 {
			c.recorder.Event(volumeRef(r), corev1.EventTypeNormal, kube.EventVolumeFailedRecycle, refused.reason)
		}
		c.log.Info("reclaim step refused", "volume", r.VolumeName, logging.ClaimRef(r.ClaimNamespace, r.ClaimName, r.ClaimUid), "why", refused.reason)
		return c.recordAndRetry(ctx, r, err)
	}
	return c.transient(ctx, r, err)
}

// volumeRef is the volume as the object of an Event.
func volumeRef(r *reclaimerv1.Reclaim) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "PersistentVolume", APIVersion: "v1", Name: r.VolumeName, UID: types.UID(r.VolumeUid)}
}

// makeAvailable finishes a Recycle once the data is scrubbed: the claimRef
// is cleared (and bound-by-controller dropped; a user's pre-bind keeps the
// claim's name and loses only the UID, as Kubernetes does), the phase set
// Available, a VolumeRecycled Event emitted.
func (c *controller) makeAvailable(ctx context.Context, r *reclaimerv1.Reclaim) error {
	for range 3 {
		v, err := c.kube.GetVolume(ctx, r.VolumeName)
		switch {
		case apierrors.IsNotFound(err) || err == nil && string(v.UID) != r.VolumeUid:
			return c.finish(ctx, r, reclaimerv1.State_STATE_SUCCEEDED, "the volume was scrubbed; its PersistentVolume is gone")
		case err != nil:
			return c.transient(ctx, r, fmt.Errorf("read volume %s: %w", r.VolumeName, err))
		}
		if claimRefBound(v) {
			if string(v.Spec.ClaimRef.UID) != r.ClaimUid {
				return c.finish(ctx, r, reclaimerv1.State_STATE_CANCELLED, notReleased(v, r))
			}
			if _, err := c.guard(ctx, r, false); err != nil {
				return c.blocked(ctx, r, err)
			}
			clone := v.DeepCopy()
			if _, ok := clone.Annotations[kube.AnnBoundByController]; ok {
				clone.Spec.ClaimRef = nil
				delete(clone.Annotations, kube.AnnBoundByController)
			} else {
				clone.Spec.ClaimRef.UID = ""
			}
			if v, err = c.kube.UpdateVolume(ctx, clone); apierrors.IsConflict(err) {
				continue
			} else if err != nil {
				return c.transient(ctx, r, fmt.Errorf("clear the claimRef of volume %s: %w", r.VolumeName, err))
			}
		}
		if v.Status.Phase != corev1.VolumeAvailable && v.Status.Phase != corev1.VolumeBound {
			clone := v.DeepCopy()
			clone.Status.Phase, clone.Status.Message = corev1.VolumeAvailable, ""
			if v, err = c.kube.UpdateVolumeStatus(ctx, clone); apierrors.IsConflict(err) {
				continue
			} else if err != nil {
				return c.transient(ctx, r, fmt.Errorf("set volume %s Available: %w", r.VolumeName, err))
			}
		}
		c.recorder.Event(v, corev1.EventTypeNormal, kube.EventVolumeRecycled, "Volume recycled")
		return c.finish(ctx, r, reclaimerv1.State_STATE_SUCCEEDED, "recycled: the data is scrubbed and the volume is Available")
	}
	return c.transient(ctx, r, fmt.Errorf("volume %s changed under every update; trying again", r.VolumeName))
}
