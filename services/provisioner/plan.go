package provisioner

import (
	"context"
	"fmt"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volplane/volplane/pkg/claimvalidation"
	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/match"
	"github.com/volplane/volplane/pkg/sidecar"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// PlanVolume answers the CreateVolume request Provision would send first
// for a claim, without secrets, built by the same code (plan). It writes
// nothing, calls the driver for nothing and reads no Secret: the claim may
// be one that does not exist, such as the API server's answer to a dry-run
// create.
func (s *server) PlanVolume(ctx context.Context, req *provisionerv1.PlanVolumeRequest) (*provisionerv1.PlanVolumeResponse, error) {
	if len(req.GetClaim()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "claim is required")
	}
	claim, err := kube.DecodeClaim(req.GetClaim())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "claim: %v", err)
	}
	if err := guard.CheckName("claim namespace", claim.Namespace, guard.Namespace); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	// The claim may be anyone's: it is planned only if the API server
	// would take it (its size bounded, above all).
	if errs := claimvalidation.Validate(claim); len(errs) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "claim: %v", errs.ToAggregate())
	}
	name := match.ClaimClass(claim)
	if name == "" {
		return nil, status.Errorf(codes.FailedPrecondition, "the claim names no StorageClass: nothing to provision")
	}
	class, err := s.readClass(ctx, name, nil)
	if err != nil {
		return nil, err
	}
	d, req2, secrets, err := s.p.plan(ctx, claim, class)
	switch {
	case err != nil && d == nil:
		return nil, toStatus(err)
	case err != nil:
		return nil, status.Errorf(codes.FailedPrecondition, "failed to provision volume with StorageClass %q: %v", class.Name, err)
	}
	return &provisionerv1.PlanVolumeResponse{
		ProvisionerName: class.Provisioner,
		DriverReady:     d.ready(),
		Plan:            planOf(req2, d.name(), secrets["provisioner"] != nil),
	}, nil
}

// plan builds the CreateVolume request of a first attempt at claim's
// volume exactly as provision does (secret references resolved, then
// createRequest), with no side effect: nothing is journaled, no Secret is
// read, the driver is not called. d is nil when no driver serves the class.
func (p *provisioner) plan(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (d *driver, req *csi.CreateVolumeRequest, secrets map[string]*secretRef, err error) {
	d = p.drivers.byProvisioner(class.Provisioner)
	if d == nil {
		return nil, nil, nil, fmt.Errorf("provisioner %q of StorageClass %q is %w", class.Provisioner, class.Name, errNotServed)
	}
	spec := p.spec(d, claim, class)
	if err = p.checkModifyVolume(d, claim); err != nil {
		return d, nil, nil, err
	}
	if secrets, err = p.secretRefs(class, claim, spec.name); err != nil {
		return d, nil, nil, err
	}
	if req, err = p.createRequest(forPlan(ctx), d, claim, class, spec); err != nil {
		return d, nil, nil, err
	}
	return d, req, secrets, nil
}

// spec is what provision and plan know of a claim's volume before the
// driver is asked.
func (p *provisioner) spec(d *driver, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) volumeSpec {
	return volumeSpec{name: p.namingFor(d).name(claim), provisioner: class.Provisioner, claim: claim, class: class, fsType: fsType(class, claim, p.fsTypeFor(d)),
		topology: p.topologyFor(d), attributesClass: p.gateFor(d, sidecar.GateVolumeAttributesClass)}
}

// planOf is a CreateVolume request as PlanVolume shows it. The request
// never holds secrets here (they are added right before the call); only
// whether the call would carry some is said.
func planOf(req *csi.CreateVolumeRequest, driver string, withSecrets bool) *provisionerv1.CreateVolumePlan {
	out := &provisionerv1.CreateVolumePlan{
		VolumeName:        req.GetName(),
		DriverName:        driver,
		RequiredBytes:     req.GetCapacityRange().GetRequiredBytes(),
		LimitBytes:        req.GetCapacityRange().GetLimitBytes(),
		Parameters:        req.GetParameters(),
		MutableParameters: req.GetMutableParameters(),
		WithSecrets:       withSecrets,
	}
	for _, c := range req.GetVolumeCapabilities() {
		vc := &provisionerv1.VolumeCapability{AccessMode: c.GetAccessMode().GetMode().String()}
		if c.GetBlock() != nil {
			vc.Block = true
		} else {
			vc.FsType, vc.MountFlags = c.GetMount().GetFsType(), c.GetMount().GetMountFlags()
		}
		out.VolumeCapabilities = append(out.VolumeCapabilities, vc)
	}
	for _, t := range req.GetAccessibilityRequirements().GetRequisite() {
		out.RequisiteTopology = append(out.RequisiteTopology, &provisionerv1.TopologySegment{Segments: t.GetSegments()})
	}
	for _, t := range req.GetAccessibilityRequirements().GetPreferred() {
		out.PreferredTopology = append(out.PreferredTopology, &provisionerv1.TopologySegment{Segments: t.GetSegments()})
	}
	out.SourceSnapshotId = req.GetVolumeContentSource().GetSnapshot().GetSnapshotId()
	out.SourceVolumeId = req.GetVolumeContentSource().GetVolume().GetVolumeId()
	return out
}
