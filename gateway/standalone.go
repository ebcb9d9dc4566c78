package gateway

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/match"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// Standalone mode (Options.Standalone, --standalone): volplane's binder
// does not run, kube-controller-manager's binds claims (a managed
// cluster). The binder's routes are served by standaloneBinder in the
// gateway itself: every route that needs volplane's binder answers
// FailedPrecondition naming the mode; explain and timeline answer the
// provisioning side, from the claim as the API server has it and from
// volplane's provisioner.

// notInStandalone is the answer of a route that needs volplane's binder.
func notInStandalone(what string) error {
	return status.Errorf(codes.FailedPrecondition, "volplane runs in standalone mode: kube-controller-manager binds claims, so %s is not available", what)
}

// standaloneBinder is BinderService in standalone mode.
type standaloneBinder struct {
	binderv1.UnimplementedBinderServiceServer
	client kubernetes.Interface
	// prov is volplane's provisioner; nil when the gateway has none.
	prov provisionerv1.ProvisionerServiceClient
}

var _ binderv1.BinderServiceServer = (*standaloneBinder)(nil)

func (s *standaloneBinder) ListClaims(context.Context, *binderv1.ListClaimsRequest) (*binderv1.ListClaimsResponse, error) {
	return nil, notInStandalone("the binder's list of claims (use kubectl get pvc)")
}

func (s *standaloneBinder) GetClaim(context.Context, *binderv1.GetClaimRequest) (*binderv1.GetClaimResponse, error) {
	return nil, notInStandalone("the binder's view of a claim (use kubectl get pvc, or :explain for the provisioning side)")
}

func (s *standaloneBinder) ListVolumes(context.Context, *binderv1.ListVolumesRequest) (*binderv1.ListVolumesResponse, error) {
	return nil, notInStandalone("the binder's list of volumes (use kubectl get pv)")
}

func (s *standaloneBinder) GetVolume(context.Context, *binderv1.GetVolumeRequest) (*binderv1.GetVolumeResponse, error) {
	return nil, notInStandalone("the binder's view of a volume (use kubectl get pv)")
}

func (s *standaloneBinder) SyncClaim(context.Context, *binderv1.SyncClaimRequest) (*binderv1.SyncClaimResponse, error) {
	return nil, notInStandalone("syncing a claim")
}

func (s *standaloneBinder) SyncVolume(context.Context, *binderv1.SyncVolumeRequest) (*binderv1.SyncVolumeResponse, error) {
	return nil, notInStandalone("syncing a volume")
}

func (s *standaloneBinder) GetStatus(context.Context, *binderv1.GetStatusRequest) (*binderv1.GetStatusResponse, error) {
	return nil, notInStandalone("the binder's status")
}

func (s *standaloneBinder) MatchClaim(context.Context, *binderv1.MatchClaimRequest) (*binderv1.MatchClaimResponse, error) {
	return nil, notInStandalone("matching a claim against volumes")
}

// readClaim reads the claim from the API server.
func (s *standaloneBinder) readClaim(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	if namespace == "" || name == "" {
		return nil, status.Error(codes.InvalidArgument, "namespace and name are required")
	}
	c, err := s.client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, status.Errorf(codes.NotFound, "claim %s/%s not found", namespace, name)
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "read claim %s/%s: %v", namespace, name, err)
	}
	return c, nil
}

// ExplainClaim answers the provisioning side of a claim: the binding is
// kube-controller-manager's, so no candidates and no decision of
// volplane's binder are given.
func (s *standaloneBinder) ExplainClaim(ctx context.Context, req *binderv1.ExplainClaimRequest) (*binderv1.ExplainClaimResponse, error) {
	c, err := s.readClaim(ctx, req.GetNamespace(), req.GetName())
	if err != nil {
		return nil, err
	}
	out := &binderv1.ExplainClaimResponse{Claim: claimMessage(c)}
	if c.Spec.VolumeName != "" {
		out.Binding = &binderv1.Binding{VolumeName: c.Spec.VolumeName, ClaimBoundByController: c.Annotations[kube.AnnBoundByController] == "yes",
			Message: "bound by kube-controller-manager (volplane runs in standalone mode)"}
		if c.Status.Phase == corev1.ClaimBound {
			out.Decision = binderv1.Decision_DECISION_BOUND
		}
		out.Message = fmt.Sprintf("volplane runs in standalone mode: kube-controller-manager binds claims; the claim names volume %s", c.Spec.VolumeName)
		return out, nil
	}
	out.Provisioning = s.provisioning(ctx, c)
	out.Message = "volplane runs in standalone mode: kube-controller-manager binds claims, so only the provisioning side is explained: " + out.Provisioning.Message
	return out, nil
}

// provisioning is the provisioning side of an unbound claim.
func (s *standaloneBinder) provisioning(ctx context.Context, c *corev1.PersistentVolumeClaim) *binderv1.Provisioning {
	p := &binderv1.Provisioning{StorageClassName: match.ClaimClass(c), SelectedNode: c.Annotations[kube.AnnSelectedNode]}
	p.Provisioner, p.Requested = c.Annotations[kube.AnnStorageProvisioner]
	if !p.Requested {
		p.Provisioner, p.Requested = c.Annotations[kube.AnnBetaStorageProvisioner]
	}
	var class *storagev1.StorageClass
	if p.StorageClassName != "" {
		if sc, err := s.client.StorageV1().StorageClasses().Get(ctx, p.StorageClassName, metav1.GetOptions{}); err == nil {
			class, p.ClassFound = sc, true
			if p.Provisioner == "" {
				p.Provisioner = sc.Provisioner
			}
			if sc.VolumeBindingMode != nil {
				p.VolumeBindingMode = string(*sc.VolumeBindingMode)
			}
		}
	}
	p.WaitingForNode = class != nil && p.VolumeBindingMode == string(storagev1.VolumeBindingWaitForFirstConsumer) && p.SelectedNode == ""
	s.fromProvisioner(ctx, c, p)
	p.Message = provisioningMessage(p)
	return p
}

// fromProvisioner fills in what volplane's provisioner knows: whether it
// serves the provisioner name, and the journaled operation.
func (s *standaloneBinder) fromProvisioner(ctx context.Context, c *corev1.PersistentVolumeClaim, p *binderv1.Provisioning) {
	if s.prov == nil || p.Provisioner == "" {
		return
	}
	if resp, err := s.prov.ListDrivers(ctx, &provisionerv1.ListDriversRequest{}); err == nil {
		for _, d := range resp.GetDrivers() {
			if d.GetProvisionerName() == p.Provisioner {
				p.Served, p.DriverName, p.DriverReady = true, d.GetDriverName(), d.GetReady()
			}
		}
	}
	resp, err := s.prov.ListOperations(ctx, &provisionerv1.ListOperationsRequest{ClaimUid: string(c.UID)})
	if err != nil || len(resp.GetOperations()) == 0 {
		return
	}
	op := resp.GetOperations()[0]
	p.Operation = &binderv1.ProvisioningOperation{VolumeName: op.GetVolumeName(), Attempts: op.GetAttempts(), LastErrorCode: op.GetLastErrorCode(),
		LastErrorMessage: op.GetLastErrorMessage(), LastAttemptTime: op.GetLastAttemptTime(), StartTime: op.GetStartTime(), Owner: op.GetOwner()}
}

// provisioningMessage says the provisioning state in words.
func provisioningMessage(p *binderv1.Provisioning) string {
	switch {
	case p.StorageClassName == "":
		return "the claim names no StorageClass: nothing provisions it"
	case !p.ClassFound:
		return fmt.Sprintf("StorageClass %q does not exist", p.StorageClassName)
	case !p.Served:
		return fmt.Sprintf("provisioner %q is not served by volplane's provisioner: its own provisioner provisions the claim", p.Provisioner)
	case p.WaitingForNode:
		return "WaitForFirstConsumer: provisioning waits until a pod using the claim is scheduled (volume.kubernetes.io/selected-node)"
	case !p.Requested:
		return "kube-controller-manager has not asked for provisioning yet (no volume.kubernetes.io/storage-provisioner annotation)"
	case p.Operation != nil:
		return fmt.Sprintf("volplane's provisioner is provisioning %s (attempt %d)", p.Operation.VolumeName, p.Operation.Attempts)
	case !p.DriverReady:
		return fmt.Sprintf("CSI driver %q is not ready", p.DriverName)
	}
	return "volplane's provisioner provisions the claim; kube-controller-manager binds the PersistentVolume it writes"
}

// GetClaimTimeline answers the provisioner's steps for the claim: the
// binding steps are kube-controller-manager's, and recorded nowhere.
func (s *standaloneBinder) GetClaimTimeline(ctx context.Context, req *binderv1.GetClaimTimelineRequest) (*binderv1.GetClaimTimelineResponse, error) {
	c, err := s.readClaim(ctx, req.GetNamespace(), req.GetName())
	if err != nil {
		return nil, err
	}
	out := &binderv1.GetClaimTimelineResponse{Claim: claimMessage(c),
		Missing: []string{"binder: volplane runs in standalone mode: kube-controller-manager binds claims, so the binding steps are not recorded"}}
	if s.prov == nil {
		out.Missing = append(out.Missing, "provisioner: the gateway has no --provisioner-address")
		return out, nil
	}
	resp, err := s.prov.GetClaimTimeline(ctx, &provisionerv1.GetClaimTimelineRequest{ClaimUid: string(c.UID)})
	if err != nil {
		out.Missing = append(out.Missing, "provisioner: "+status.Convert(err).Message())
		return out, nil
	}
	out.Spans, out.Dropped = resp.GetSpans(), resp.GetDropped()
	return out, nil
}

// claimMessage is the API's Claim of a claim.
func claimMessage(c *corev1.PersistentVolumeClaim) *binderv1.Claim {
	m := &binderv1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID), Phase: string(c.Status.Phase), VolumeName: c.Spec.VolumeName,
		StorageClassName: match.ClaimClass(c), BindCompleted: c.Annotations[kube.AnnBindCompleted] == "yes",
		BoundByController: c.Annotations[kube.AnnBoundByController] == "yes", StorageProvisioner: c.Annotations[kube.AnnStorageProvisioner],
		SelectedNode: c.Annotations[kube.AnnSelectedNode], ResourceVersion: c.ResourceVersion, CreateTime: timestamppb.New(c.CreationTimestamp.Time),
		Deleting: c.DeletionTimestamp != nil}
	if q, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
		m.RequestedBytes = q.Value()
	}
	if q, ok := c.Status.Capacity[corev1.ResourceStorage]; ok {
		m.CapacityBytes = q.Value()
	}
	for _, a := range c.Spec.AccessModes {
		m.AccessModes = append(m.AccessModes, string(a))
	}
	if c.Spec.VolumeMode != nil {
		m.VolumeMode = string(*c.Spec.VolumeMode)
	}
	return m
}
