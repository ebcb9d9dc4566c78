package devcsi_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
)

// driver is a devcsi.Driver running in-process on a unix socket, with
// clients for its three services.
type driver struct {
	*devcsi.Driver
	addr string
	csi.IdentityClient
	csi.ControllerClient
	csi.NodeClient
	health healthpb.HealthClient
	stop   func() // stops Run and waits for it
}

// start runs a driver with o (RootDir default: a temporary directory) until
// the test ends or stop is called.
func start(t *testing.T, o devcsi.Options) *driver {
	t.Helper()
	if o.RootDir == "" {
		o.RootDir = t.TempDir()
	}
	if o.NodeID == "" {
		o.NodeID = "node-a"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	d, err := devcsi.New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return serve(t, d)
}

func serve(t *testing.T, d *devcsi.Driver) *driver {
	t.Helper()
	addr := "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	lis, err := grpcutil.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, lis) }()
	cc, err := grpcutil.DialCSI(addr)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cc.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return &driver{
		Driver: d, addr: addr, stop: stop,
		IdentityClient: csi.NewIdentityClient(cc), ControllerClient: csi.NewControllerClient(cc), NodeClient: csi.NewNodeClient(cc),
		health: healthpb.NewHealthClient(cc),
	}
}

// eventually polls cond until it holds, failing the test after 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if status.Code(err) != want {
		t.Fatalf("got %v, want code %v", err, want)
	}
}

func mountCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

var rwo = mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func createReq(name string, bytes int64) *csi.CreateVolumeRequest {
	req := &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{rwo}}
	if bytes > 0 {
		req.CapacityRange = &csi.CapacityRange{RequiredBytes: bytes}
	}
	return req
}

func mustCreate(t *testing.T, d *driver, req *csi.CreateVolumeRequest) *csi.Volume {
	t.Helper()
	resp, err := d.CreateVolume(t.Context(), req)
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", req.GetName(), err)
	}
	return resp.GetVolume()
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestNewValidatesOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    devcsi.Options
		want string // in the error
	}{
		{"no root", devcsi.Options{}, "--root-dir"},
		{"bad name", devcsi.Options{RootDir: "x", Name: "-bad"}, "--driver-name"},
		{"long name", devcsi.Options{RootDir: "x", Name: strings.Repeat("a", 64)}, "--driver-name"},
		{"bad fault", devcsi.Options{RootDir: "x", Faults: []string{"CreateVolume=explode"}}, "--fault"},
		{"unknown method", devcsi.Options{RootDir: "x", Faults: []string{"MakeVolume=unavailable"}}, "not a CSI method"},
		{"bad publish mode", devcsi.Options{RootDir: "x", PublishMode: "copy"}, "publish mode"},
		{"negative capacity", devcsi.Options{RootDir: "x", Capacity: -1}, "negative"},
		{"bad mode", devcsi.Options{RootDir: "x", Mode: "both"}, "--mode"},
		{"registration without the kubelet's path", devcsi.Options{RootDir: "x", PluginRegistrationDir: "/registration"}, "--kubelet-registration-path"},
		{"registration without its directory", devcsi.Options{RootDir: "x", KubeletRegistrationPath: "/var/lib/kubelet/plugins/d/csi.sock"}, "--plugin-registration-dir"},
		{"registration of a controller", devcsi.Options{RootDir: "x", Mode: devcsi.ModeController,
			PluginRegistrationDir: "/registration", KubeletRegistrationPath: "/var/lib/kubelet/plugins/d/csi.sock"}, "node plugin"},
		{"a relative kubelet path", devcsi.Options{RootDir: "x", PluginRegistrationDir: "/registration", KubeletRegistrationPath: "csi.sock"}, "absolute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := devcsi.New(tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

func TestIdentity(t *testing.T) {
	d := start(t, devcsi.Options{})
	// volplane-dev waits for this before starting the provisioner.
	if h, err := d.health.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	info, err := d.GetPluginInfo(t.Context(), &csi.GetPluginInfoRequest{})
	if err != nil || info.GetName() != devcsi.DefaultName || info.GetVendorVersion() == "" {
		t.Fatalf("GetPluginInfo: %v %v", info, err)
	}
	caps, err := d.GetPluginCapabilities(t.Context(), &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range caps.GetCapabilities() {
		got = append(got, c.GetService().GetType().String())
	}
	if strings.Join(got, ",") != "CONTROLLER_SERVICE,VOLUME_ACCESSIBILITY_CONSTRAINTS" {
		t.Fatalf("capabilities %v", got)
	}
	probe, err := d.Probe(t.Context(), &csi.ProbeRequest{})
	if err != nil || !probe.GetReady().GetValue() {
		t.Fatalf("Probe: %v %v", probe, err)
	}
	ni, err := d.NodeGetInfo(t.Context(), &csi.NodeGetInfoRequest{})
	if err != nil || ni.GetNodeId() != "node-a" || ni.GetAccessibleTopology().GetSegments()[devcsi.TopologyKey] != "node-a" {
		t.Fatalf("NodeGetInfo: %v %v", ni, err)
	}

	named := start(t, devcsi.Options{Name: "other.csi.example.com"})
	if info, err := named.GetPluginInfo(t.Context(), &csi.GetPluginInfoRequest{}); err != nil || info.GetName() != "other.csi.example.com" {
		t.Fatalf("GetPluginInfo with a name: %v %v", info, err)
	}
}
