package binder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/volplane/volplane/pkg/claimvalidation"
	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/shape"
	"github.com/volplane/volplane/pkg/watchclient"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// dryRunCreate creates a claim in namespace as a server-side dry run
// (dryRun=All, fieldValidation=Strict) from its JSON and returns what the
// API server would store: its validation, defaults and admission (the
// default StorageClass, quotas) apply, and nothing is written. Errors are
// the API server's (apierrors).
type dryRunCreate func(ctx context.Context, namespace string, body []byte) (*corev1.PersistentVolumeClaim, error)

// apiDryRun is dryRunCreate against the API server. The body goes as it
// came (MatchClaim checked it as the API server would), so that an unknown
// or misspelt field is the API server's strict decoding error too, never
// silently dropped. The request carries the binder's deadline as its
// timeout parameter: the API server stops waiting for its own handler
// then, as the binder does.
func (c *controller) apiDryRun(ctx context.Context, namespace string, body []byte) (*corev1.PersistentVolumeClaim, error) {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	out := &corev1.PersistentVolumeClaim{}
	err := c.client.CoreV1().RESTClient().Post().Namespace(namespace).Resource("persistentvolumeclaims").
		Param("dryRun", "All").Param("fieldValidation", "Strict").Timeout(askTimeout).
		SetHeader("Content-Type", "application/json").Body(body).Do(ctx).Into(out)
	if err != nil {
		return nil, err
	}
	return watchclient.Slim(out), nil
}

// matchBody checks the claim a MatchClaim request carries and returns its
// JSON for the dry run, in the namespace the request names (the path's),
// else the claim's, else "default". apiVersion and kind may be left out.
func matchBody(reqNamespace string, obj map[string]any) (string, []byte, error) {
	bad := func(format string, args ...any) error {
		return status.Errorf(codes.InvalidArgument, format, args...)
	}
	if v, ok := obj["apiVersion"]; !ok {
		obj["apiVersion"] = "v1"
	} else if v != "v1" {
		return "", nil, bad("apiVersion: %v: a PersistentVolumeClaim is v1", v)
	}
	if v, ok := obj["kind"]; !ok {
		obj["kind"] = "PersistentVolumeClaim"
	} else if v != "PersistentVolumeClaim" {
		return "", nil, bad("kind: %v: send a PersistentVolumeClaim", v)
	}
	meta, ok := obj["metadata"].(map[string]any)
	if !ok && obj["metadata"] != nil {
		return "", nil, bad("metadata: must be an object")
	}
	if meta == nil {
		meta = map[string]any{}
		obj["metadata"] = meta
	}
	ns := reqNamespace
	switch v := meta["namespace"].(type) {
	case nil:
	case string:
		if ns != "" && v != "" && v != ns {
			return "", nil, bad("metadata.namespace %q does not match the namespace %q of the request", v, ns)
		}
		if ns == "" {
			ns = v
		}
	default:
		return "", nil, bad("metadata.namespace: must be a string")
	}
	if ns == "" {
		ns = "default"
	}
	if err := guard.CheckName("namespace", ns, guard.Namespace); err != nil {
		return "", nil, bad("%v", err)
	}
	meta["namespace"] = ns
	b, err := json.Marshal(obj)
	if err != nil {
		return "", nil, bad("claim: %v", err)
	}
	return ns, b, nil
}

// dryRunStatus turns the API server's refusal of a dry-run create into the
// caller's error: InvalidArgument naming the fields for a claim that would
// not pass validation, AlreadyExists for a claim of that name, NotFound
// for a missing namespace, FailedPrecondition for admission (a quota).
func dryRunStatus(err error, namespace string) error {
	var se apierrors.APIStatus
	msg := err.Error()
	if errors.As(err, &se) {
		msg = se.Status().Message
	}
	switch {
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsRequestEntityTooLargeError(err):
		st := status.New(codes.InvalidArgument, "the API server would not accept this claim: "+msg)
		if se != nil && se.Status().Details != nil {
			br := &errdetails.BadRequest{}
			for _, c := range se.Status().Details.Causes {
				br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: c.Field, Description: c.Message})
			}
			if len(br.FieldViolations) > 0 {
				if d, err := st.WithDetails(br); err == nil {
					st = d
				}
			}
		}
		return st.Err()
	case apierrors.IsAlreadyExists(err):
		return status.Errorf(codes.AlreadyExists, "%s: it cannot be created again; ask why it is where it is with ExplainClaim (GET /v1/namespaces/%s/claims/{name}:explain)", msg, namespace)
	case apierrors.IsNotFound(err):
		return status.Errorf(codes.NotFound, "the API server would not create this claim: %s", msg)
	case apierrors.IsForbidden(err):
		return status.Errorf(codes.FailedPrecondition, "the API server would refuse to create this claim: %s", msg)
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, msg)
	}
	return status.Errorf(codes.Unavailable, "ask the API server to try the claim (dry run): %s", msg)
}

// MatchClaim implements BinderService: the claim is checked as the API
// server would check it (pkg/claimvalidation), then created as a dry run,
// then judged exactly as a claim of the cache is (judge), without
// reserving anything; when it would be provisioned, the provisioner builds
// its CreateVolume request with PlanVolume. Nothing is written anywhere.
func (a *api) MatchClaim(ctx context.Context, req *binderv1.MatchClaimRequest) (*binderv1.MatchClaimResponse, error) {
	if req.GetNamespace() != "" {
		if err := guard.CheckName("namespace", req.GetNamespace(), guard.Namespace); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	size, err := candidatePageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	from, err := decodePageToken(req.GetPageToken())
	if err != nil {
		return nil, err
	}
	if req.GetClaim() == nil || len(req.GetClaim().GetFields()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "claim is required: send the PersistentVolumeClaim, JSON or YAML, as the body")
	}
	if err := shape.CheckStruct(req.GetClaim(), shape.Default); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "claim: %v", err)
	}
	ns, body, err := matchBody(req.GetNamespace(), req.GetClaim().AsMap())
	if err != nil {
		return nil, err
	}
	// The claim is checked as the API server would check it, so that
	// nothing it would refuse, or choke on (a quantity such as
	// 1E+999999999), is sent to it under the binder's identity.
	if _, err := claimvalidation.Check(body); err != nil {
		return nil, dryRunStatus(err, ns)
	}
	if err := a.ready(); err != nil {
		return nil, err
	}
	create := a.dryRun
	if create == nil {
		create = a.c.apiDryRun
	}
	claim, err := create(ctx, ns, body)
	if err != nil {
		return nil, dryRunStatus(err, ns)
	}
	v, err := a.c.judge(ctx, claim, from, size)
	if err != nil {
		return nil, err
	}
	resp := &binderv1.MatchClaimResponse{Claim: claimToAPI(claim), Decision: v.decision, Message: v.message, WouldBind: v.wouldBind}
	if ix := v.index; ix != nil {
		resp.Candidates, resp.TotalCandidates = candidatesToAPI(ix, claim), int32(ix.total)
		if ix.next != nil {
			resp.NextPageToken = ix.next.encode()
		}
	}
	if !v.provisioning {
		return resp, nil
	}
	p := a.c.provisioningOf(ctx, a.prov, claim, false)
	resp.Provisioning = p
	if v.decision != binderv1.Decision_DECISION_PROVISION || !p.GetServed() {
		return resp, nil
	}
	pctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	plan, err := a.prov.Plan(pctx, claim)
	if err != nil {
		p.Message = fmt.Sprintf("volplane's provisioner serves %q but would not provision this claim: %s", p.GetProvisioner(), status.Convert(err).Message())
		resp.Message += "; " + p.Message
		return resp, nil
	}
	resp.CreateVolume = plan.GetPlan()
	return resp, nil
}
