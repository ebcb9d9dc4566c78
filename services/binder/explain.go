package binder

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/match"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// provisionerInfo is what explain and match ask the provisioner service.
type provisionerInfo interface {
	// Drivers lists the drivers it serves, now.
	Drivers(ctx context.Context) ([]*provisionerv1.Driver, error)
	// Operation is the journaled provisioning of a claim, nil when none.
	Operation(ctx context.Context, claimUID string) (*provisionerv1.Operation, error)
	// Plan is the CreateVolume request it would send for a claim.
	Plan(ctx context.Context, claim *corev1.PersistentVolumeClaim) (*provisionerv1.PlanVolumeResponse, error)
}

var _ provisionerInfo = (*provisionerClient)(nil)

// Pages of candidates.
const (
	defaultCandidates = 100
	maxCandidates     = 1000
)

// askTimeout bounds each question explain and match ask another service
// or the API server.
const askTimeout = 5 * time.Second

func candidatePageSize(n int32) (int, error) {
	switch {
	case n < 0 || n > maxCandidates:
		return 0, status.Errorf(codes.InvalidArgument, "page_size %d is out of range: use 1 to %d, or 0 for the default %d", n, maxCandidates, defaultCandidates)
	case n == 0:
		return defaultCandidates, nil
	}
	return int(n), nil
}

// pageToken is where the next page of candidates starts: after a position
// in the binder's order, at a rank.
type pageToken struct {
	After position `json:"a"`
	Rank  int      `json:"k"`
}

func (t pageToken) encode() string {
	b, _ := json.Marshal(t)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePageToken(s string) (*pageToken, error) {
	if s == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	var t pageToken
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	if err != nil || t.Rank < 0 || t.After.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "page_token is not one this API gave: pass next_page_token of the previous answer, or nothing for the first page")
	}
	return &t, nil
}

// view is what the binder's index says of a claim: the volume the binder
// binds it to now (the choice findAndReserve makes), and a page of the
// candidates walk visits, each with the first rule it breaks.
type view struct {
	best  *corev1.PersistentVolume
	fit   *match.Fit
	page  []candidate
	first int // rank of page[0]
	total int
	next  *pageToken
}

// explainIndex reads the index for claim c under one read lock: the
// binder's choice (bestLocked, as findAndReserve) and a page of the
// candidates in its order. node and nodeLabels, when set, are the claim's
// selected node, for RuleNodeAffinity (which never changes the choice).
func (s *store) explainIndex(c *corev1.PersistentVolumeClaim, delay bool, node string, nodeLabels map[string]string, from *pageToken, size int, now time.Time) (*view, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	fit, err := match.NewFit(c)
	if err != nil {
		return nil, err
	}
	best, err := s.bestLocked(c, delay, now)
	if err != nil {
		return nil, err
	}
	if nodeLabels != nil {
		fit = fit.WithNode(node, nodeLabels)
	}
	out := &view{best: best, fit: fit, first: 1, total: len(s.byClaimRef[claimKey(c)])}
	for _, l := range s.free[match.ClaimClass(c)] {
		out.total += len(l.entries)
	}
	o := walkOptions{delay: delay, now: now, all: true}
	if from != nil {
		o.after, out.first = &from.After, from.Rank+1
	}
	s.walk(fit, o, func(cd candidate) bool {
		if len(out.page) == size {
			last := out.page[len(out.page)-1].v
			out.next = &pageToken{After: at(last), Rank: out.first + len(out.page) - 1}
			return false
		}
		out.page = append(out.page, cd)
		return true
	})
	return out, nil
}

// verdict is what explain and match find about a claim.
type verdict struct {
	decision     binderv1.Decision
	message      string
	wouldBind    string
	index        *view
	binding      *binderv1.Binding
	provisioning bool // the provisioning side matters
}

// explainView is the cache as explain and match read it: choose reserves
// nothing, and keeps the page of candidates the binder's walk visits, each
// with the first rule it breaks (explainIndex).
type explainView struct {
	syncView // its nodes read the selected node's labels (controller.nodeLabels)
	from     *pageToken
	size     int
	index    *view // choose's page; nil when decide did not choose
}

func (v *explainView) choose(claim *corev1.PersistentVolumeClaim, delay bool) (*corev1.PersistentVolume, error) {
	node, labels := "", map[string]string(nil)
	if n := claim.Annotations[kube.AnnSelectedNode]; delay && n != "" {
		node, labels = n, v.nodeLabels(n)
	}
	ix, err := v.explainIndex(claim, delay, node, labels, v.from, v.size, time.Now())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "the claim's selector: %v", err)
	}
	v.index = ix
	return ix.best, nil
}

// judge is the sync's decision for claim (decide), as explain and match
// report it, with a page of the candidates of an unbound claim. It reads
// only the cache, and the claim's selected Node when binding is delayed.
func (c *controller) judge(ctx context.Context, claim *corev1.PersistentVolumeClaim, from *pageToken, size int) (*verdict, error) {
	ev := &explainView{syncView: syncView{c.store, c.pods, func(node string) map[string]string { return c.nodeLabels(ctx, node) }, c.reservations},
		from: from, size: size}
	d, err := decide(claim, ev)
	if err != nil {
		if _, ok := status.FromError(err); !ok {
			err = status.Error(codes.FailedPrecondition, err.Error()) // the class's volumeBindingMode
		}
		return nil, err
	}
	v := &verdict{decision: d.what, message: d.why, index: ev.index,
		provisioning: d.what == binderv1.Decision_DECISION_WAIT_FOR_FIRST_CONSUMER || d.what == binderv1.Decision_DECISION_PROVISION}
	if d.what == binderv1.Decision_DECISION_BIND || d.what == binderv1.Decision_DECISION_REBIND {
		v.wouldBind = d.volume.Name
	}
	if _, done := claim.Annotations[kube.AnnBindCompleted]; done && d.volume != nil {
		v.binding = bindingOf(claim, d.volume)
		if d.what == binderv1.Decision_DECISION_BOUND {
			v.message = v.binding.GetMessage()
		}
	}
	if ix := ev.index; ix != nil && ix.total == 0 && ix.best == nil {
		v.message += fmt.Sprintf(" (no volume of StorageClass %q is free, and none names the claim)", match.ClaimClass(claim))
	}
	return v, nil
}

// bindingOf says how claim and volume were bound, from their
// bound-by-controller and provisioned-by annotations.
func bindingOf(claim *corev1.PersistentVolumeClaim, volume *corev1.PersistentVolume) *binderv1.Binding {
	b := &binderv1.Binding{
		VolumeName:              volume.Name,
		ClaimBoundByController:  metav1.HasAnnotation(claim.ObjectMeta, kube.AnnBoundByController),
		VolumeBoundByController: metav1.HasAnnotation(volume.ObjectMeta, kube.AnnBoundByController),
		ProvisionedBy:           volume.Annotations[kube.AnnDynamicallyProvisioned],
		VolumePhase:             string(volume.Status.Phase),
	}
	switch {
	case !b.ClaimBoundByController && b.VolumeBoundByController:
		b.Message = fmt.Sprintf("pre-bound: the claim named volume %s (spec.volumeName); the binder set the volume's claimRef", volume.Name)
	case !b.ClaimBoundByController:
		b.Message = fmt.Sprintf("pre-bound both ways: the claim named volume %s and the volume's claimRef named the claim", volume.Name)
	case b.ProvisionedBy != "" && !b.VolumeBoundByController:
		b.Message = fmt.Sprintf("by the controller: %s provisioned volume %s for the claim, and the binder bound the claim to it", b.ProvisionedBy, volume.Name)
	case !b.VolumeBoundByController:
		b.Message = fmt.Sprintf("by the controller, to a pre-bound volume: the claimRef of volume %s named the claim, and the binder bound the claim to it", volume.Name)
	default:
		b.Message = fmt.Sprintf("by the controller: the binder chose volume %s as the best match and bound both", volume.Name)
	}
	return b
}

// nodeLabels reads the labels of the claim's selected node for
// RuleNodeAffinity; nil when the node cannot be read (the rule is then not
// evaluated).
func (c *controller) nodeLabels(ctx context.Context, name string) map[string]string {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	n, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		c.log.Debug("explain: read the selected node", "node", name, "error", err)
		return nil
	}
	return n.Labels
}

// provisioningOf is the provisioning side of claim: its class, whether and
// by which driver volplane serves it (asked of the provisioner now), and,
// for a claim that exists (live), the journaled operation and this
// replica's Provision calls.
func (c *controller) provisioningOf(ctx context.Context, prov provisionerInfo, claim *corev1.PersistentVolumeClaim, live bool) *binderv1.Provisioning {
	name := match.ClaimClass(claim)
	p := &binderv1.Provisioning{StorageClassName: name, SelectedNode: claim.Annotations[kube.AnnSelectedNode]}
	class := c.store.class(name)
	if class == nil {
		p.Message = fmt.Sprintf("storageclass.storage.k8s.io %q not found", name)
		return p
	}
	// The name provisioning goes through, as sync decides it: a migrated
	// in-tree plugin's CSI driver, or the failure of one nothing serves.
	through := kube.DecideProvisioning(class, claim)
	p.ClassFound, p.Provisioner = true, through.Provisioner
	if m := class.VolumeBindingMode; m != nil {
		p.VolumeBindingMode = string(*m)
		p.WaitingForNode = *m == storagev1.VolumeBindingWaitForFirstConsumer && p.SelectedNode == ""
	}
	p.Requested = through.Provisioner != "" && claim.Annotations[kube.AnnStorageProvisioner] == through.Provisioner
	if through.Failure != "" {
		p.Message = fmt.Sprintf("StorageClass %q names provisioner %q, which nothing provisions with: %s", name, class.Provisioner, through.Failure)
		return p
	}
	if prov == nil {
		p.Message = fmt.Sprintf("this binder has no provisioner (--provisioner-address): StorageClass %q is left to the external provisioner %q", name, p.Provisioner)
		return p
	}
	actx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	drivers, err := prov.Drivers(actx)
	if err != nil {
		p.Message = fmt.Sprintf("the provisioner did not say which drivers it serves: %v", status.Convert(err).Message())
		return p
	}
	for _, d := range drivers {
		if d.GetProvisionerName() == p.Provisioner {
			p.Served, p.DriverName, p.DriverReady = true, d.GetDriverName(), d.GetReady()
		}
	}
	switch {
	case !p.Served:
		p.Message = fmt.Sprintf("volplane's provisioner does not serve %q: the external provisioner of that name creates the volume", p.Provisioner)
	case p.WaitingForNode:
		p.Message = fmt.Sprintf("CSI driver %s provisions the volume once a pod using the claim is scheduled (volume.kubernetes.io/selected-node)", p.DriverName)
	case !p.DriverReady:
		p.Message = fmt.Sprintf("CSI driver %s is not ready: provisioning waits for it", p.DriverName)
	default:
		p.Message = fmt.Sprintf("volplane's provisioner creates the volume with CSI driver %s", p.DriverName)
	}
	if !live || !p.Served {
		return p
	}
	c.operationOf(actx, prov, claim, p)
	c.callsOf(claim, class, p)
	return p
}

// operationOf adds the provisioner's journaled operation of claim to p.
func (c *controller) operationOf(ctx context.Context, prov provisionerInfo, claim *corev1.PersistentVolumeClaim, p *binderv1.Provisioning) {
	op, err := prov.Operation(ctx, string(claim.UID))
	switch {
	case err != nil:
		p.Message += fmt.Sprintf("; the provisioner's journal could not be read: %v", status.Convert(err).Message())
	case op != nil:
		p.Operation = &binderv1.ProvisioningOperation{
			VolumeName: op.GetVolumeName(), Attempts: op.GetAttempts(), LastErrorCode: op.GetLastErrorCode(),
			LastErrorMessage: op.GetLastErrorMessage(), LastAttemptTime: op.GetLastAttemptTime(),
			StartTime: op.GetStartTime(), Owner: op.GetOwner(),
		}
		p.Message += fmt.Sprintf("; operation %s in flight after %d attempt(s)", op.GetVolumeName(), op.GetAttempts())
		if op.GetLastErrorCode() != "" {
			p.Message += fmt.Sprintf(", last error %s: %s", op.GetLastErrorCode(), op.GetLastErrorMessage())
		}
	}
}

// callsOf adds this replica's Provision calls for claim to p: one in
// flight, the next one's time (after the backoff, or the slow retry of an
// infeasible request) and the last one's result.
func (c *controller) callsOf(claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, p *binderv1.Provisioning) {
	running, next, last, ok := c.provisions.state(claimKey(claim), claim.UID)
	p.CallInFlight = running
	if until, slow := c.provisions.delayed(claimKey(claim), claim.UID, class.UID); slow {
		// Infeasible: no call before until, whatever the backoff says.
		next = until
		p.Message += fmt.Sprintf("; the driver refused the last request as infeasible (InvalidArgument): as external-provisioner, Provision is not called again before %s unless StorageClass %q is replaced",
			until.UTC().Format(time.RFC3339), class.Name)
	}
	if !next.IsZero() && next.After(time.Now()) {
		p.NextRetryTime = timestamppb.New(next)
	}
	if ok {
		if last.out.err != nil {
			p.LastResult = fmt.Sprintf("%s: the call failed: %v", last.at.UTC().Format(time.RFC3339), status.Convert(last.out.err).Message())
		} else {
			p.LastResult = fmt.Sprintf("%s: %s %s", last.at.UTC().Format(time.RFC3339), last.out.res.outcome, last.out.res.message)
		}
	}
}

// candidatesToAPI turns a page of the index into the API's candidates.
func candidatesToAPI(ix *view, claim *corev1.PersistentVolumeClaim) []*binderv1.Candidate {
	out := make([]*binderv1.Candidate, 0, len(ix.page))
	for i, cd := range ix.page {
		v := cd.v
		capacity := v.Spec.Capacity[corev1.ResourceStorage]
		msg := ix.fit.Why(v, cd.rule)
		if cd.rule == match.RuleReserved {
			if cd.heldBy != "" {
				msg = fmt.Sprintf("reserved by this binder replica for claim UID %s (a bind in progress)", cd.heldBy)
			} else {
				msg = fmt.Sprintf("held in etcd by another binder replica: skipped until %s", cd.foreignUntil.UTC().Format(time.RFC3339Nano))
			}
		}
		out = append(out, &binderv1.Candidate{
			Rank:             int32(ix.first + i),
			Name:             v.Name,
			StorageClassName: match.VolumeClass(v),
			CapacityBytes:    capacity.Value(),
			AccessModes:      modes(v.Spec.AccessModes),
			VolumeMode:       volumeMode(v.Spec.VolumeMode),
			Phase:            string(v.Status.Phase),
			ClaimRefToClaim:  v.Spec.ClaimRef != nil && v.Spec.ClaimRef.Namespace == claim.Namespace && v.Spec.ClaimRef.Name == claim.Name,
			RejectedBy:       ruleToAPI(cd.rule),
			Message:          msg,
		})
	}
	return out
}

// ruleToAPI maps the matcher's rules to the API's.
func ruleToAPI(r match.Rule) binderv1.Rule {
	switch r {
	case match.RuleNone:
		return binderv1.Rule_RULE_UNSPECIFIED
	case match.RuleStorageClass:
		return binderv1.Rule_RULE_STORAGE_CLASS
	case match.RuleVolumeAttributesClass:
		return binderv1.Rule_RULE_VOLUME_ATTRIBUTES_CLASS
	case match.RuleVolumeMode:
		return binderv1.Rule_RULE_VOLUME_MODE
	case match.RuleAccessModes:
		return binderv1.Rule_RULE_ACCESS_MODES
	case match.RuleCapacity:
		return binderv1.Rule_RULE_CAPACITY
	case match.RuleSelector:
		return binderv1.Rule_RULE_LABEL_SELECTOR
	case match.RuleNodeAffinity:
		return binderv1.Rule_RULE_NODE_AFFINITY
	case match.RuleBoundElsewhere:
		return binderv1.Rule_RULE_BOUND_ELSEWHERE
	case match.RuleReserved:
		return binderv1.Rule_RULE_RESERVED
	case match.RuleDeleting:
		return binderv1.Rule_RULE_DELETING
	case match.RuleNotAvailable:
		return binderv1.Rule_RULE_NOT_AVAILABLE
	case match.RuleDelayBinding:
		return binderv1.Rule_RULE_WAIT_FOR_FIRST_CONSUMER
	}
	panic(fmt.Sprintf("binder: rule %v has no API name", r))
}

// ExplainClaim implements BinderService: the claim's owner answers, from
// its cache, with the binder's own choice and rules.
func (a *api) ExplainClaim(ctx context.Context, req *binderv1.ExplainClaimRequest) (*binderv1.ExplainClaimResponse, error) {
	if err := checkNames(req.GetNamespace(), req.GetName(), guard.ClaimName); err != nil {
		return nil, err
	}
	size, err := candidatePageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	from, err := decodePageToken(req.GetPageToken())
	if err != nil {
		return nil, err
	}
	if err := a.ready(); err != nil {
		return nil, err
	}
	key := req.GetNamespace() + "/" + req.GetName()
	// The owner holds the claim's shard, and knows its reservations and
	// its Provision calls.
	if resp, forwarded, err := atOwner(ctx, a.peers, "pvc/"+key, func(owner binderv1.BinderServiceClient, ctx context.Context) (*binderv1.ExplainClaimResponse, error) {
		return owner.ExplainClaim(ctx, req)
	}); forwarded {
		return resp, err
	}
	claim := a.c.store.claim(key)
	if claim == nil {
		return nil, a.missingClaim(key)
	}
	v, err := a.c.judge(ctx, claim, from, size)
	if err != nil {
		return nil, err
	}
	resp := &binderv1.ExplainClaimResponse{Claim: claimToAPI(claim), Decision: v.decision, Message: v.message,
		WouldBind: v.wouldBind, Binding: v.binding, MemberId: a.memberID}
	if ix := v.index; ix != nil {
		resp.Candidates, resp.TotalCandidates = candidatesToAPI(ix, claim), int32(ix.total)
		if ix.next != nil {
			resp.NextPageToken = ix.next.encode()
		}
	}
	if v.provisioning {
		resp.Provisioning = a.c.provisioningOf(ctx, a.prov, claim, true)
	}
	return resp, nil
}
