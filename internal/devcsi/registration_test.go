package devcsi_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/test/harness/devenv"
)

// nodePlugin runs devcsi.Run (the volplane-csi command) as a node plugin
// registering with a kubelet's plugin directory, until the test ends.
type nodePlugin struct {
	regSock string
	cancel  context.CancelFunc
	done    chan struct{}
	err     error // Run's, once done is closed
}

func runNodePlugin(t *testing.T, o devcsi.Options) *nodePlugin {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &nodePlugin{cancel: cancel, done: make(chan struct{}),
		regSock: filepath.Join(o.PluginRegistrationDir, devcsi.DefaultName+"-reg.sock")}
	go func() { p.err = devcsi.Run(ctx, o); close(p.done) }()
	t.Cleanup(func() {
		cancel()
		p.wait(t)
	})
	eventually(t, "the registration socket answers", func() bool {
		c, err := net.Dial("unix", p.regSock)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return p
}

// wait waits for Run to return and returns its error.
func (p *nodePlugin) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

// running reports whether Run has not returned.
func (p *nodePlugin) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kubeletClient talks to a registration socket as the kubelet's plugin
// watcher does.
func kubeletClient(t *testing.T, sock string) registerapi.RegistrationClient {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return registerapi.NewRegistrationClient(cc)
}

func healthz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The kubelet's plugin registration, as its plugin watcher does it: the
// socket appears in the registration directory (a stale one is replaced),
// GetInfo names a CSI plugin, its driver, the endpoint the kubelet must
// dial and the CSI versions; the kubelet calls NodeGetInfo there, then
// NotifyRegistrationStatus. /healthz follows the driver's Probe and the
// registration socket. When Run ends, its sockets are gone.
func TestRunRegistersWithTheKubelet(t *testing.T) {
	dir := t.TempDir()
	regDir, pluginDir := filepath.Join(dir, "registry"), filepath.Join(dir, "plugin")
	if err := os.MkdirAll(regDir, 0o755); err != nil {
		t.Fatal(err)
	}
	health, err := devenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	csiSock := filepath.Join(pluginDir, "csi.sock")
	o := devcsi.Options{
		Mode: devcsi.ModeNode, RootDir: filepath.Join(dir, "root"), NodeID: "node-a", MaxVolumesPerNode: 17,
		Endpoint:                "unix://" + csiSock,
		PluginRegistrationDir:   regDir,
		KubeletRegistrationPath: csiSock, // the kubelet and this test share one mount namespace
		HealthAddress:           health,
		Faults:                  []string{"Probe=unavailable:1"},
		Logger:                  slog.New(slog.DiscardHandler),
	}
	// A socket left by a crash.
	stale, err := net.Listen("unix", filepath.Join(regDir, devcsi.DefaultName+"-reg.sock"))
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	p := runNodePlugin(t, o)
	kubelet := kubeletClient(t, p.regSock)
	info, err := kubelet.GetInfo(t.Context(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	if info.GetType() != registerapi.CSIPlugin || info.GetName() != devcsi.DefaultName || info.GetEndpoint() != csiSock ||
		strings.Join(info.GetSupportedVersions(), ",") != "1.0.0" {
		t.Fatalf("GetInfo: %v", info)
	}
	// The kubelet's CSI plugin dials the endpoint as a path.
	cc, err := grpc.NewClient("unix://"+info.GetEndpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ni, err := csi.NewNodeClient(cc).NodeGetInfo(t.Context(), &csi.NodeGetInfoRequest{})
	if err != nil || ni.GetNodeId() != "node-a" || ni.GetMaxVolumesPerNode() != 17 ||
		ni.GetAccessibleTopology().GetSegments()[devcsi.TopologyKey] != "node-a" {
		t.Fatalf("NodeGetInfo: %v %v", ni, err)
	}
	if _, err := kubelet.NotifyRegistrationStatus(t.Context(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatalf("NotifyRegistrationStatus: %v", err)
	}

	if code, body := healthz(t, health); code != http.StatusServiceUnavailable || !strings.Contains(body, "Unavailable") {
		t.Errorf("/healthz while Probe fails: %d %q", code, body)
	}
	if code, body := healthz(t, health); code != http.StatusOK {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if !p.running() {
		t.Fatalf("Run returned after a successful registration: %v", p.err)
	}

	p.cancel()
	if err := p.wait(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, s := range []string{p.regSock, csiSock} {
		if _, err := os.Lstat(s); !os.IsNotExist(err) {
			t.Errorf("socket %s after Run: %v", s, err)
		}
	}
}

// A registration the kubelet reports failed ends Run with an error, as
// node-driver-registrar exits, so that the pod restarts and registers
// again; the registration socket is removed.
func TestRunEndsWhenTheKubeletRefuses(t *testing.T) {
	dir := t.TempDir()
	o := devcsi.Options{
		Mode: devcsi.ModeNode, RootDir: filepath.Join(dir, "root"), NodeID: "node-a",
		Endpoint: "unix://" + filepath.Join(dir, "csi.sock"), PluginRegistrationDir: dir, KubeletRegistrationPath: "/var/lib/kubelet/plugins/x/csi.sock",
		Logger: slog.New(slog.DiscardHandler),
	}
	p := runNodePlugin(t, o)
	kubelet := kubeletClient(t, p.regSock)
	if info, err := kubelet.GetInfo(t.Context(), &registerapi.InfoRequest{}); err != nil || info.GetEndpoint() != o.KubeletRegistrationPath {
		t.Fatalf("GetInfo: %v %v", info, err)
	}
	if _, err := kubelet.NotifyRegistrationStatus(t.Context(), &registerapi.RegistrationStatus{Error: "driver name taken"}); err != nil {
		t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
	if err := p.wait(t); err == nil || !strings.Contains(err.Error(), "driver name taken") {
		t.Fatalf("Run: %v, want the kubelet's error", err)
	}
	if _, err := os.Lstat(p.regSock); !os.IsNotExist(err) {
		t.Errorf("registration socket after Run: %v", err)
	}
}

// /healthz fails while the registration socket is missing: the kubelet
// can no longer see the plugin, and the pod must restart.
func TestHealthFailsWithoutTheRegistrationSocket(t *testing.T) {
	dir := t.TempDir()
	health, err := devenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	o := devcsi.Options{
		Mode: devcsi.ModeNode, RootDir: filepath.Join(dir, "root"), NodeID: "node-a",
		Endpoint: "unix://" + filepath.Join(dir, "csi.sock"), PluginRegistrationDir: dir, KubeletRegistrationPath: "/var/lib/kubelet/plugins/x/csi.sock",
		HealthAddress: health, Logger: slog.New(slog.DiscardHandler),
	}
	p := runNodePlugin(t, o)
	if code, body := healthz(t, health); code != http.StatusOK {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if err := os.Remove(p.regSock); err != nil {
		t.Fatal(err)
	}
	if code, body := healthz(t, health); code != http.StatusServiceUnavailable || !strings.Contains(body, "registration socket") {
		t.Fatalf("/healthz without the registration socket: %d %q", code, body)
	}
	if err := os.Remove(filepath.Join(dir, "csi.sock")); err != nil {
		t.Fatal(err)
	}
	c := &devcsi.Checker{Endpoint: o.Endpoint}
	if err := c.Check(t.Context()); err == nil {
		t.Fatal("a health check passed with the CSI socket removed")
	}
}
