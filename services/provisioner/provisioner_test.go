package provisioner

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// identity is a fake CSI driver's identity service.
type identity struct {
	csi.UnimplementedIdentityServer
	ready bool
}

func (identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "fake.csi.volplane.dev", VendorVersion: "0.1.0"}, nil
}

func (identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}, nil
}

func (i identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(i.ready)}, nil
}

func TestListDriversReportsProbedDrivers(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, identity{ready: true})
	go srv.Serve(lis)
	defer srv.Stop()
	cc, err := grpcutil.Dial("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()

	s := NewServer(slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.AddDriver("unix://"+sock, cc)
	s.AddDriver("unix:///nonexistent.sock", mustDial(t, "unix:///nonexistent.sock"))
	s.probeAll(context.Background())
	resp, err := s.ListDrivers(context.Background(), &provisionerv1.ListDriversRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Drivers) != 2 {
		t.Fatalf("drivers %v", resp.Drivers)
	}
	d := resp.Drivers[0]
	if d.DriverName != "fake.csi.volplane.dev" || d.VendorVersion != "0.1.0" || !d.Ready || len(d.Capabilities) != 1 || d.Capabilities[0] != "CONTROLLER_SERVICE" {
		t.Fatalf("driver %v", d)
	}
	if bad := resp.Drivers[1]; bad.Ready || !strings.Contains(bad.Message, "GetPluginInfo") {
		t.Fatalf("unreachable driver %v", bad)
	}
}

func mustDial(t *testing.T, target string) *grpc.ClientConn {
	cc, err := grpcutil.Dial(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func TestRequestValidation(t *testing.T) {
	s := NewServer(slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	claim, _ := kube.EncodeProto(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "u1"}})
	for name, tc := range map[string]struct {
		req  *provisionerv1.ProvisionRequest
		code codes.Code
		msg  string
	}{
		"empty":         {&provisionerv1.ProvisionRequest{}, codes.InvalidArgument, "claim_namespace is required"},
		"garbage claim": {&provisionerv1.ProvisionRequest{ClaimNamespace: "ns", ClaimName: "c", ClaimUid: "u1", Claim: []byte{0xff, 0x01}}, codes.InvalidArgument, "claim: decode"},
		"other claim":   {&provisionerv1.ProvisionRequest{ClaimNamespace: "ns", ClaimName: "d", ClaimUid: "u1", Claim: claim}, codes.InvalidArgument, "not the claim_namespace"},
		"no class":      {&provisionerv1.ProvisionRequest{ClaimNamespace: "ns", ClaimName: "c", ClaimUid: "u1", Claim: claim}, codes.InvalidArgument, "storage_class is required"},
	} {
		_, err := s.Provision(ctx, tc.req)
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: got %v, want %v containing %q", name, err, tc.code, tc.msg)
		}
	}
	if _, err := s.DeleteVolume(ctx, &provisionerv1.DeleteVolumeRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("DeleteVolume without a name: %v", err)
	}
	pv, _ := kube.EncodeProto(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv"}})
	if _, err := s.DeleteVolume(ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: "pv", Volume: pv}); status.Code(err) != codes.Unimplemented {
		t.Errorf("valid DeleteVolume: %v, want Unimplemented until the reclaim issue", err)
	}
}
