package csisidecar

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/callers"
)

// Forwarded are the only methods the sidecar serves: the driver's
// Identity and Controller methods that volplane's provisioner calls
// (docs/compatibility.md, CSI). Node methods, the Controller's publish,
// snapshot, expansion and modification methods, and anything else are
// refused with Unimplemented: they stay with the driver's other sidecars.
var Forwarded = map[string]bool{
	csi.Identity_GetPluginInfo_FullMethodName:               true,
	csi.Identity_GetPluginCapabilities_FullMethodName:       true,
	csi.Identity_Probe_FullMethodName:                       true,
	csi.Controller_ControllerGetCapabilities_FullMethodName: true,
	csi.Controller_CreateVolume_FullMethodName:              true,
	csi.Controller_DeleteVolume_FullMethodName:              true,
	csi.Controller_GetCapacity_FullMethodName:               true,
	csi.Controller_ListVolumes_FullMethodName:               true,
}

// handshakeTimeout bounds a TLS handshake on the sidecar's port.
const handshakeTimeout = 10 * time.Second

// frame is one message's bytes, forwarded undecoded.
type frame struct{ b []byte }

// rawCodec passes frames through: the sidecar neither decodes nor
// re-encodes what the provisioner and the driver send each other, so no
// field (a new one of a later CSI spec included) is lost on the way.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	f.b = data.Materialize()
	return nil
}

// hop forwards the provisioner's calls to the driver.
type hop struct {
	driver  *grpc.ClientConn
	timeout time.Duration
	slots   chan struct{}
	log     *slog.Logger
	calls   *prometheus.CounterVec
}

// newHopServer is the gRPC server of the sidecar's port: tlsConfig's
// mutual TLS, bounded messages, a handshake timeout, and h as the handler
// of every method (it refuses all but Forwarded).
func newHopServer(h *hop, tlsConfig *tls.Config) *grpc.Server {
	return grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsConfig)),
		grpc.ForceServerCodecV2(rawCodec{}),
		grpc.UnknownServiceHandler(h.handle),
		grpc.MaxRecvMsgSize(MaxMessageSize),
		grpc.MaxSendMsgSize(MaxMessageSize),
		grpc.MaxConcurrentStreams(uint32(cap(h.slots))),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
}

// dialDriver connects to the driver's socket as csi-provisioner does: a
// path is a unix socket, anything else a gRPC target.
func dialDriver(address string) (*grpc.ClientConn, error) {
	target := address
	if strings.HasPrefix(address, "/") {
		target = "unix://" + address
	}
	cc, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize), grpc.MaxCallSendMsgSize(MaxMessageSize)),
	)
	if err != nil {
		return nil, fmt.Errorf("--csi-address %s: %w", address, err)
	}
	return cc, nil
}

// handle forwards one call: the caller must be the provisioner and the
// method Forwarded; the call gets the caller's deadline capped at the
// timeout, waits for one of the slots, and carries no metadata.
func (h *hop) handle(_ any, stream grpc.ServerStream) (err error) {
	method, _ := grpc.MethodFromServerStream(stream)
	ctx := stream.Context()
	start := time.Now()
	defer func() {
		code := status.Code(err)
		label := method
		if !Forwarded[method] { // a caller's method name never makes a series
			label = "other"
		}
		h.calls.WithLabelValues(label, code.String()).Inc()
		lvl := slog.LevelDebug
		if code != codes.OK {
			lvl = slog.LevelWarn
		}
		h.log.Log(ctx, lvl, "call", "method", method, "code", code.String(), "duration", time.Since(start), "error", err)
	}()
	if err := authorize(ctx); err != nil {
		return err
	}
	if !Forwarded[method] {
		return status.Errorf(codes.Unimplemented, "%s is not served by volplane-csi-sidecar: only the driver's Identity and Controller methods volplane's provisioner calls", method)
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	case <-ctx.Done():
		return status.Errorf(codes.DeadlineExceeded, "%s: waited for one of --worker-threads=%d calls in flight until the deadline", method, cap(h.slots))
	}
	var in, out frame
	if err := stream.RecvMsg(&in); err != nil {
		return err
	}
	if err := h.driver.Invoke(ctx, method, &in, &out, grpc.ForceCodecV2(rawCodec{})); err != nil {
		return err
	}
	return stream.SendMsg(&out)
}

// authorize checks, again, the identity the TLS handshake verified: a
// call reaches the driver only from volplane's provisioner.
func authorize(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return status.Error(codes.Unauthenticated, "no verified client certificate")
	}
	if cn := ti.State.VerifiedChains[0][0].Subject.CommonName; cn != callers.Provisioner {
		return status.Errorf(codes.PermissionDenied, "caller %q may not call the driver: only %s", cn, callers.Provisioner)
	}
	return nil
}
