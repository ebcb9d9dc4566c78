package conformance

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"slices"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/grpcutil"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// serviceName is the full gRPC name of a service's API.
func serviceName(s Service) string {
	switch s {
	case Provisioner:
		return provisionerv1.ProvisionerService_ServiceDesc.ServiceName
	case Reclaimer:
		return reclaimerv1.ReclaimerService_ServiceDesc.ServiceName
	case Watcher:
		return watcherv1.WatcherService_ServiceDesc.ServiceName
	case Binder:
		return binderv1.BinderService_ServiceDesc.ServiceName
	}
	return ""
}

func commonChecks(s Service) []Check {
	name := serviceName(s)
	return []Check{
		{
			Name: "health",
			Doc: "grpc.health.v1 Check answers SERVING for \"\" and for " + name +
				" (within the check's timeout: a service may take a while to become ready), and NotFound for a service it does not serve.",
			run: func(t *T) { checkHealth(t, name) },
		},
		{
			Name: "tls-client-certificate-required",
			Doc:  "With TLS (not --insecure-plaintext): a client that verifies the server against the CA but presents no certificate is refused; the suite's own client, with a certificate, is served.",
			run:  checkClientCertRequired,
		},
	}
}

func checkHealth(t *T, service string) {
	hc := healthpb.NewHealthClient(t.s.conn)
	for _, name := range []string{"", service} {
		t.Eventually(fmt.Sprintf("health of %q", name), func() string {
			resp, err := hc.Check(t.ctx, &healthpb.HealthCheckRequest{Service: name})
			if err != nil {
				return t.retry("health Check", err)
			}
			if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				return "status " + resp.GetStatus().String()
			}
			return ""
		})
	}
	_, err := hc.Check(t.ctx, &healthpb.HealthCheckRequest{Service: "conformance.volplane.io.NoSuchService"})
	expectCode(t, "health Check of a service it does not serve", err, codes.NotFound)
}

func checkClientCertRequired(t *T) {
	files := t.s.cfg.TLS
	if files.InsecurePlaintext {
		t.Skipf("the implementation is dialed in plaintext (--insecure-plaintext)")
	}
	pem, err := os.ReadFile(files.CAFile)
	if err != nil {
		t.Fatalf("read the CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no PEM certificate", files.CAFile)
	}
	cc, err := grpc.NewClient(t.s.cfg.Address, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer cc.Close()
	_, err = healthpb.NewHealthClient(cc).Check(t.ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		t.Errorf("a client without a certificate was served: every volplane service requires a client certificate signed by the services' CA")
	}
	if _, err := healthpb.NewHealthClient(t.s.conn).Check(t.ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("the suite's client, with a certificate, was refused: %v", err)
	}
}

// callersMistake lists codes that must never answer a caller's mistake.
var callersMistake = []codes.Code{codes.Internal, codes.Unknown, codes.Unavailable, codes.DeadlineExceeded}

// expectCode records a failure unless err has one of the codes.
func expectCode(t *T, what string, err error, want ...codes.Code) bool {
	got := status.Code(err)
	if slices.Contains(want, got) {
		return true
	}
	names := make([]string, len(want))
	for i, c := range want {
		names[i] = c.String()
	}
	msg := fmt.Sprintf("%s: got %s, want %s", what, describe(err), strings.Join(names, " or "))
	if err != nil && slices.Contains(callersMistake, got) {
		msg += " (a caller's mistake must never be " + got.String() + ")"
	}
	t.Errorf("%s", msg)
	return false
}

// describe is an error's code and message, or "OK".
func describe(err error) string {
	if err == nil {
		return "OK"
	}
	st := status.Convert(err)
	return fmt.Sprintf("%s (%q)", st.Code(), st.Message())
}

// unimplemented says whether err is Unimplemented.
func unimplemented(err error) bool { return status.Code(err) == codes.Unimplemented }

// transient says whether an error means "try again".
func transient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted:
		return true
	}
	return false
}

// provisionerConn dials Config.ProvisionerAddress once.
func (s *Suite) provisionerConn() (*grpc.ClientConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prov == nil {
		cc, err := grpcutil.Dial(s.cfg.ProvisionerAddress, s.cfg.TLS)
		if err != nil {
			return nil, err
		}
		s.prov = cc
	}
	return s.prov, nil
}

// csiController dials Config.CSIEndpoint once; nil without one.
func (s *Suite) csiController() (csi.ControllerClient, error) {
	if s.cfg.CSIEndpoint == "" {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.csi == nil {
		cc, err := grpcutil.DialCSI(s.cfg.CSIEndpoint)
		if err != nil {
			return nil, err
		}
		s.csi = cc
	}
	return csi.NewControllerClient(s.csi), nil
}

// retry is the reason to poll again after an RPC failed; Unimplemented
// ends the check at once (the contract requires the RPC).
func (t *T) retry(rpc string, err error) string {
	if unimplemented(err) {
		t.Fatalf("%s: %s: the contract requires it", rpc, describe(err))
	}
	return rpc + ": " + describe(err)
}
