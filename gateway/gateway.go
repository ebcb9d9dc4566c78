// Package gateway serves volplane's gRPC APIs as REST/JSON (grpc-gateway)
// for platform tooling, with /healthz, /readyz and the OpenAPI document at
// /openapi.json. The routes are in proto/volplane/http.yaml.
package gateway

import (
	"context"
	"crypto/x509"
	_ "embed"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/metrics"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

//go:embed openapi/volplane.swagger.json
var openAPI []byte

// Options configures the gateway. A service whose address is empty is not
// served (its routes answer 404); the binder is required.
type Options struct {
	// Listen is the HTTP listen address.
	Listen string
	// The backends' gRPC addresses.
	WatcherAddress, BinderAddress, ProvisionerAddress, ReclaimerAddress string
	// TLS is the gateway's mutual TLS with the backends (--tls-ca-file,
	// --tls-cert-file, --tls-key-file): it verifies their certificates and
	// presents its own. Required: name the files, or set InsecurePlaintext
	// (--insecure-plaintext, local experiments only).
	TLS grpcutil.TLSFiles
	// Auth says how callers are authenticated and authorized (auth.go);
	// its zero value authorizes through the API server that client-go's
	// loading rules find.
	Auth AuthOptions
	// HTTP holds the HTTP server's limits and serving certificate
	// (limits.go); zero values mean the defaults.
	HTTP HTTPOptions
	// Expensive limits each user's requests to the expensive routes
	// (expensive.go); zero values mean the defaults.
	Expensive ExpensiveOptions
	// DebugAddress serves /metrics and /livez (and /healthz, the same)
	// over plain HTTP, and /debug/pprof with EnablePprof
	// (--debug-address, --enable-pprof); empty disables.
	DebugAddress string
	EnablePprof  bool
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Standalone: volplane's binder does not run, kube-controller-manager's
	// binds claims (--standalone; standalone.go). The binder's routes are
	// answered by the gateway: FailedPrecondition naming the mode, and the
	// provisioning side for explain and timeline. BinderAddress must be
	// empty.
	Standalone bool
}

func (o *Options) validate() error {
	errs := grpcutil.ValidateListenAndTLS(o.Listen, o.TLS)
	switch {
	case o.Standalone && o.BinderAddress != "":
		errs = append(errs, errors.New("volplane's binder does not run in standalone mode: drop --binder-address"))
	case !o.Standalone && o.BinderAddress == "":
		errs = append(errs, errors.New("the binder's address is required (--binder-address)"))
	}
	if err := o.HTTP.defaults(); err != nil {
		errs = append(errs, err)
	}
	if err := separateCAs(o.Auth.ClientCAFile, o.TLS.CAFile); err != nil {
		errs = append(errs, err)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return errors.Join(errs...)
}

// validateRun is validate for Run, which serves HTTP itself: client
// certificates come only over its HTTPS.
func (o *Options) validateRun() error {
	err := o.validate()
	if o.Auth.ClientCAFile != "" && o.HTTP.TLSCertFile == "" {
		err = errors.Join(err, errors.New("--client-ca-file needs --tls-serving-cert-file and --tls-serving-key-file: client certificates come only over HTTPS, and the gateway serves plain HTTP without them"))
	}
	return err
}

// separateCAs refuses a users' CA (--client-ca-file) that holds a
// certificate of the services' CA (--tls-ca-file): every certificate the
// services' CA signs is a volplane service's credential, and would be a
// user at the gateway too (and a user's certificate one of a service).
// Files that do not read are reported where they are loaded.
func separateCAs(clientCAFile, servicesCAFile string) error {
	if clientCAFile == "" || servicesCAFile == "" {
		return nil
	}
	users, err1 := readCerts(clientCAFile)
	services, err2 := readCerts(servicesCAFile)
	if err1 != nil || err2 != nil {
		return nil
	}
	for _, u := range users {
		for _, s := range services {
			if u.Equal(s) {
				return fmt.Errorf("--client-ca-file %s holds the services' CA of --tls-ca-file (%s): a certificate of that CA would be both a volplane service's credential and a user; sign users' client certificates with a separate CA", clientCAFile, u.Subject)
			}
		}
	}
	return nil
}

func readCerts(path string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return out, nil
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}

type backend struct {
	name string
	addr string
	// service is the gRPC service whose routes the backend serves.
	service  string
	register func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error
	cc       *grpc.ClientConn
	// health is the backend's last health check (monitor).
	health atomic.Pointer[backendHealth]
}

// backendHealth is what the gateway last learned of a backend's gRPC
// health: its SERVING or NOT_SERVING, or why it could not be asked.
type backendHealth struct {
	Status string
}

// notChecked is a backend's health before its first check.
var notChecked = &backendHealth{Status: "not checked yet"}

func (b *backend) current() *backendHealth {
	if h := b.health.Load(); h != nil {
		return h
	}
	return notChecked
}

// NewHandler returns the gateway's HTTP handler and a function that closes
// its backend connections.
func NewHandler(ctx context.Context, o Options) (http.Handler, func(), error) {
	if o.Listen == "" {
		o.Listen = "unused"
	}
	if err := o.validate(); err != nil {
		return nil, nil, fmt.Errorf("gateway options: %w", err)
	}
	backends := []*backend{
		{name: "watcher", addr: o.WatcherAddress, service: watcherv1.WatcherService_ServiceDesc.ServiceName, register: watcherv1.RegisterWatcherServiceHandler},
		{name: "binder", addr: o.BinderAddress, service: binderv1.BinderService_ServiceDesc.ServiceName, register: binderv1.RegisterBinderServiceHandler},
		{name: "provisioner", addr: o.ProvisionerAddress, service: provisionerv1.ProvisionerService_ServiceDesc.ServiceName, register: provisionerv1.RegisterProvisionerServiceHandler},
		{name: "reclaimer", addr: o.ReclaimerAddress, service: reclaimerv1.ReclaimerService_ServiceDesc.ServiceName, register: reclaimerv1.RegisterReclaimerServiceHandler},
	}
	g, err := newGuard(o.Auth, o.Logger)
	if err != nil {
		return nil, nil, err
	}
	g.limits = newLimiter(o.Expensive)
	g.backends = map[string]*backend{}
	for _, b := range backends {
		if b.addr != "" {
			g.backends[b.service] = b
		}
	}
	mux := runtime.NewServeMux(muxOptions(g, &o.HTTP)...)
	mctx, stop := context.WithCancel(ctx)
	closeAll := func() {
		stop()
		for _, b := range backends {
			if b.cc != nil {
				b.cc.Close()
			}
		}
	}
	var live []*backend
	for _, b := range backends {
		if b.addr == "" {
			continue
		}
		cc, err := grpcutil.Dial(b.addr, o.TLS)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("%s at %s: %w", b.name, b.addr, err)
		}
		b.cc = cc
		if err := b.register(ctx, mux, cc); err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("register %s routes: %w", b.name, err)
		}
		live = append(live, b)
	}
	if o.Standalone {
		sb := &standaloneBinder{client: g.client}
		if b := g.backends[provisionerv1.ProvisionerService_ServiceDesc.ServiceName]; b != nil {
			sb.prov = provisionerv1.NewProvisionerServiceClient(b.cc)
		}
		if err := binderv1.RegisterBinderServiceHandlerServer(ctx, mux, sb); err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("register the standalone binder routes: %w", err)
		}
	}

	// The backends' health is checked in the background, never on a
	// request's behalf: /readyz is open to anyone and must answer at once.
	go monitor(mctx, live, backendCheckInterval)
	go g.api.Run(mctx, time.Second)

	root := http.NewServeMux()
	root.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
	})
	root.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		writeReadiness(w, g, live)
	})
	root.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openAPI)
	})
	return front(g, &o.HTTP, root, mux, o.Logger), closeAll, nil
}

// backendCheckInterval is how often the backends' health is checked;
// backendCheckTimeout bounds one check.
const (
	backendCheckInterval = 2 * time.Second
	backendCheckTimeout  = 3 * time.Second
)

// monitor checks every backend's gRPC health now and then every interval,
// all at once, until ctx ends.
func monitor(ctx context.Context, backends []*backend, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var wg sync.WaitGroup
		for _, b := range backends {
			wg.Go(func() { b.health.Store(checkBackend(ctx, b)) })
		}
		wg.Wait()
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// checkBackend asks b's gRPC health service: its status, or that it
// cannot be reached, or that it answers without a health service.
func checkBackend(ctx context.Context, b *backend) *backendHealth {
	ctx, cancel := context.WithTimeout(ctx, backendCheckTimeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(b.cc).Check(ctx, &healthpb.HealthCheckRequest{})
	switch status.Code(err) {
	case codes.OK:
		return &backendHealth{Status: resp.Status.String()}
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return &backendHealth{Status: "unreachable at " + b.addr + ": " + status.Convert(err).Message()}
	default:
		return &backendHealth{Status: "answers, but not its health: " + status.Convert(err).Message()}
	}
}

// writeReadiness answers /readyz. The gateway is ready while it can serve
// something: it listens (it answers this), and it can authenticate and
// authorize callers (the API server answers its TokenReviews and
// SubjectAccessReviews). A backend that is down does not make it unready:
// the other backends' routes still work and its own answer 503 naming it.
// The body says which backend is in what state.
func writeReadiness(w http.ResponseWriter, g *guard, backends []*backend) {
	status := map[string]string{}
	unavailable := []string{}
	for _, b := range backends {
		h := b.current()
		status[b.name] = h.Status
		if h.Status != healthpb.HealthCheckResponse_SERVING.String() {
			unavailable = append(unavailable, b.name)
		}
	}
	api := "ok"
	ready := true
	if err := g.apiCheck(); err != nil {
		api, ready = "the API server, which checks every caller, "+err.Error(), false
	}
	code := http.StatusOK
	if !ready {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, map[string]any{"ready": ready, "apiServer": api, "backends": status, "unavailable": unavailable})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Run serves the gateway until ctx ends, then shuts down gracefully.
func Run(ctx context.Context, o Options) error {
	if err := o.validateRun(); err != nil {
		return fmt.Errorf("gateway options: %w", err)
	}
	h, closeAll, err := NewHandler(ctx, o)
	if err != nil {
		return err
	}
	defer closeAll()
	lis, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s (--listen): %w", o.Listen, err)
	}
	srv := o.HTTP.server(h)
	serve := func() error { return srv.Serve(lis) }
	if o.HTTP.TLSCertFile != "" {
		sc, err := newServingCert(o.HTTP.TLSCertFile, o.HTTP.TLSKeyFile, o.Logger)
		if err != nil {
			lis.Close()
			return err
		}
		srv.TLSConfig = sc.tlsConfig(o.Auth.ClientCAFile != "")
		serve = func() error { return srv.ServeTLS(lis, "", "") }
	}
	errc := make(chan error, 2)
	go func() { errc <- serve() }()
	dctx, stopDebug := context.WithCancel(ctx)
	defer stopDebug()
	go func() {
		if err := metrics.Serve(dctx, o.DebugAddress, o.Logger, metrics.Handler(nil, metrics.Debug{Pprof: o.EnablePprof})); err != nil {
			errc <- err
		}
	}()
	o.Logger.Info("gateway serving", "listen", lis.Addr().String(), "https", o.HTTP.TLSCertFile != "",
		"client_certificates", o.Auth.ClientCAFile != "", "anonymous", o.Auth.AllowAnonymous)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	o.Logger.Info("gateway stopped")
	return err
}
