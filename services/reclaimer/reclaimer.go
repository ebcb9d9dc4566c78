package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// Service is the reclaimer's name in etcd membership.
const Service = "reclaimer"

// Options configures a reclaimer replica.
type Options struct {
	// Kubeconfig is the kubeconfig path; empty means in-cluster config.
	Kubeconfig string
	// RESTConfig, when set, is used instead of Kubeconfig (tests).
	RESTConfig *rest.Config
	// KubeQPS limits API requests per second; 0 means no client-side limit.
	KubeQPS float32
	// KubeBurst is the burst allowed above KubeQPS.
	KubeBurst int
	// EtcdEndpoints are the etcd client URLs for membership.
	EtcdEndpoints []string
	// Listen is the gRPC listen address.
	Listen string
	// AdvertiseAddress is where peers reach this replica; default Listen.
	AdvertiseAddress string
	// MemberID names this replica in etcd; default hostname plus a random
	// suffix.
	MemberID string
	// Logger; default slog.Default().
	Logger *slog.Logger
}

func (o *Options) validate() error {
	var errs []error
	if o.Listen == "" {
		errs = append(errs, errors.New("a listen address is required (--listen)"))
	}
	if len(o.EtcdEndpoints) == 0 {
		errs = append(errs, errors.New("etcd endpoints are required for membership (--etcd-endpoints)"))
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.AdvertiseAddress == "" {
		o.AdvertiseAddress = o.Listen
	}
	if o.MemberID == "" {
		o.MemberID = coord.DefaultMemberID()
	}
	return errors.Join(errs...)
}

// Run runs a reclaimer replica until ctx ends.
func Run(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return fmt.Errorf("reclaimer options: %w", err)
	}
	log := o.Logger
	co, err := coord.New(ctx, coord.Options{Endpoints: o.EtcdEndpoints, Logger: log})
	if err != nil {
		return err
	}
	defer co.Close()
	lis, err := grpcutil.Listen(o.Listen)
	if err != nil {
		return err
	}
	srv := grpcutil.NewServer(log)
	reclaimerv1.RegisterReclaimerServiceServer(srv.Server, NewServer(log, o.MemberID))
	if err := co.Register(ctx, Service, o.MemberID, o.AdvertiseAddress); err != nil {
		return err
	}
	srv.SetServing(true, reclaimerv1.ReclaimerService_ServiceDesc.ServiceName)
	log.Info("reclaimer starting", "member", o.MemberID, "listen", lis.Addr().String())
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Serve(gctx, lis, 10*time.Second) })
	g.Go(func() error {
		return co.Wait(gctx)
	})
	err = g.Wait()
	log.Info("reclaimer stopped")
	return err
}

// Server implements ReclaimerService.
type Server struct {
	reclaimerv1.UnimplementedReclaimerServiceServer
	log    *slog.Logger
	member string
	mu     sync.Mutex
	byName map[string]*reclaimerv1.Reclaim
	now    func() time.Time
}

// NewServer returns a ReclaimerService with no records.
func NewServer(log *slog.Logger, member string) *Server {
	return &Server{log: log, member: member, byName: map[string]*reclaimerv1.Reclaim{}, now: time.Now}
}

// Reclaim records the volume's reclaim and carries out its policy.
func (s *Server) Reclaim(_ context.Context, req *reclaimerv1.ReclaimRequest) (*reclaimerv1.ReclaimResponse, error) {
	if req.GetVolumeName() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_name is required")
	}
	if len(req.GetVolume()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume is required: the PersistentVolume in Kubernetes protobuf encoding")
	}
	pv, err := kube.DecodeVolume(req.GetVolume())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume: %v", err)
	}
	if pv.Name != req.GetVolumeName() {
		return nil, status.Errorf(codes.InvalidArgument, "volume_name %q does not match the volume's metadata.name %q", req.GetVolumeName(), pv.Name)
	}
	if req.GetVolumeUid() != "" && string(pv.UID) != req.GetVolumeUid() {
		return nil, status.Errorf(codes.InvalidArgument, "volume_uid %q does not match the volume's metadata.uid %q", req.GetVolumeUid(), pv.UID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.byName[pv.Name]; ok && r.VolumeUid == string(pv.UID) {
		return &reclaimerv1.ReclaimResponse{Reclaim: proto.Clone(r).(*reclaimerv1.Reclaim)}, nil
	}
	r := &reclaimerv1.Reclaim{VolumeName: pv.Name, VolumeUid: string(pv.UID), Policy: string(pv.Spec.PersistentVolumeReclaimPolicy), Owner: s.member, Attempts: 1, UpdateTime: timestamppb.New(s.now())}
	switch pv.Spec.PersistentVolumeReclaimPolicy {
	case corev1.PersistentVolumeReclaimRetain:
		r.State, r.Message = reclaimerv1.State_STATE_RETAINED, "the volume stays Released with its data until an administrator deletes or reuses it"
	case corev1.PersistentVolumeReclaimRecycle, corev1.PersistentVolumeReclaimDelete:
		r.State, r.Message = reclaimerv1.State_STATE_PENDING, fmt.Sprintf("reclaim policy %s is not carried out by this release yet; the volume stays Released", pv.Spec.PersistentVolumeReclaimPolicy)
	default:
		r.State, r.Message = reclaimerv1.State_STATE_FAILED, fmt.Sprintf("unknown reclaim policy %q", pv.Spec.PersistentVolumeReclaimPolicy)
	}
	s.byName[pv.Name] = r
	s.log.Info("reclaim recorded", "volume", pv.Name, "policy", r.Policy, "state", r.State)
	return &reclaimerv1.ReclaimResponse{Reclaim: proto.Clone(r).(*reclaimerv1.Reclaim)}, nil
}

// GetReclaim returns the record of one volume.
func (s *Server) GetReclaim(_ context.Context, req *reclaimerv1.GetReclaimRequest) (*reclaimerv1.GetReclaimResponse, error) {
	if req.GetVolumeName() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_name is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byName[req.GetVolumeName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no reclaim of volume %q is recorded", req.GetVolumeName())
	}
	return &reclaimerv1.GetReclaimResponse{Reclaim: proto.Clone(r).(*reclaimerv1.Reclaim)}, nil
}

// ListReclaims lists the records, optionally in one state, by volume name.
func (s *Server) ListReclaims(_ context.Context, req *reclaimerv1.ListReclaimsRequest) (*reclaimerv1.ListReclaimsResponse, error) {
	if _, ok := reclaimerv1.State_name[int32(req.GetState())]; !ok {
		return nil, status.Errorf(codes.InvalidArgument, "state %d is unknown", req.GetState())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &reclaimerv1.ListReclaimsResponse{}
	for _, r := range s.byName {
		if req.GetState() == reclaimerv1.State_STATE_UNSPECIFIED || r.State == req.GetState() {
			out.Reclaims = append(out.Reclaims, proto.Clone(r).(*reclaimerv1.Reclaim))
		}
	}
	sort.Slice(out.Reclaims, func(i, j int) bool { return out.Reclaims[i].VolumeName < out.Reclaims[j].VolumeName })
	return out, nil
}

// RetryReclaim runs a FAILED reclaim again.
func (s *Server) RetryReclaim(_ context.Context, req *reclaimerv1.RetryReclaimRequest) (*reclaimerv1.RetryReclaimResponse, error) {
	if req.GetVolumeName() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_name is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byName[req.GetVolumeName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no reclaim of volume %q is recorded", req.GetVolumeName())
	}
	if r.State != reclaimerv1.State_STATE_FAILED {
		return nil, status.Errorf(codes.FailedPrecondition, "the reclaim of volume %q is %s; only a FAILED reclaim can be retried", r.VolumeName, r.State)
	}
	return nil, status.Errorf(codes.FailedPrecondition, "the reclaim of volume %q failed with %q; fix the volume's reclaim policy, which the binder then hands over again", r.VolumeName, r.Message)
}
