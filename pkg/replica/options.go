package replica

import (
	"fmt"
	"log/slog"
	"net"
	"strings"

	"k8s.io/client-go/rest"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/metrics"
	"github.com/volplane/volplane/pkg/timeline"
)

// Options are the settings every replica shares; each service's Options
// embeds them, registers their flags with AddFlags, checks them with
// Validate and starts from Config.
type Options struct {
	// Kubeconfig is the kubeconfig path (--kubeconfig); empty means
	// client-go's loading rules (kube.ClientOptions.Kubeconfig).
	Kubeconfig string
	// RESTConfig, when set, is used instead of Kubeconfig (tests).
	RESTConfig *rest.Config
	// KubeQPS limits API requests per second on the client side; 0 means
	// the service's default (DefaultKubeQPS unless it sets its own before
	// Validate), negative no limit (kube.RateLimits).
	KubeQPS float32
	// KubeBurst is the burst allowed above KubeQPS; 0 means twice KubeQPS.
	KubeBurst int
	// EtcdEndpoints are the etcd client URLs of the replica's coordination:
	// membership, and the service's reservations or journal.
	EtcdEndpoints []string
	// Etcd is the etcd client's TLS and authentication (--etcd-cacert,
	// --etcd-cert, --etcd-key, --etcd-username, --etcd-password-file).
	Etcd coord.Security
	// Listen is the gRPC listen address.
	Listen string
	// AdvertiseAddress is where peers reach this replica; default Listen.
	// Its host must be in the replica's certificate.
	AdvertiseAddress string
	// TLS is the replica's mutual TLS with the other volplane services,
	// for serving and for dialing them (--tls-ca-file, --tls-cert-file,
	// --tls-key-file). Required: name the files, or set InsecurePlaintext
	// (--insecure-plaintext, local experiments only).
	TLS grpcutil.TLSFiles
	// GRPCReflection serves the gRPC reflection service
	// (--grpc-reflection); off by default.
	GRPCReflection bool
	// MemberID names this replica in etcd; default hostname plus a random
	// suffix.
	MemberID string
	// DebugAddress serves /metrics, /readyz, /livez (and /healthz, the
	// same) and /debug/pprof over HTTP; empty disables.
	DebugAddress string
	// EnablePprof serves /debug/pprof/ on DebugAddress (--enable-pprof);
	// off by default.
	EnablePprof bool
	// Logger receives the replica's logs; default slog.Default().
	Logger *slog.Logger
	// Timeline bounds the replica's claim timelines and names the
	// OpenTelemetry collector their spans go to (--timeline-claims,
	// --timeline-spans-per-claim, --otlp-endpoint).
	Timeline timeline.Options
}

// DefaultKubeQPS is a replica's client-side API request limit unless its
// service sets another (kube.RateLimits: a fuse, not a throttle).
const DefaultKubeQPS = 500

// AddFlags registers the shared flags on cmd, in its Serving, Kubernetes
// client, etcd, TLS and Debug groups: listen is the default --listen,
// etcdUse what etcd holds for the service besides membership (for
// --etcd-endpoints' help).
func (o *Options) AddFlags(cmd *cmdutil.Command, listen, etcdUse string) {
	fs := cmd.Flags(cmdutil.GroupServing)
	fs.StringVar(&o.Listen, "listen", listen, "gRPC listen address (host:port or unix:///path)")
	fs.StringVar(&o.AdvertiseAddress, "advertise-address", "", "address peers reach this replica at; defaults to --listen")
	fs.StringVar(&o.MemberID, "member-id", "", "this replica's member id in etcd; defaults to hostname plus a random suffix")
	cmd.ReflectionFlag(&o.GRPCReflection)
	cmd.KubeFlags(&o.Kubeconfig, &o.KubeQPS, &o.KubeBurst)
	cmd.EtcdFlag(&o.EtcdEndpoints, "membership and "+etcdUse)
	cmd.EtcdSecurityFlags(&o.Etcd)
	cmd.TLSFlags(&o.TLS)
	cmd.DebugAddressFlag(&o.DebugAddress)
	cmd.Flags(cmdutil.GroupDebug).BoolVar(&o.EnablePprof, "enable-pprof", false, metrics.PprofFlagUsage)
	o.Timeline.AddFlags(cmd.Flags(cmdutil.GroupDebug))
}

// Validate checks the shared options, each error naming its flag, and
// fills the defaults of those a replica may leave unset: the client's
// rate limits (DefaultKubeQPS), the logger (slog's default), the
// advertised address (the listen address) and the member ID (hostname and
// a random suffix); etcdUse is as for AddFlags.
func (o *Options) Validate(etcdUse string) []error {
	errs := grpcutil.ValidateListenAndTLS(o.Listen, o.TLS)
	if err := kube.RateLimits(&o.KubeQPS, &o.KubeBurst, DefaultKubeQPS); err != nil {
		errs = append(errs, err)
	}
	if len(o.EtcdEndpoints) == 0 {
		errs = append(errs, fmt.Errorf("etcd endpoints are required for membership and %s (--etcd-endpoints)", etcdUse))
	}
	if err := o.Etcd.Validate(o.EtcdEndpoints); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, o.Timeline.Validate()...)
	if o.KubeBurst < 0 {
		errs = append(errs, fmt.Errorf("kubernetes client burst must not be negative, got %d (--kube-api-burst)", o.KubeBurst))
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
	return errs
}

// Config is what Start takes for a replica of service.
func (o *Options) Config(service string) Config {
	return Config{
		Service: service, RESTConfig: o.RESTConfig, Kube: kube.ClientOptions{Kubeconfig: o.Kubeconfig, QPS: o.KubeQPS, Burst: o.KubeBurst},
		Etcd: coord.Options{Endpoints: o.EtcdEndpoints, Security: o.Etcd}, MemberID: o.MemberID, AdvertiseAddress: o.AdvertiseAddress,
		Listen: o.Listen, DebugAddress: o.DebugAddress, Debug: metrics.Debug{Pprof: o.EnablePprof}, TLS: o.TLS, Reflection: o.GRPCReflection, Log: o.Logger,
		Timeline: o.Timeline,
	}
}

// ValidatePeerAddress checks, for a service whose replicas call each other
// (the binder and the reclaimer forward calls to the replica that owns the
// object), that the address this replica registers is one its peers can
// dial: host:port with a host and a port, not an unspecified address
// (":7702", "0.0.0.0:7702", which --advertise-address defaults to when
// --listen is one) nor port 0. A unix:// address serves replicas on the
// same machine only, and is taken as meant. Call it after Validate, which
// fills in the default.
func (o *Options) ValidatePeerAddress() error {
	addr := o.AdvertiseAddress
	if addr == "" || strings.HasPrefix(addr, "unix://") {
		return nil
	}
	from := "--advertise-address"
	if addr == o.Listen {
		from = "--advertise-address, which defaults to --listen,"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q is not host:port: set --advertise-address to where the other replicas reach this one", from, addr)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return fmt.Errorf("%s %q names no host the other replicas can dial: set --advertise-address to this replica's name or address (one its certificate carries), e.g. $(POD_NAME).<service>-peers.<namespace>.svc:%s", from, addr, port)
	}
	if port == "0" {
		return fmt.Errorf("%s %q has port 0, which the other replicas cannot dial: listen on a fixed port (--listen) or set --advertise-address", from, addr)
	}
	return nil
}
