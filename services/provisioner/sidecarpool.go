package provisioner

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/sidecar"
)

// sidecarEndpoint is one verified registration of a discovered driver:
// the sidecar of one pod, dialed at its pod IP with the pinned
// certificate.
type sidecarEndpoint struct {
	lease    string // namespace/name of the registration Lease
	pod      string // namespace/name of the sidecar's pod
	addr     string // podIP:port
	hash     string // the pinned certificate's SHA-256
	settings sidecar.Settings
	conn     *grpc.ClientConn
	// node, topology and immediate are a node-deployed sidecar's node,
	// its segment and whether it takes Immediate claims (nodedeploy.go);
	// node is "" for a sidecar serving the whole cluster.
	node      string
	topology  map[string]string
	immediate bool
}

// sidecarPool is the gRPC connection of a discovered driver: each call
// goes to one of the driver's verified sidecars, in turn. Sidecars come
// and go at run time (set, drop); with none, every call fails with
// Unavailable, and the driver is not ready (probe).
type sidecarPool struct {
	name string

	mu   sync.Mutex
	eps  map[string]*sidecarEndpoint // by lease
	next int
	// lastSeen and lastPod say when and where a sidecar of the driver was
	// last seen (loaded from etcd after a restart: knownDrivers).
	lastSeen time.Time
	lastPod  string
}

var _ grpc.ClientConnInterface = (*sidecarPool)(nil)

func newSidecarPool(name string) *sidecarPool {
	return &sidecarPool{name: name, eps: map[string]*sidecarEndpoint{}}
}

// set adds or replaces the endpoint of a registration; it returns the
// endpoint it replaced (whose connection the caller closes), if any.
func (p *sidecarPool) set(ep *sidecarEndpoint, now time.Time) *sidecarEndpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.eps[ep.lease]
	p.eps[ep.lease] = ep
	p.lastSeen, p.lastPod = now, ep.pod
	return old
}

// drop removes a registration's endpoint and returns it (nil when it had
// none).
func (p *sidecarPool) drop(lease string, now time.Time) *sidecarEndpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.eps[lease]
	if old != nil {
		delete(p.eps, lease)
		p.lastSeen, p.lastPod = now, old.pod
	}
	return old
}

// get is the endpoint of a registration, nil when it has none.
func (p *sidecarPool) get(lease string) *sidecarEndpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.eps[lease]
}

// seen sets when and where the driver was last seen, unless a later
// sighting is known.
func (p *sidecarPool) seen(at time.Time, pod string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if at.After(p.lastSeen) {
		p.lastSeen, p.lastPod = at, pod
	}
}

// endpoints are the verified endpoints, by lease.
func (p *sidecarPool) endpoints() []*sidecarEndpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*sidecarEndpoint, 0, len(p.eps))
	for _, ep := range p.eps {
		out = append(out, ep)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].lease < out[j].lease })
	return out
}

// missing is why the driver has no sidecar to call.
func (p *sidecarPool) missing() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	msg := fmt.Sprintf("no volplane-csi-sidecar of driver %s is registered", p.name)
	if !p.lastSeen.IsZero() {
		msg += fmt.Sprintf("; last seen %s in pod %s", p.lastSeen.UTC().Format(time.RFC3339), p.lastPod)
	}
	return msg
}

// describe is the endpoint ListDrivers shows: each sidecar's pod and
// address.
func (p *sidecarPool) describe() string {
	var parts []string
	for _, ep := range p.endpoints() {
		if ep.node != "" {
			parts = append(parts, fmt.Sprintf("%s (%s, node %s)", ep.pod, ep.addr, ep.node))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", ep.pod, ep.addr))
	}
	if len(parts) == 0 {
		return sidecarEndpointPrefix + p.name
	}
	return sidecarEndpointPrefix + strings.Join(parts, ", ")
}

// sidecarEndpointPrefix starts the endpoint of a discovered driver.
const sidecarEndpointPrefix = "volplane-csi-sidecar: "

// pick is the endpoint of the next call, in turn.
func (p *sidecarPool) pick() (*sidecarEndpoint, error) {
	eps := p.endpoints()
	if len(eps) == 0 {
		return nil, status.Error(codes.Unavailable, p.missing())
	}
	p.mu.Lock()
	i := p.next % len(eps)
	p.next++
	p.mu.Unlock()
	return eps[i], nil
}

// Invoke sends a unary call to one of the driver's sidecars.
func (p *sidecarPool) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	ep, err := p.route(ctx, args)
	if err != nil {
		return err
	}
	return ep.conn.Invoke(ctx, method, args, reply, opts...)
}

// NewStream opens a stream to one of the driver's sidecars (CSI has no
// streaming call; here for the interface).
func (p *sidecarPool) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	ep, err := p.route(ctx, nil)
	if err != nil {
		return nil, err
	}
	return ep.conn.NewStream(ctx, desc, method, opts...)
}

// closeAll closes every endpoint's connection.
func (p *sidecarPool) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, ep := range p.eps {
		ep.conn.Close()
		delete(p.eps, k)
	}
}

// pinnedTLS is the client TLS of a sidecar connection: it presents the
// provisioner's own certificate (read from its --tls-* files at each
// handshake, so a rotated certificate is used) and accepts exactly the
// server certificate whose SHA-256 the registration pins, within its
// validity dates, over TLS 1.3. No CA is involved: the sidecar's
// certificate is self-signed, and the pin (from a registration whose pod
// and ServiceAccount were checked) is the whole of its identity.
func pinnedTLS(clientCert func() (*tls.Certificate, error), pin string, now func() time.Time) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain is not verified against a CA: VerifyConnection
		// checks the pin instead.
		InsecureSkipVerify: true, //nolint:gosec // pinned below
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return clientCert()
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the sidecar presented no certificate")
			}
			leaf := cs.PeerCertificates[0]
			if got := sidecar.CertSHA256(leaf.Raw); got != pin {
				return fmt.Errorf("the sidecar's certificate has SHA-256 %s, its registration pins %s", got, pin)
			}
			if t := now(); t.Before(leaf.NotBefore) || t.After(leaf.NotAfter) {
				return fmt.Errorf("the sidecar's pinned certificate is valid from %s to %s, not now", leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
			}
			return nil
		},
	}
}

// dialSidecar connects to a sidecar at addr with the pinned TLS and the
// interceptors every CSI connection has.
func dialSidecar(addr string, cfg *tls.Config, interceptors ...grpc.UnaryClientInterceptor) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithChainUnaryInterceptor(interceptors...))
}

// checkSidecar makes the first call to a dialed sidecar: the TLS handshake
// (and so the pin) and GetPluginInfo, which must name the registered
// driver.
func checkSidecar(ctx context.Context, cc grpc.ClientConnInterface, driver string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pi, err := csi.NewIdentityClient(cc).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(false))
	if err != nil {
		return fmt.Errorf("GetPluginInfo over TLS: %w", err)
	}
	if pi.GetName() != driver {
		return fmt.Errorf("the sidecar serves CSI driver %q, its registration names %q", pi.GetName(), driver)
	}
	return nil
}
