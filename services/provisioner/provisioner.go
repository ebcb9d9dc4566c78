package provisioner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// Service is the provisioner's name in etcd membership.
const Service = "provisioner"

// Options configures a provisioner replica.
type Options struct {
	// Kubeconfig is the kubeconfig path; empty means in-cluster config.
	// (Used from the provisioning issue on, to create PVs.)
	Kubeconfig string
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
	// CSIEndpoints are the CSI drivers' gRPC addresses (unix:///path or
	// host:port).
	CSIEndpoints []string
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
	for _, e := range o.CSIEndpoints {
		if strings.TrimSpace(e) == "" {
			errs = append(errs, errors.New("an empty CSI endpoint was given (--csi-endpoint)"))
		}
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

// Run runs a provisioner replica until ctx ends.
func Run(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return fmt.Errorf("provisioner options: %w", err)
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
	s := NewServer(log)
	for _, ep := range o.CSIEndpoints {
		cc, err := grpcutil.Dial(ep)
		if err != nil {
			return fmt.Errorf("CSI endpoint %s: %w", ep, err)
		}
		defer cc.Close()
		s.AddDriver(ep, cc)
	}
	srv := grpcutil.NewServer(log)
	provisionerv1.RegisterProvisionerServiceServer(srv.Server, s)
	if err := co.Register(ctx, Service, o.MemberID, o.AdvertiseAddress); err != nil {
		return err
	}
	srv.SetServing(true, provisionerv1.ProvisionerService_ServiceDesc.ServiceName)
	log.Info("provisioner starting", "member", o.MemberID, "listen", lis.Addr().String(), "csi_endpoints", o.CSIEndpoints)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Serve(gctx, lis, 10*time.Second) })
	g.Go(func() error {
		s.probeLoop(gctx, 30*time.Second)
		return nil
	})
	g.Go(func() error {
		return co.Wait(gctx)
	})
	err = g.Wait()
	log.Info("provisioner stopped")
	return err
}

// Server implements ProvisionerService.
type Server struct {
	provisionerv1.UnimplementedProvisionerServiceServer
	log     *slog.Logger
	mu      sync.Mutex
	drivers []*driver
}

type driver struct {
	endpoint string
	identity csi.IdentityClient
	info     *provisionerv1.Driver
}

// NewServer returns a ProvisionerService without drivers.
func NewServer(log *slog.Logger) *Server { return &Server{log: log} }

// AddDriver adds the CSI driver reachable through cc at endpoint; it is
// probed by the next probe round.
func (s *Server) AddDriver(endpoint string, cc grpc.ClientConnInterface) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drivers = append(s.drivers, &driver{endpoint: endpoint, identity: csi.NewIdentityClient(cc),
		info: &provisionerv1.Driver{Endpoint: endpoint, Message: "not probed yet"}})
}

func (s *Server) probeLoop(ctx context.Context, every time.Duration) {
	for {
		s.probeAll(ctx)
		select {
		case <-time.After(every):
		case <-ctx.Done():
			return
		}
	}
}

// probeAll asks every driver who it is, what it can do and whether it is
// ready (CSI Identity: GetPluginInfo, GetPluginCapabilities, Probe).
func (s *Server) probeAll(ctx context.Context) {
	s.mu.Lock()
	drivers := append([]*driver(nil), s.drivers...)
	s.mu.Unlock()
	for _, d := range drivers {
		info := probe(ctx, d)
		if info.Ready != d.current().Ready {
			s.log.Info("CSI driver", "endpoint", d.endpoint, "driver", info.DriverName, "ready", info.Ready, "message", info.Message)
		}
		s.mu.Lock()
		d.info = info
		s.mu.Unlock()
	}
}

func (d *driver) current() *provisionerv1.Driver { return d.info }

func probe(ctx context.Context, d *driver) *provisionerv1.Driver {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	info := &provisionerv1.Driver{Endpoint: d.endpoint}
	pi, err := d.identity.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		info.Message = fmt.Sprintf("GetPluginInfo: %v", err)
		return info
	}
	info.DriverName, info.ProvisionerName, info.VendorVersion = pi.GetName(), pi.GetName(), pi.GetVendorVersion()
	caps, err := d.identity.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		info.Message = fmt.Sprintf("GetPluginCapabilities: %v", err)
		return info
	}
	for _, c := range caps.GetCapabilities() {
		if svc := c.GetService(); svc != nil {
			info.Capabilities = append(info.Capabilities, svc.GetType().String())
		}
		if ve := c.GetVolumeExpansion(); ve != nil {
			info.Capabilities = append(info.Capabilities, "VOLUME_EXPANSION_"+ve.GetType().String())
		}
	}
	sort.Strings(info.Capabilities)
	pr, err := d.identity.Probe(ctx, &csi.ProbeRequest{})
	switch {
	case err != nil:
		info.Message = fmt.Sprintf("Probe: %v", err)
	case pr.GetReady() != nil && !pr.GetReady().GetValue():
		info.Message = "the driver reports it is not ready"
	default:
		info.Ready = true
	}
	return info
}

// ListDrivers lists the configured CSI drivers as last probed.
func (s *Server) ListDrivers(context.Context, *provisionerv1.ListDriversRequest) (*provisionerv1.ListDriversResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &provisionerv1.ListDriversResponse{}
	for _, d := range s.drivers {
		out.Drivers = append(out.Drivers, proto.Clone(d.info).(*provisionerv1.Driver))
	}
	return out, nil
}

// ListOperations lists operations in flight: none until provisioning
// arrives.
func (s *Server) ListOperations(context.Context, *provisionerv1.ListOperationsRequest) (*provisionerv1.ListOperationsResponse, error) {
	return &provisionerv1.ListOperationsResponse{}, nil
}

// Provision validates the request; provisioning itself is not in this
// release.
func (s *Server) Provision(_ context.Context, req *provisionerv1.ProvisionRequest) (*provisionerv1.ProvisionResponse, error) {
	var errs []string
	if req.GetClaimNamespace() == "" {
		errs = append(errs, "claim_namespace is required")
	}
	if req.GetClaimName() == "" {
		errs = append(errs, "claim_name is required")
	}
	if req.GetClaimUid() == "" {
		errs = append(errs, "claim_uid is required")
	}
	if len(req.GetClaim()) == 0 {
		errs = append(errs, "claim is required: the PersistentVolumeClaim in Kubernetes protobuf encoding")
	} else if c, err := kube.DecodeClaim(req.GetClaim()); err != nil {
		errs = append(errs, "claim: "+err.Error())
	} else if c.Namespace != req.GetClaimNamespace() || c.Name != req.GetClaimName() || string(c.UID) != req.GetClaimUid() {
		errs = append(errs, fmt.Sprintf("claim is %s/%s (uid %s), not the claim_namespace/claim_name/claim_uid of the request", c.Namespace, c.Name, c.UID))
	}
	if len(req.GetStorageClass()) == 0 {
		errs = append(errs, "storage_class is required: the StorageClass in Kubernetes protobuf encoding")
	} else if _, err := kube.DecodeStorageClass(req.GetStorageClass()); err != nil {
		errs = append(errs, "storage_class: "+err.Error())
	}
	if len(errs) > 0 {
		return nil, status.Error(codes.InvalidArgument, strings.Join(errs, "; "))
	}
	return nil, status.Error(codes.Unimplemented, "dynamic provisioning through CSI arrives with the provisioning issue; this provisioner only reports its drivers")
}

// DeleteVolume validates the request; deletion itself is not in this
// release.
func (s *Server) DeleteVolume(_ context.Context, req *provisionerv1.DeleteVolumeRequest) (*provisionerv1.DeleteVolumeResponse, error) {
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
	return nil, status.Error(codes.Unimplemented, "deleting volumes through CSI arrives with the reclaim issue")
}
