package binder

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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

// The spans of a claim's way to the binder (noteSeen).
const (
	// watchSpan: from the claim's creation to the watcher's informer.
	watchSpan = "watch"
	// streamSpan: from the watcher's informer to the binder.
	streamSpan = "stream"
	// seenSpan: both at once, when the watcher sends no observed time (a
	// watcher that predates WatchResponse.observed_unix_nano).
	seenSpan = "seen"
)

const (
	watchDetail  = "created (creationTimestamp: whole seconds, the API server's clock) to delivered by the watcher's informer (the watcher's clock): the API server's watch and the informer"
	streamDetail = "delivered by the watcher's informer to received by the binder: the watcher's stream to the binder"
	seenDetail   = "created (whole seconds), seen by the watcher and streamed to the binder (the watcher sends no observed time: an older watcher)"
	skewDetail   = "; clocks skewed, clamped"
)

// noteSeen records how a claim that is not bound yet reached the binder,
// when its first watch event arrives: from its creation to the watcher's
// informer (watch), and from there to the binder (stream). observed is
// when the watcher's informer delivered the event (watchclient.Event's
// Observed); zero (an older watcher) records the one span seen, from
// creation to now.
func (o *observability) noteSeen(claim *corev1.PersistentVolumeClaim, observed time.Time) {
	if o.timeline == nil || !tracked(claim) || claim.CreationTimestamp.IsZero() {
		return
	}
	uid := string(claim.UID)
	created, seen, now, skewed := seenTimes(claim.CreationTimestamp.Time, observed, time.Now())
	if observed.IsZero() {
		o.timeline.Add(context.Background(), uid, seenSpan, created, now, "", seenDetail)
		return
	}
	wd, sd := watchDetail, streamDetail
	if skewed {
		wd, sd = wd+skewDetail, sd+skewDetail
	}
	o.timeline.Add(context.Background(), uid, watchSpan, created, seen, "", wd)
	o.timeline.Add(context.Background(), uid, streamSpan, seen, now, "", sd)
}

// seenTimes orders the three clocks a claim's arrival is measured with:
// created is the API server's (creationTimestamp, truncated to whole
// seconds, so it is up to a second early), observed the watcher pod's,
// now the binder's. Skew between them can put observed after now or
// before created, or created after now: each is clamped (created to at
// most now, observed between created and now), so that no span has a
// negative duration; skewed says whether any was. The binder's clock wins
// (now is never moved): every later span of the claim is timed by it.
// A zero observed stays zero.
func seenTimes(created, observed, now time.Time) (c, o, n time.Time, skewed bool) {
	if created.After(now) {
		created, skewed = now, true
	}
	if observed.IsZero() {
		return created, observed, now, skewed
	}
	switch {
	case observed.Before(created):
		observed, skewed = created, true
	case observed.After(now):
		observed, skewed = now, true
	}
	return created, observed, now, skewed
}

// noteQueued records how long a claim waited in the queue for its sync.
func (o *observability) noteQueued(ctx context.Context, claim *corev1.PersistentVolumeClaim, since time.Time) {
	if o.timeline == nil || since.IsZero() || !tracked(claim) {
		return
	}
	o.timeline.Add(ctx, string(claim.UID), "queued", since, time.Now(), "", "")
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

// waitSpan is the span of a claim's wait for a pod using it to be
// scheduled (WaitForFirstConsumer).
const waitSpan = "wait for first consumer"

// waitingCode marks the span of a wait still going on when the timeline
// is read: its end is the time of the answer.
const waitingCode = "WAITING"

// consumerWaits holds, per claim UID, since when a claim waits for its
// first consumer: from this replica's first sync that decided
// WAIT_FOR_FIRST_CONSUMER (a replica that takes the claim over starts
// counting at its own first such sync). An entry lives until a sync
// decides otherwise or the claim is deleted. Safe for concurrent use; a
// replica with no claim waiting pays one atomic load per sync.
type consumerWaits struct {
	n     atomic.Int64 // len(since)
	mu    sync.Mutex
	since map[types.UID]time.Time
}

// begin notes that uid waits from now, unless it already did.
func (w *consumerWaits) begin(uid types.UID, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.since[uid]; ok {
		return
	}
	if w.since == nil {
		w.since = map[types.UID]time.Time{}
	}
	w.since[uid] = now
	w.n.Add(1)
}

// end forgets uid's wait and says since when it waited.
func (w *consumerWaits) end(uid types.UID) (time.Time, bool) {
	if w.n.Load() == 0 {
		return time.Time{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.since[uid]
	if ok {
		delete(w.since, uid)
		w.n.Add(-1)
	}
	return t, ok
}

// waiting says since when uid waits, if it does.
func (w *consumerWaits) waiting(uid types.UID) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.since[uid]
	return t, ok
}

// noteWait follows a claim's wait for its first consumer: a sync that
// decides WAIT_FOR_FIRST_CONSUMER starts it (once; not for a claim the
// cache no longer holds, whose deletion already forgot its wait); the
// first sync that decides anything else records it as one span, from its
// start to now, naming the node the scheduler selected. The syncs in
// between record only themselves: the wait is the span that says where
// the time went.
func (c *controller) noteWait(ctx context.Context, claim *corev1.PersistentVolumeClaim, what binderv1.Decision) {
	if c.timeline == nil {
		return
	}
	if what == binderv1.Decision_DECISION_WAIT_FOR_FIRST_CONSUMER {
		if cur := c.store.claim(claimKey(claim)); tracked(claim) && cur != nil && cur.UID == claim.UID {
			c.waits.begin(claim.UID, time.Now())
		}
		return
	}
	since, ok := c.waits.end(claim.UID)
	if !ok {
		return
	}
	detail := "until the claim's sync decided " + decisionName(what)
	if node := claim.Annotations[kube.AnnSelectedNode]; node != "" {
		detail = fmt.Sprintf("until a pod using the claim was scheduled: node %q selected", node)
	}
	c.timeline.Add(ctx, string(claim.UID), waitSpan, since, time.Now(), "", detail)
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
		return nil, a.missingClaim(key)
	}
	if a.c.timeline == nil {
		return nil, status.Error(codes.FailedPrecondition, "this binder records no timeline (started with --timeline=false)")
	}
	uid := string(claim.UID)
	spans, dropped := a.c.timeline.Spans(uid)
	resp := &binderv1.GetClaimTimelineResponse{Claim: claimToAPI(claim), MemberId: a.memberID, Dropped: int32(dropped)}
	if since, ok := a.c.waits.waiting(claim.UID); ok {
		// Still waiting: the span so far, open.
		spans = append(spans, timeline.Span{Name: waitSpan, Code: waitingCode, Start: since.UnixNano(), End: time.Now().UnixNano(),
			Detail: "no pod using the claim has been scheduled yet (no " + kube.AnnSelectedNode + " annotation): the claim binds or is provisioned once one is"})
	}
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
