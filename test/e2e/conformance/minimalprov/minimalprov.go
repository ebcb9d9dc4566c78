// Package minimalprov is a deliberately minimal second implementation of
// volplane's provisioner API (volplane.provisioner.v1.ProvisionerService)
// over one CSI driver, written only from the contract the proto and
// docs/conformance.md state, sharing no code with services/provisioner.
// The conformance tests run the provisioner suite against it and a binder
// and a reclaimer configured with its address, to show that they work
// with any conforming provisioner.
//
// It keeps no journal and no cache: each call reads the claim, class or
// volume from the API server and makes one attempt. The volume name
// ("pvc-" + claim UID) makes a retry find the same volume: CSI CreateVolume
// is idempotent by name, and a PersistentVolume that exists already for
// the same claim UID is the answer. It has no capacity tracking and no
// orphan report (those RPCs are Unimplemented), no topology, secrets or
// content sources.
package minimalprov

import (
	"context"
	"errors"
	"fmt"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

const (
	annProvisionedBy = "pv.kubernetes.io/provisioned-by"
	finalizer        = "external-provisioner.volume.kubernetes.io/finalizer"
	csiPrefix        = "csi.storage.k8s.io/"
)

// Server is the minimal provisioner.
type Server struct {
	provisionerv1.UnimplementedProvisionerServiceServer
	kube       kubernetes.Interface
	identity   csi.IdentityClient
	controller csi.ControllerClient
	endpoint   string
	driver     string // the CSI driver's name
	version    string
	caps       []string
	// VolumeName names a claim's volume: "pvc-" + its UID, which makes
	// every attempt for one claim find the same volume. Tests replace it
	// to show that the conformance suite catches a provisioner that is
	// not idempotent.
	VolumeName func(*corev1.PersistentVolumeClaim) string
}

// New asks the CSI driver on conn who it is and what it can do.
func New(ctx context.Context, kube kubernetes.Interface, conn *grpc.ClientConn, endpoint string) (*Server, error) {
	s := &Server{kube: kube, identity: csi.NewIdentityClient(conn), controller: csi.NewControllerClient(conn), endpoint: endpoint,
		VolumeName: func(c *corev1.PersistentVolumeClaim) string { return "pvc-" + string(c.UID) }}
	info, err := s.identity.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetPluginInfo: %w", err)
	}
	s.driver, s.version = info.GetName(), info.GetVendorVersion()
	caps, err := s.controller.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		return nil, fmt.Errorf("ControllerGetCapabilities: %w", err)
	}
	for _, c := range caps.GetCapabilities() {
		s.caps = append(s.caps, c.GetRpc().GetType().String())
	}
	return s, nil
}

// ListDrivers reports the one driver, ready when it answers Probe.
func (s *Server) ListDrivers(ctx context.Context, _ *provisionerv1.ListDriversRequest) (*provisionerv1.ListDriversResponse, error) {
	d := &provisionerv1.Driver{ProvisionerName: s.driver, DriverName: s.driver, VendorVersion: s.version, Endpoint: s.endpoint, Capabilities: s.caps, Ready: true}
	if resp, err := s.identity.Probe(ctx, &csi.ProbeRequest{}); err != nil {
		d.Ready, d.Message = false, "Probe: "+err.Error()
	} else if r := resp.GetReady(); r != nil && !r.GetValue() {
		d.Ready, d.Message = false, "Probe: not ready"
	}
	return &provisionerv1.ListDriversResponse{Drivers: []*provisionerv1.Driver{d}}, nil
}

// ListOperations lists nothing: every call is one synchronous attempt.
func (s *Server) ListOperations(context.Context, *provisionerv1.ListOperationsRequest) (*provisionerv1.ListOperationsResponse, error) {
	return &provisionerv1.ListOperationsResponse{}, nil
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

func precondition(format string, args ...any) error {
	return status.Errorf(codes.FailedPrecondition, format, args...)
}

// fromAPI turns an API server error into a status.
func fromAPI(err error, what string) error {
	switch {
	case apierrors.IsNotFound(err):
		return status.Errorf(codes.NotFound, "%s not found", what)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return status.Errorf(codes.InvalidArgument, "%s: %v", what, err)
	}
	return status.Errorf(codes.Unavailable, "%s: %v", what, err)
}

func checkName(field, value string, label bool) error {
	if value == "" {
		return invalid("%s is required", field)
	}
	check := validation.IsDNS1123Subdomain
	if label {
		check = validation.IsDNS1123Label
	}
	if errs := check(value); len(errs) > 0 {
		return invalid("%s %q: %s", field, value, strings.Join(errs, "; "))
	}
	return nil
}

// Provision makes one attempt at the claim's volume.
func (s *Server) Provision(ctx context.Context, req *provisionerv1.ProvisionRequest) (*provisionerv1.ProvisionResponse, error) {
	if err := checkName("claim_namespace", req.GetClaimNamespace(), true); err != nil {
		return nil, err
	}
	if err := checkName("claim_name", req.GetClaimName(), false); err != nil {
		return nil, err
	}
	// Hints are only checked: this implementation always reads.
	if len(req.GetClaim()) > 0 {
		sent := &corev1.PersistentVolumeClaim{}
		if err := sent.Unmarshal(req.GetClaim()); err != nil {
			return nil, invalid("claim: %v", err)
		}
		if sent.Namespace != req.GetClaimNamespace() || sent.Name != req.GetClaimName() || string(sent.UID) != req.GetClaimUid() {
			return nil, invalid("claim %s/%s (uid %s) is not the claim of the request", sent.Namespace, sent.Name, sent.UID)
		}
	}
	if len(req.GetStorageClass()) > 0 {
		if err := (&storagev1.StorageClass{}).Unmarshal(req.GetStorageClass()); err != nil {
			return nil, invalid("storage_class: %v", err)
		}
	}
	claim, err := s.kube.CoreV1().PersistentVolumeClaims(req.GetClaimNamespace()).Get(ctx, req.GetClaimName(), metav1.GetOptions{})
	if err != nil {
		return nil, fromAPI(err, "claim "+req.GetClaimNamespace()+"/"+req.GetClaimName())
	}
	if uid := req.GetClaimUid(); uid != "" && string(claim.UID) != uid {
		return nil, precondition("claim has UID %s, not %s", claim.UID, uid)
	}
	name := s.VolumeName(claim)
	resp := &provisionerv1.ProvisionResponse{VolumeName: name}
	if claim.Spec.StorageClassName == nil || *claim.Spec.StorageClassName == "" {
		return nil, precondition("the claim names no StorageClass")
	}
	if claim.Spec.VolumeName != "" && claim.Spec.VolumeName != name {
		return nil, precondition("the claim asks for volume %s", claim.Spec.VolumeName)
	}
	class, err := s.kube.StorageV1().StorageClasses().Get(ctx, *claim.Spec.StorageClassName, metav1.GetOptions{})
	if err != nil {
		return nil, fromAPI(err, "StorageClass "+*claim.Spec.StorageClassName)
	}
	if class.Provisioner != s.driver {
		return nil, precondition("StorageClass %s is provisioned by %q, not %q", class.Name, class.Provisioner, s.driver)
	}
	if claim.DeletionTimestamp != nil {
		resp.Outcome, resp.Message = provisionerv1.Outcome_OUTCOME_NO_CHANGE, "the claim is being deleted"
		return resp, nil
	}

	created, err := s.controller.CreateVolume(ctx, createRequest(name, claim, class))
	if err != nil {
		resp.Outcome, resp.Message = outcome(err, claim), "CreateVolume: "+err.Error()
		return resp, nil
	}
	pv, err := s.saveVolume(ctx, buildVolume(name, s.driver, claim, class, created.GetVolume()))
	if err != nil {
		// The volume exists; the next attempt (same name) finds it.
		resp.Outcome, resp.Message = provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, "save PersistentVolume: "+err.Error()
		return resp, nil
	}
	if resp.Volume, err = pv.Marshal(); err != nil {
		return nil, status.Errorf(codes.Internal, "encode PersistentVolume: %v", err)
	}
	resp.Outcome = provisionerv1.Outcome_OUTCOME_FINISHED
	return resp, nil
}

// outcome is what a CreateVolume or DeleteVolume error means.
func outcome(err error, claim *corev1.PersistentVolumeClaim) provisionerv1.Outcome {
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Unavailable, codes.Canceled, codes.Aborted, codes.Unknown:
		return provisionerv1.Outcome_OUTCOME_IN_BACKGROUND
	case codes.ResourceExhausted:
		if claim != nil && claim.Annotations["volume.kubernetes.io/selected-node"] != "" {
			return provisionerv1.Outcome_OUTCOME_RESCHEDULE
		}
	}
	return provisionerv1.Outcome_OUTCOME_NO_CHANGE
}

func createRequest(name string, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) *csi.CreateVolumeRequest {
	size := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	params := map[string]string{}
	for k, v := range class.Parameters {
		if !strings.HasPrefix(k, csiPrefix) {
			params[k] = v
		}
	}
	req := &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size.Value()}, Parameters: params}
	for _, m := range claim.Spec.AccessModes {
		mode := csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
		switch m {
		case corev1.ReadOnlyMany:
			mode = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
		case corev1.ReadWriteMany:
			mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
		case corev1.ReadWriteOncePod:
			mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		}
		c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
		if claim.Spec.VolumeMode != nil && *claim.Spec.VolumeMode == corev1.PersistentVolumeBlock {
			c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		} else {
			c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: class.Parameters[csiPrefix+"fstype"], MountFlags: class.MountOptions}}
		}
		req.VolumeCapabilities = append(req.VolumeCapabilities, c)
	}
	return req
}

func buildVolume(name, driver string, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, v *csi.Volume) *corev1.PersistentVolume {
	policy := corev1.PersistentVolumeReclaimDelete
	if class.ReclaimPolicy != nil {
		policy = *class.ReclaimPolicy
	}
	size := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	if v.GetCapacityBytes() > 0 {
		size = *resource.NewQuantity(v.GetCapacityBytes(), resource.BinarySI)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{annProvisionedBy: class.Provisioner}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   claim.Spec.AccessModes,
			VolumeMode:                    claim.Spec.VolumeMode,
			StorageClassName:              class.Name,
			PersistentVolumeReclaimPolicy: policy,
			MountOptions:                  class.MountOptions,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID, ResourceVersion: claim.ResourceVersion},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: v.GetVolumeId(), VolumeAttributes: v.GetVolumeContext(),
				FSType: class.Parameters[csiPrefix+"fstype"],
			}},
		},
	}
	if policy == corev1.PersistentVolumeReclaimDelete {
		pv.Finalizers = []string{finalizer}
	}
	var terms []corev1.NodeSelectorTerm
	for _, t := range v.GetAccessibleTopology() {
		var exprs []corev1.NodeSelectorRequirement
		for k, val := range t.GetSegments() {
			exprs = append(exprs, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{val}})
		}
		terms = append(terms, corev1.NodeSelectorTerm{MatchExpressions: exprs})
	}
	if len(terms) > 0 {
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}
	}
	return pv
}

// saveVolume creates the PersistentVolume; one of the same claim UID that
// exists already (an earlier attempt) is the answer.
func (s *Server) saveVolume(ctx context.Context, pv *corev1.PersistentVolume) (*corev1.PersistentVolume, error) {
	created, err := s.kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return created, err
	}
	old, err := s.kube.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if old.Spec.ClaimRef == nil || old.Spec.ClaimRef.UID != pv.Spec.ClaimRef.UID {
		return nil, errors.New("PersistentVolume " + pv.Name + " exists for another claim")
	}
	return old, nil
}

// DeleteVolume deletes the backing volume of a Released or Failed
// PersistentVolume with policy Delete that no live claim points at.
func (s *Server) DeleteVolume(ctx context.Context, req *provisionerv1.DeleteVolumeRequest) (*provisionerv1.DeleteVolumeResponse, error) {
	if err := checkName("volume_name", req.GetVolumeName(), false); err != nil {
		return nil, err
	}
	var sent *corev1.PersistentVolume
	if len(req.GetVolume()) > 0 {
		sent = &corev1.PersistentVolume{}
		if err := sent.Unmarshal(req.GetVolume()); err != nil {
			return nil, invalid("volume: %v", err)
		}
		if sent.Name != req.GetVolumeName() {
			return nil, invalid("volume %q is not volume_name %q", sent.Name, req.GetVolumeName())
		}
	}
	pv, err := s.kube.CoreV1().PersistentVolumes().Get(ctx, req.GetVolumeName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, precondition("PersistentVolume %s does not exist: nothing to delete", req.GetVolumeName())
	}
	if err != nil {
		return nil, fromAPI(err, "PersistentVolume "+req.GetVolumeName())
	}
	if sent != nil && sent.UID != pv.UID {
		return nil, precondition("PersistentVolume %s has UID %s, not %s", pv.Name, pv.UID, sent.UID)
	}
	if err := s.deletable(ctx, pv); err != nil {
		return nil, err
	}
	_, err = s.controller.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle})
	if err != nil && status.Code(err) != codes.NotFound {
		return &provisionerv1.DeleteVolumeResponse{Outcome: outcome(err, nil), Message: "DeleteVolume: " + err.Error()}, nil
	}
	return &provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil
}

// deletable refuses a volume whose data may still be wanted.
func (s *Server) deletable(ctx context.Context, pv *corev1.PersistentVolume) error {
	if p := pv.Status.Phase; p != corev1.VolumeReleased && p != corev1.VolumeFailed {
		return precondition("PersistentVolume %s is %q, not Released or Failed", pv.Name, p)
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		return precondition("PersistentVolume %s has reclaim policy %s, not Delete", pv.Name, pv.Spec.PersistentVolumeReclaimPolicy)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != s.driver {
		return precondition("PersistentVolume %s is not a volume of CSI driver %s", pv.Name, s.driver)
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		c, err := s.kube.CoreV1().PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return fromAPI(err, "claim "+ref.Namespace+"/"+ref.Name)
		case ref.UID == "" || c.UID == ref.UID:
			return precondition("claim %s/%s still exists", ref.Namespace, ref.Name)
		}
	}
	claims, err := s.kube.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fromAPI(err, "claims")
	}
	for _, c := range claims.Items {
		if c.Spec.VolumeName == pv.Name && c.DeletionTimestamp == nil {
			return precondition("claim %s/%s asks for PersistentVolume %s", c.Namespace, c.Name, pv.Name)
		}
	}
	return nil
}
