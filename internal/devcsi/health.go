package devcsi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/volplane/volplane/pkg/grpcutil"
)

// probeTimeout bounds one health check's Probe call.
const probeTimeout = 3 * time.Second

// Checker answers the health check of a CSI driver as the livenessprobe
// sidecar does: a new connection to the driver's endpoint (as a kubelet
// or a provisioner would make one: a socket file removed from under a
// running driver fails it) and a Probe that must say ready.
type Checker struct {
	// Endpoint is the driver's CSI endpoint (unix:///path or host:port).
	Endpoint string
	// RegistrationSocket, when set, must exist as a socket: without it
	// the kubelet does not know the plugin.
	RegistrationSocket string
	// Logger logs failed checks; default slog.Default().
	Logger *slog.Logger
}

// Check returns nil when the driver is healthy, else why it is not.
func (c *Checker) Check(ctx context.Context) error {
	if c.RegistrationSocket != "" {
		fi, err := os.Lstat(c.RegistrationSocket)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("the registration socket %s is gone", c.RegistrationSocket)
		case err != nil:
			return fmt.Errorf("registration socket: %w", err)
		case fi.Mode().Type() != fs.ModeSocket:
			return fmt.Errorf("%s is not a socket", c.RegistrationSocket)
		}
	}
	cc, err := grpcutil.DialCSI(c.Endpoint)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	resp, err := csi.NewIdentityClient(cc).Probe(ctx, &csi.ProbeRequest{})
	if err != nil {
		return fmt.Errorf("probe %s: %w", c.Endpoint, err)
	}
	if r := resp.GetReady(); r != nil && !r.GetValue() {
		return fmt.Errorf("probe %s: the driver is not ready", c.Endpoint)
	}
	return nil
}

// ServeHTTP answers /healthz: 200 "ok", or 503 and the reason.
func (c *Checker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := c.Check(r.Context()); err != nil {
		log := c.Logger
		if log == nil {
			log = slog.Default()
		}
		log.Warn("health check failed", "error", err)
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// serveHealth serves the Checker's /healthz on lis until ctx ends.
func serveHealth(ctx context.Context, lis net.Listener, endpoint, regSocket string, log *slog.Logger) error {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", &Checker{Endpoint: endpoint, RegistrationSocket: regSocket, Logger: log})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.Info("health endpoint serving", "address", lis.Addr().String(), "path", "/healthz")
	select {
	case err := <-errc:
		return fmt.Errorf("health endpoint: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return nil
}
