package binder

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/timeline"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// provisionerTimeline is what the binder asks the provisioner for a
// claim's timeline.
type provisionerTimeline interface {
	Timeline(ctx context.Context, claimUID string) (*provisionerv1.GetClaimTimelineResponse, error)
}

var _ provisionerTimeline = (*provisionerClient)(nil)

// Timeline asks the provisioner for the steps it took for the claim.
func (p *provisionerClient) Timeline(ctx context.Context, uid string) (*provisionerv1.GetClaimTimelineResponse, error) {
	return p.c.GetClaimTimeline(ctx, &provisionerv1.GetClaimTimelineRequest{ClaimUid: uid})
}

// tracked reports whether a claim's steps go to its timeline: until it is
// bound. The syncs of a bound claim (every resync) would push the steps
// that bound it out of its bounded timeline, and say nothing.
func tracked(claim *corev1.PersistentVolumeClaim) bool {
	return claim.Status.Phase != corev1.ClaimBound || !metav1.HasAnnotation(claim.ObjectMeta, kube.AnnBindCompleted)
}

// decisionName is a decision without its enum prefix ("BIND").
func decisionName(d binderv1.Decision) string {
	return strings.TrimPrefix(d.String(), "DECISION_")
}

// decisionDetail says what a sync decided, as explain words it.
func decisionDetail(d decision) string {
	switch {
	case d.event.message != "":
		return d.event.message
	case d.volume != nil:
		return "volume " + d.volume.Name
	case d.err != nil:
		return d.err.Error()
	case d.through.Provisioner != "":
		return "provisioned by " + d.through.Provisioner
	}
	return ""
}

// noteSeen records when the binder first saw a claim that is not bound
// yet: from its creation to its watch event's arrival (the watcher's
// informer, the stream and the binder's cache in between).
func (c *controller) noteSeen(claim *corev1.PersistentVolumeClaim) {
	if c.timeline == nil || !tracked(claim) || claim.CreationTimestamp.IsZero() {
		return
	}
	c.timeline.Add(context.Background(), string(claim.UID), "seen", claim.CreationTimestamp.Time, time.Now(), "",
		"created (whole seconds), seen by the watcher and streamed to the binder")
}

// noteQueued records how long a claim waited in the queue for its sync.
func (c *controller) noteQueued(ctx context.Context, claim *corev1.PersistentVolumeClaim, since time.Time) {
	if c.timeline == nil || since.IsZero() || !tracked(claim) {
		return
	}
	c.timeline.Add(ctx, string(claim.UID), "queued", since, time.Now(), "", "")
}

// noteRetry records a claim's backoff after a failed step: the span is
// the wait, from now to the retry.
func (c *controller) noteRetry(ctx context.Context, key, reason, why string, delay time.Duration) {
	if c.timeline == nil {
		return
	}
	claim := c.store.claim(key)
	if claim == nil || !tracked(claim) {
		return
	}
	now := time.Now()
	c.timeline.Add(ctx, string(claim.UID), "backoff", now, now.Add(delay), reason, why)
}

// GetClaimTimeline implements BinderService: the claim's owner answers
// with its own spans and the provisioner's, by start time.
func (a *api) GetClaimTimeline(ctx context.Context, req *binderv1.GetClaimTimelineRequest) (*binderv1.GetClaimTimelineResponse, error) {
	key, err := a.claimRequest(req.GetNamespace(), req.GetName())
	if err != nil {
		return nil, err
	}
	if resp, forwarded, err := atOwner(ctx, a.peers, "pvc/"+key, func(owner binderv1.BinderServiceClient, ctx context.Context) (*binderv1.GetClaimTimelineResponse, error) {
		return owner.GetClaimTimeline(ctx, req)
	}); forwarded {
		return resp, err
	}
	claim := a.c.store.claim(key)
	if claim == nil {
		return nil, status.Errorf(codes.NotFound, "claim %s not found", key)
	}
	uid := string(claim.UID)
	spans, dropped := a.c.timeline.Spans(uid)
	resp := &binderv1.GetClaimTimelineResponse{Claim: claimToAPI(claim), MemberId: a.memberID, Dropped: int32(dropped)}
	resp.Spans = timeline.ToAPI(spans, Service, a.memberID)
	if a.ptl != nil {
		actx, cancel := context.WithTimeout(ctx, askTimeout)
		pr, err := a.ptl.Timeline(actx, uid)
		cancel()
		if err != nil {
			resp.Missing = append(resp.Missing, fmt.Sprintf("provisioner: %s", status.Convert(err).Message()))
		} else {
			resp.Spans = append(resp.Spans, pr.GetSpans()...)
			resp.Dropped += pr.GetDropped()
		}
	}
	slices.SortStableFunc(resp.Spans, func(x, y *provisionerv1.TimelineSpan) int {
		if c := x.GetStartTime().AsTime().Compare(y.GetStartTime().AsTime()); c != 0 {
			return c
		}
		return x.GetEndTime().AsTime().Compare(y.GetEndTime().AsTime())
	})
	return resp, nil
}
