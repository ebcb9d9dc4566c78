package etcdmember

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Defaults of Options (and of volplane-etcd-member's flags).
const (
	DefaultQuotaBackendBytes       = 1 << 30 // 1 GiB
	DefaultAutoCompactionRetention = "5m"
	DefaultMaintenancePeriod       = 30 * time.Second
	DefaultDefragSlot              = time.Minute
	DefaultDefragMinFreeBytes      = 64 << 20 // 64 MiB
	DefaultDefragFreeRatio         = 0.5
	DefaultRecoverQuorumAfter      = 30 * time.Second
	DefaultStatusPort              = 2382
	DefaultClusterToken            = "volplane-etcd"
)

// TLSFiles are a CA, a certificate and its key, PEM files.
type TLSFiles struct{ CAFile, CertFile, KeyFile string }

func (t TLSFiles) set() bool { return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" }

func (t TLSFiles) complete() bool { return t.CAFile != "" && t.CertFile != "" && t.KeyFile != "" }

// Options configure one member. The flag of each field is named after
// it in cmd/volplane-etcd-member; where etcd has the same flag, it has
// etcd's name and meaning.
type Options struct {
	// Name is this member's name in InitialCluster (--name): the pod's
	// name in the StatefulSet.
	Name string
	// DataDir is the member's data directory (--data-dir), on the pod's
	// emptyDir. The file DataDir+".member-id" records the member ID it
	// started as.
	DataDir string
	// InitialCluster is every member as name=peerURL, comma separated
	// (--initial-cluster), the same on every member. Each member's client
	// and status endpoints are reached at its peer URL's host.
	InitialCluster string
	// InitialClusterToken (--initial-cluster-token) tells this cluster
	// from others; default DefaultClusterToken.
	InitialClusterToken string
	// ListenClientURLs serve etcd's clients (--listen-client-urls).
	ListenClientURLs []string
	// AdvertiseClientURL is this member's client URL as the others and
	// the clients reach it (--advertise-client-urls); its scheme and port
	// are every member's.
	AdvertiseClientURL string
	// ListenPeerURLs serve the other members (--listen-peer-urls); the
	// advertised peer URL is this member's entry in InitialCluster.
	ListenPeerURLs []string
	// ListenMetricsURLs serve /metrics (etcd's and the entrypoint's),
	// /livez, /readyz and /health in plaintext, for Prometheus and the
	// kubelet's probes (--listen-metrics-urls, http:// only).
	ListenMetricsURLs []string
	// StatusPort is where every member serves its state (empty, data,
	// started) and membership to the others, with the peer TLS
	// (--status-port); default DefaultStatusPort.
	StatusPort int
	// ClientTLS serves clients and requires client certificates of its
	// CA (--trusted-ca-file, --cert-file, --key-file); the entrypoint's
	// own etcd clients present its certificate.
	ClientTLS TLSFiles
	// PeerTLS secures the members' traffic, and the status endpoints
	// (--peer-trusted-ca-file, --peer-cert-file, --peer-key-file).
	PeerTLS TLSFiles
	// QuotaBackendBytes is etcd's --quota-backend-bytes; default
	// DefaultQuotaBackendBytes.
	QuotaBackendBytes int64
	// AutoCompactionMode and AutoCompactionRetention are etcd's
	// (--auto-compaction-mode, --auto-compaction-retention); default
	// periodic, DefaultAutoCompactionRetention.
	AutoCompactionMode, AutoCompactionRetention string
	// BootstrapDefragThresholdMegabytes is etcd's
	// --bootstrap-defrag-threshold-megabytes: defragment at start when
	// it frees that much.
	BootstrapDefragThresholdMegabytes uint
	// SnapshotCount, HeartbeatInterval and ElectionTimeout are etcd's
	// (--snapshot-count, --heartbeat-interval, --election-timeout); zero
	// keeps etcd's defaults.
	SnapshotCount                      uint64
	HeartbeatInterval, ElectionTimeout time.Duration
	// MaintenancePeriod is how often the member looks at its database and
	// etcd's alarms (--maintenance-period).
	MaintenancePeriod time.Duration
	// DefragSlot is the length of each member's turn to defragment
	// (--defrag-slot): turns follow the members' names in order, so two
	// members never defragment at once.
	DefragSlot time.Duration
	// DefragMinFreeBytes and DefragFreeRatio: a member defragments when
	// at least that many bytes and that fraction of its database are free
	// (--defrag-min-free-bytes, --defrag-free-ratio; zero: the defaults);
	// under the NOSPACE alarm any free space is enough.
	DefragMinFreeBytes int64
	DefragFreeRatio    float64
	// RecoverQuorumAfter: a member that has seen no leader for that long
	// while every other member says its data is gone starts again as a
	// cluster of one (--force-new-cluster), which the others then join
	// (--recover-quorum-after; 0 never does).
	RecoverQuorumAfter time.Duration
	// EtcdLogLevel is etcd's own --log-level (default warn); EtcdLogQuiet
	// drops etcd's log (tests).
	EtcdLogLevel string
	EtcdLogQuiet bool
	// UnsafeNoFsync is etcd's --unsafe-no-fsync: tests only.
	UnsafeNoFsync bool
	// Logger is the entrypoint's own log; default slog.Default().
	Logger *slog.Logger
}

// peer is one member of the initial cluster.
type peer struct {
	Name    string
	PeerURL *url.URL
}

// parsed is what validate derives from Options.
type parsed struct {
	peers     []peer // sorted by name; index is the defragmentation turn
	self      peer
	index     int
	client    *url.URL // advertised client URL
	byURL     map[string]string
	idPath    string
	listenCli []url.URL
	listenPr  []url.URL
	metrics   []url.URL
}

// validate fills in the defaults and checks the options, returning what
// is parsed from them and every problem found at once.
func (o *Options) validate() (*parsed, error) {
	var errs []error
	if o.Name == "" {
		errs = append(errs, errors.New("--name is required"))
	}
	if o.DataDir == "" {
		errs = append(errs, errors.New("--data-dir is required"))
	}
	o.setDefaults()
	if o.DefragFreeRatio < 0 || o.DefragFreeRatio > 1 {
		errs = append(errs, fmt.Errorf("--defrag-free-ratio %v is not between 0 and 1", o.DefragFreeRatio))
	}
	p := &parsed{byURL: map[string]string{}, idPath: filepath.Clean(o.DataDir) + ".member-id"}
	errs = append(errs, p.parsePeers(o.InitialCluster, o.Name)...)
	errs = append(errs, p.parseURLs(o)...)
	errs = append(errs, o.checkTLS(p)...)
	return p, errors.Join(errs...)
}

// setDefaults gives every option left at its zero value its default.
func (o *Options) setDefaults() {
	if o.InitialClusterToken == "" {
		o.InitialClusterToken = DefaultClusterToken
	}
	if o.StatusPort == 0 {
		o.StatusPort = DefaultStatusPort
	}
	if o.QuotaBackendBytes == 0 {
		o.QuotaBackendBytes = DefaultQuotaBackendBytes
	}
	if o.AutoCompactionMode == "" {
		o.AutoCompactionMode = "periodic"
	}
	if o.AutoCompactionRetention == "" {
		o.AutoCompactionRetention = DefaultAutoCompactionRetention
	}
	if o.MaintenancePeriod <= 0 {
		o.MaintenancePeriod = DefaultMaintenancePeriod
	}
	if o.DefragSlot <= 0 {
		o.DefragSlot = DefaultDefragSlot
	}
	if o.DefragMinFreeBytes == 0 {
		o.DefragMinFreeBytes = DefaultDefragMinFreeBytes
	}
	if o.DefragFreeRatio == 0 {
		o.DefragFreeRatio = DefaultDefragFreeRatio
	}
	if o.EtcdLogLevel == "" {
		o.EtcdLogLevel = "warn"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// parsePeers reads --initial-cluster (name=peerURL,...) into p.peers,
// sorted by name, and finds this member (self) among them.
func (p *parsed) parsePeers(initialCluster, self string) []error {
	var errs []error
	for _, entry := range strings.Split(initialCluster, ",") {
		name, raw, ok := strings.Cut(strings.TrimSpace(entry), "=")
		u, err := url.Parse(raw)
		if !ok || name == "" || err != nil || u.Host == "" {
			errs = append(errs, fmt.Errorf("--initial-cluster: %q is not name=peerURL", entry))
			continue
		}
		if _, dup := p.byURL[u.String()]; dup {
			errs = append(errs, fmt.Errorf("--initial-cluster: peer URL %s twice", u))
		}
		p.byURL[u.String()] = name
		p.peers = append(p.peers, peer{Name: name, PeerURL: u})
	}
	sort.Slice(p.peers, func(i, j int) bool { return p.peers[i].Name < p.peers[j].Name })
	p.index = -1
	for i, pr := range p.peers {
		if i > 0 && p.peers[i-1].Name == pr.Name {
			errs = append(errs, fmt.Errorf("--initial-cluster: member %s twice", pr.Name))
		}
		if pr.Name == self {
			p.self, p.index = pr, i
		}
	}
	if p.index < 0 && self != "" {
		errs = append(errs, fmt.Errorf("--initial-cluster does not name this member (%s)", self))
	}
	return errs
}

// parseURLs reads the advertised client URL and the listen URLs.
func (p *parsed) parseURLs(o *Options) []error {
	var errs []error
	c, err := url.Parse(o.AdvertiseClientURL)
	if err != nil || c.Host == "" || c.Port() == "" {
		errs = append(errs, fmt.Errorf("--advertise-client-urls %q: want one URL with a port", o.AdvertiseClientURL))
	}
	p.client = c
	var perr error
	if p.listenCli, perr = urls("--listen-client-urls", o.ListenClientURLs); perr != nil {
		errs = append(errs, perr)
	}
	if p.listenPr, perr = urls("--listen-peer-urls", o.ListenPeerURLs); perr != nil {
		errs = append(errs, perr)
	}
	if p.metrics, perr = urls("--listen-metrics-urls", o.ListenMetricsURLs); perr != nil {
		errs = append(errs, perr)
	}
	for _, m := range p.metrics {
		if m.Scheme != "http" {
			errs = append(errs, fmt.Errorf("--listen-metrics-urls %s: plaintext http:// only (the kubelet probes it without a client certificate)", m.String()))
		}
	}
	if len(p.listenCli) == 0 || len(p.listenPr) == 0 {
		errs = append(errs, errors.New("--listen-client-urls and --listen-peer-urls are required"))
	}
	return errs
}

// checkTLS checks that each TLS setting is whole and agrees with the
// URLs' schemes.
func (o *Options) checkTLS(p *parsed) []error {
	var errs []error
	for what, t := range map[string]TLSFiles{"client": o.ClientTLS, "peer": o.PeerTLS} {
		if t.set() && !t.complete() {
			errs = append(errs, fmt.Errorf("%s TLS needs a CA, a certificate and a key together", what))
		}
	}
	if o.ClientTLS.set() != (p.client != nil && p.client.Scheme == "https") {
		errs = append(errs, errors.New("client TLS (--cert-file) and an https:// --advertise-client-urls go together"))
	}
	if p.index >= 0 && o.PeerTLS.set() != (p.self.PeerURL.Scheme == "https") {
		errs = append(errs, errors.New("peer TLS (--peer-cert-file) and https:// peer URLs in --initial-cluster go together"))
	}
	return errs
}

func urls(flag string, raw []string) ([]url.URL, error) {
	var out []url.URL
	for _, r := range raw {
		for _, s := range strings.Split(r, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			u, err := url.Parse(s)
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("%s: %q is not a URL", flag, s)
			}
			out = append(out, *u)
		}
	}
	return out, nil
}

// clientURL is the client URL of member p: its peer URL's host, with the
// scheme and port of this member's advertised client URL.
func (p *parsed) clientURL(pr peer) string {
	return (&url.URL{Scheme: p.client.Scheme, Host: net.JoinHostPort(pr.PeerURL.Hostname(), p.client.Port())}).String()
}

// statusURL is where member pr serves its state.
func (p *parsed) statusURL(pr peer, port int) string {
	return (&url.URL{Scheme: pr.PeerURL.Scheme, Host: net.JoinHostPort(pr.PeerURL.Hostname(), strconv.Itoa(port)), Path: statusPath}).String()
}

// others are the initial cluster's members but this one.
func (p *parsed) others() []peer {
	out := make([]peer, 0, len(p.peers))
	for _, pr := range p.peers {
		if pr.Name != p.self.Name {
			out = append(out, pr)
		}
	}
	return out
}
