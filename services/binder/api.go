package binder

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/guard"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/paging"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// api serves BinderService from the controller's cache.
type api struct {
	binderv1.UnimplementedBinderServiceServer
	c        *controller
	memberID string
	members  func() []string
	// peers passes sync requests to the replica that owns the object; nil
	// means every object is this replica's.
	peers *peers
	// shard is the claim shard the cache holds (--claims-by-shard); nil:
	// the cache holds every claim.
	shard   claimShard
	workers int
	// prov answers explain's and match's questions to the provisioner
	// service; nil when the binder has none.
	prov provisionerInfo
	// ptl answers GetClaimTimeline's question to the provisioner service;
	// nil when the binder has none.
	ptl provisionerTimeline
	// dryRun creates a claim as a dry run for MatchClaim; nil asks the
	// API server (controller.apiDryRun).
	dryRun dryRunCreate
}

var _ binderv1.BinderServiceServer = (*api)(nil)

func (a *api) ready() error {
	if !a.c.synced.Load() {
		return status.Error(codes.Unavailable, errNotSynced.Error()+"; retry shortly")
	}
	return nil
}

// checkNames refuses invalid names up front (InvalidArgument naming the
// field), as the API server would; a namespace is checked when kind is
// ClaimName.
func checkNames(namespace, name string, kind guard.NameKind) error {
	if kind == guard.ClaimName {
		if err := guard.CheckName("namespace", namespace, guard.Namespace); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	if err := guard.CheckName("name", name, kind); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return nil
}

func checkPhase(phase string, allowed ...string) error {
	if phase == "" {
		return nil
	}
	for _, a := range allowed {
		if phase == a {
			return nil
		}
	}
	return status.Errorf(codes.InvalidArgument, "phase %q is not a phase: use one of %s, or leave it empty for all", phase, strings.Join(allowed, ", "))
}

// checkFilters refuses filter values no object could have (InvalidArgument
// naming the field); an empty value is no filter.
func checkFilters(namespace string, texts ...string) error {
	if namespace != "" {
		if err := guard.CheckName("namespace", namespace, guard.Namespace); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	for i := 0; i+1 < len(texts); i += 2 {
		if err := guard.CheckText(texts[i], texts[i+1]); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	return nil
}

// newPage starts a page of a list, InvalidArgument for a bad size or token.
func newPage[T any](list string, size int32, token string, filters ...string) (*paging.Pager[T], error) {
	p, err := paging.New[T](list, size, token, filters...)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return p, nil
}

// claimsList names ListClaims' pages (pkg/paging).
const claimsList = "binder.claims"

// ListClaims implements BinderService: a page of the claims that pass the
// filters, in key order. With every claim cached (no claim shard) this
// replica answers from its cache; else the replicas of the ring answer
// together (fanout.go), and a call from another replica that names a ring
// (claimShardHeader) is answered with this replica's shard of it.
func (a *api) ListClaims(ctx context.Context, req *binderv1.ListClaimsRequest) (*binderv1.ListClaimsResponse, error) {
	if err := a.ready(); err != nil {
		return nil, err
	}
	if err := checkPhase(req.GetPhase(), string(corev1.ClaimPending), string(corev1.ClaimBound), string(corev1.ClaimLost)); err != nil {
		return nil, err
	}
	if err := checkFilters(req.GetNamespace(), "storage_class_name", req.GetStorageClassName(), "driver", req.GetDriver()); err != nil {
		return nil, err
	}
	// The page size and token are checked before anything else is asked.
	if _, err := newPage[*corev1.PersistentVolumeClaim](claimsList, req.GetPageSize(), req.GetPageToken(), claimFilters(req)...); err != nil {
		return nil, err
	}
	if members, ok := askedShard(ctx); ok {
		return a.shardClaims(ctx, req, members)
	}
	if a.shard == nil {
		return a.localClaims(req, nil)
	}
	return a.fanOutClaims(ctx, req)
}

// localClaims is a page of the cached claims that pass req's filters and
// keep (nil: every cached claim), in key order.
func (a *api) localClaims(req *binderv1.ListClaimsRequest, keep func(key string) bool) (*binderv1.ListClaimsResponse, error) {
	ns, phase, class, driver := req.GetNamespace(), req.GetPhase(), req.GetStorageClassName(), req.GetDriver()
	page, err := newPage[*corev1.PersistentVolumeClaim](claimsList, req.GetPageSize(), req.GetPageToken(), claimFilters(req)...)
	if err != nil {
		return nil, err
	}
	a.c.store.eachClaim(func(key string, cl *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass) {
		switch {
		case !page.Want(key),
			ns != "" && cl.Namespace != ns,
			phase != "" && string(cl.Status.Phase) != phase,
			class != "" && claimClassName(cl) != class,
			driver != "" && cl.Annotations[kube.AnnStorageProvisioner] != driver && (sc == nil || sc.Provisioner != driver),
			keep != nil && !keep(key):
			return
		}
		page.Offer(key, cl)
	})
	claims, next := page.Page()
	resp := &binderv1.ListClaimsResponse{NextPageToken: next, Claims: make([]*binderv1.Claim, len(claims))}
	for i, cl := range claims {
		resp.Claims[i] = claimToAPI(cl)
	}
	return resp, nil
}

// GetClaim implements BinderService.
// The claim's owner answers: its cache holds the claim's shard.
func (a *api) GetClaim(ctx context.Context, req *binderv1.GetClaimRequest) (*binderv1.GetClaimResponse, error) {
	key, err := a.claimRequest(req.GetNamespace(), req.GetName())
	if err != nil {
		return nil, err
	}
	if resp, forwarded, err := atOwner(ctx, a.peers, "pvc/"+key, func(owner binderv1.BinderServiceClient, ctx context.Context) (*binderv1.GetClaimResponse, error) {
		return owner.GetClaim(ctx, req)
	}); forwarded {
		return resp, err
	}
	cl := a.c.store.claim(key)
	if cl == nil {
		return nil, a.missingClaim(key)
	}
	return &binderv1.GetClaimResponse{Claim: claimToAPI(cl)}, nil
}

// ListVolumes implements BinderService: a page of the cached volumes that
// pass the filters, in name order.
func (a *api) ListVolumes(_ context.Context, req *binderv1.ListVolumesRequest) (*binderv1.ListVolumesResponse, error) {
	if err := a.ready(); err != nil {
		return nil, err
	}
	if err := checkPhase(req.GetPhase(), string(corev1.VolumePending), string(corev1.VolumeAvailable),
		string(corev1.VolumeBound), string(corev1.VolumeReleased), string(corev1.VolumeFailed)); err != nil {
		return nil, err
	}
	phase, class, driver, ns := req.GetPhase(), req.GetStorageClassName(), req.GetDriver(), req.GetClaimNamespace()
	if ns != "" {
		if err := guard.CheckName("claim_namespace", ns, guard.Namespace); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	if err := checkFilters("", "storage_class_name", class, "driver", driver); err != nil {
		return nil, err
	}
	page, err := newPage[*corev1.PersistentVolume]("binder.volumes", req.GetPageSize(), req.GetPageToken(),
		"phase", phase, "class", class, "driver", driver, "claimNamespace", ns)
	if err != nil {
		return nil, err
	}
	a.c.store.eachVolume(func(v *corev1.PersistentVolume) {
		switch {
		case !page.Want(v.Name),
			phase != "" && string(v.Status.Phase) != phase,
			class != "" && v.Spec.StorageClassName != class,
			driver != "" && volumeDriver(v) != driver,
			ns != "" && (v.Spec.ClaimRef == nil || v.Spec.ClaimRef.Namespace != ns):
			return
		}
		page.Offer(v.Name, v)
	})
	volumes, next := page.Page()
	resp := &binderv1.ListVolumesResponse{NextPageToken: next, Volumes: make([]*binderv1.Volume, len(volumes))}
	for i, v := range volumes {
		resp.Volumes[i] = volumeToAPI(v)
	}
	return resp, nil
}

// volumeDriver is a volume's CSI driver, else the provisioner that made it.
func volumeDriver(v *corev1.PersistentVolume) string {
	if v.Spec.CSI != nil {
		return v.Spec.CSI.Driver
	}
	return v.Annotations[kube.AnnDynamicallyProvisioned]
}

// GetVolume implements BinderService.
func (a *api) GetVolume(_ context.Context, req *binderv1.GetVolumeRequest) (*binderv1.GetVolumeResponse, error) {
	if err := checkNames("", req.GetName(), guard.VolumeName); err != nil {
		return nil, err
	}
	if err := a.ready(); err != nil {
		return nil, err
	}
	v := a.c.store.volume(req.GetName())
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", req.GetName())
	}
	return &binderv1.GetVolumeResponse{Volume: volumeToAPI(v)}, nil
}

// claimRequest checks a request's claim names and that the replica is
// ready, and returns the claim's key. The claim's owner answers such a
// request: only its cache holds the claim's shard.
func (a *api) claimRequest(namespace, name string) (string, error) {
	if err := checkNames(namespace, name, guard.ClaimName); err != nil {
		return "", err
	}
	if err := a.ready(); err != nil {
		return "", err
	}
	return namespace + "/" + name, nil
}

// SyncClaim implements BinderService.
func (a *api) SyncClaim(ctx context.Context, req *binderv1.SyncClaimRequest) (*binderv1.SyncClaimResponse, error) {
	key, err := a.claimRequest(req.GetNamespace(), req.GetName())
	if err != nil {
		return nil, err
	}
	if resp, forwarded, err := atOwner(ctx, a.peers, "pvc/"+key, func(owner binderv1.BinderServiceClient, ctx context.Context) (*binderv1.SyncClaimResponse, error) {
		return owner.SyncClaim(ctx, req)
	}); forwarded {
		return resp, err
	}
	if a.c.store.claim(key) == nil {
		return nil, a.missingClaim(key)
	}
	a.c.claimQueue.add(key)
	return &binderv1.SyncClaimResponse{}, nil
}

// SyncVolume implements BinderService.
func (a *api) SyncVolume(ctx context.Context, req *binderv1.SyncVolumeRequest) (*binderv1.SyncVolumeResponse, error) {
	if err := checkNames("", req.GetName(), guard.VolumeName); err != nil {
		return nil, err
	}
	if err := a.ready(); err != nil {
		return nil, err
	}
	v := a.c.store.volume(req.GetName())
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", req.GetName())
	}
	if resp, forwarded, err := atOwner(ctx, a.peers, volumeOwnerKey(v), func(owner binderv1.BinderServiceClient, ctx context.Context) (*binderv1.SyncVolumeResponse, error) {
		return owner.SyncVolume(ctx, req)
	}); forwarded {
		return resp, err
	}
	a.c.volumeQueue.add(req.GetName())
	return &binderv1.SyncVolumeResponse{}, nil
}

// GetStatus implements BinderService.
func (a *api) GetStatus(context.Context, *binderv1.GetStatusRequest) (*binderv1.GetStatusResponse, error) {
	claims, volumes := a.c.store.counts()
	return &binderv1.GetStatusResponse{
		MemberId:          a.memberID,
		Members:           a.members(),
		Synced:            a.c.synced.Load(),
		Workers:           int32(a.workers),
		ClaimQueueLength:  int32(a.c.claimQueue.Len()),
		VolumeQueueLength: int32(a.c.volumeQueue.Len()),
		Claims:            int64(claims),
		Volumes:           int64(volumes),
		BindsTotal:        a.c.bindsTotal.Load(),
	}, nil
}

func claimToAPI(cl *corev1.PersistentVolumeClaim) *binderv1.Claim {
	req := cl.Spec.Resources.Requests[corev1.ResourceStorage]
	capacity := cl.Status.Capacity[corev1.ResourceStorage]
	out := &binderv1.Claim{
		Namespace:          cl.Namespace,
		Name:               cl.Name,
		Uid:                string(cl.UID),
		Phase:              string(cl.Status.Phase),
		VolumeName:         cl.Spec.VolumeName,
		StorageClassName:   claimClassName(cl),
		RequestedBytes:     req.Value(),
		CapacityBytes:      capacity.Value(),
		AccessModes:        modes(cl.Spec.AccessModes),
		VolumeMode:         volumeMode(cl.Spec.VolumeMode),
		BindCompleted:      metav1.HasAnnotation(cl.ObjectMeta, kube.AnnBindCompleted),
		BoundByController:  metav1.HasAnnotation(cl.ObjectMeta, kube.AnnBoundByController),
		StorageProvisioner: cl.Annotations[kube.AnnStorageProvisioner],
		SelectedNode:       cl.Annotations[kube.AnnSelectedNode],
		ResourceVersion:    cl.ResourceVersion,
		CreateTime:         timestamppb.New(cl.CreationTimestamp.Time),
		Deleting:           cl.DeletionTimestamp != nil,
	}
	return out
}

func volumeToAPI(v *corev1.PersistentVolume) *binderv1.Volume {
	capacity := v.Spec.Capacity[corev1.ResourceStorage]
	out := &binderv1.Volume{
		Name:              v.Name,
		Uid:               string(v.UID),
		Phase:             string(v.Status.Phase),
		Message:           v.Status.Message,
		StorageClassName:  v.Spec.StorageClassName,
		CapacityBytes:     capacity.Value(),
		AccessModes:       modes(v.Spec.AccessModes),
		VolumeMode:        volumeMode(v.Spec.VolumeMode),
		ReclaimPolicy:     string(v.Spec.PersistentVolumeReclaimPolicy),
		ProvisionedBy:     v.Annotations[kube.AnnDynamicallyProvisioned],
		BoundByController: metav1.HasAnnotation(v.ObjectMeta, kube.AnnBoundByController),
		ResourceVersion:   v.ResourceVersion,
		CreateTime:        timestamppb.New(v.CreationTimestamp.Time),
		Deleting:          v.DeletionTimestamp != nil,
	}
	if r := v.Spec.ClaimRef; r != nil {
		out.ClaimRef = &binderv1.ClaimReference{Namespace: r.Namespace, Name: r.Name, Uid: string(r.UID)}
	}
	return out
}

func claimClassName(cl *corev1.PersistentVolumeClaim) string {
	if cl.Spec.StorageClassName != nil {
		return *cl.Spec.StorageClassName
	}
	return cl.Annotations[kube.AnnBetaStorageClass]
}

func modes(m []corev1.PersistentVolumeAccessMode) []string {
	out := make([]string, len(m))
	for i, x := range m {
		out[i] = string(x)
	}
	return out
}

func volumeMode(m *corev1.PersistentVolumeMode) string {
	if m == nil {
		return string(corev1.PersistentVolumeFilesystem)
	}
	return string(*m)
}
