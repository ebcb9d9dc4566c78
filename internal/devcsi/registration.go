package devcsi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// SupportedCSIVersions are the CSI versions the registration offers the
// kubelet, as node-driver-registrar does (the kubelet takes any 1.x).
var SupportedCSIVersions = []string{"1.0.0"}

// Registrar registers a CSI node plugin with the kubelet, as the
// node-driver-registrar sidecar does: it serves the kubelet's plugin
// registration API (k8s.io/kubelet/pkg/apis/pluginregistration/v1) on a
// unix socket in the kubelet's plugin registration directory. The
// kubelet's plugin watcher sees the socket appear, calls GetInfo, then
// (as a CSI plugin) the driver's NodeGetInfo on Endpoint, records the
// driver in the node's CSINode and labels the Node with its topology, and
// calls NotifyRegistrationStatus with the outcome. When the socket goes
// away the kubelet deregisters the driver.
type Registrar struct {
	// Driver is the CSI driver name.
	Driver string
	// Endpoint is the path of the driver's CSI socket as the kubelet sees
	// it (a unix:// prefix is dropped: the kubelet wants a path).
	Endpoint string
	// Dir is the kubelet's plugin registration directory
	// (/var/lib/kubelet/plugins_registry on the node), as this process
	// sees it.
	Dir string
	// Logger; default slog.Default().
	Logger *slog.Logger

	mu         sync.Mutex
	registered bool
}

// SocketPath is where Run serves: <Dir>/<Driver>-reg.sock, the name
// node-driver-registrar gives it.
func (r *Registrar) SocketPath() string {
	return filepath.Join(r.Dir, r.Driver+"-reg.sock")
}

// Registered reports whether the kubelet said it registered the plugin.
func (r *Registrar) Registered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered
}

// Run serves the registration socket until ctx ends, or until the kubelet
// reports a failed registration: then it returns an error, and the
// process should exit so that its pod restarts and tries again, as
// node-driver-registrar does. A socket left by a crashed process is
// removed at start, and the socket is removed when Run returns.
func (r *Registrar) Run(ctx context.Context) error {
	log := r.Logger
	if log == nil {
		log = slog.Default()
	}
	switch {
	case r.Driver == "":
		return errors.New("registration: no driver name")
	case r.Dir == "":
		return errors.New("registration: no plugin registration directory")
	case !filepath.IsAbs(strings.TrimPrefix(r.Endpoint, "unix://")):
		return fmt.Errorf("registration: the kubelet's endpoint %q is not an absolute path", r.Endpoint)
	}
	path := r.SocketPath()
	if err := removeStaleSocket(path); err != nil {
		return fmt.Errorf("registration: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("registration: %w", err)
	}
	defer func() {
		if err := os.Remove(path); err == nil {
			log.Info("registration socket removed", "path", path)
		}
	}()
	failed := make(chan error, 1)
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &registrationServer{r: r, log: log, failed: failed})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	log.Info("waiting for the kubelet to register the plugin", "socket", path, "driver", r.Driver,
		"endpoint", strings.TrimPrefix(r.Endpoint, "unix://"))
	select {
	case <-ctx.Done():
		err = nil
	case err = <-failed:
	case err = <-served:
		err = fmt.Errorf("registration: serve %s: %w", path, err)
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		srv.Stop()
	}
	return err
}

// registrationServer answers the kubelet's plugin watcher.
type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	r      *Registrar
	log    *slog.Logger
	failed chan<- error
}

func (s *registrationServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	s.log.Info("the kubelet asks for the plugin's registration", "driver", s.r.Driver)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.r.Driver,
		Endpoint:          strings.TrimPrefix(s.r.Endpoint, "unix://"),
		SupportedVersions: SupportedCSIVersions,
	}, nil
}

func (s *registrationServer) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.r.mu.Lock()
	s.r.registered = st.GetPluginRegistered()
	s.r.mu.Unlock()
	if !st.GetPluginRegistered() {
		s.log.Error("the kubelet could not register the plugin; stopping so that the pod restarts", "driver", s.r.Driver, "error", st.GetError())
		select {
		case s.failed <- fmt.Errorf("the kubelet could not register CSI driver %s: %s", s.r.Driver, st.GetError()):
		default:
		}
		return &registerapi.RegistrationStatusResponse{}, nil
	}
	s.log.Info("the kubelet registered the plugin", "driver", s.r.Driver)
	return &registerapi.RegistrationStatusResponse{}, nil
}
