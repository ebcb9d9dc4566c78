package csisidecar

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volplane/volplane/pkg/sidecar"
)

// Class says what the sidecar does with one of csi-provisioner's flags.
type Class string

// The classes of csi-provisioner's flags (docs/compatibility.md).
const (
	// Kept: the sidecar honours the flag itself, with csi-provisioner's
	// meaning.
	Kept Class = "kept"
	// Carried: the flag shapes requests or PVs; the sidecar carries it to
	// volplane's provisioner in its registration (pkg/sidecar.Settings).
	Carried Class = "carried"
	// Accepted: accepted and not needed; logged once at start when given.
	Accepted Class = "accepted"
	// Refused: refused at start when set to a value whose behaviour
	// volplane lacks (Flag.Does says which).
	Refused Class = "refused"
)

// ProvisionerVersion is the csi-provisioner whose command line the
// sidecar accepts.
const ProvisionerVersion = "v6.3.0"

// Flag is one csi-provisioner flag and what the sidecar does with it.
type Flag struct {
	Name  string
	Class Class
	// Does says what volplane does; for Accepted flags, why it is not
	// needed (the start-up log line).
	Does string
}

// Flags are every flag of csi-provisioner v6.3.0's command line: its own,
// csi-lib-utils' standardflags and component-base's logging flags.
// docs/compatibility.md has one row per entry, and a test compares both
// with the pinned build's --help.
var Flags = []Flag{
	{"automaxprocs", Accepted, "Go 1.26 sets GOMAXPROCS from the container's CPU limit by itself"},
	{"capacity-for-immediate-binding", Accepted, "volplane's provisioner publishes capacity (its own --enable-capacity and --capacity-for-immediate-binding)"},
	{"capacity-ownerref-level", Accepted, "volplane's provisioner publishes capacity (its own --capacity-owner)"},
	{"capacity-poll-interval", Accepted, "volplane's provisioner publishes capacity (its own --capacity-poll-interval)"},
	{"capacity-threads", Accepted, "volplane's provisioner publishes capacity, one writer per driver"},
	{"cloning-protection-threads", Accepted, "volplane's provisioner keeps the cloning-protection finalizer"},
	{"controller-publish-readonly", Carried, "the provisioner sets spec.csi.readOnly on the PV of a claim whose only access mode is ReadOnlyMany"},
	{"csi-address", Kept, "the driver's socket the sidecar dials (unix path or unix:// address)"},
	{"default-fstype", Carried, "the provisioner's fsType when the StorageClass sets none"},
	{"enable-capacity", Accepted, "volplane's provisioner publishes CSIStorageCapacity objects (run it with --enable-capacity)"},
	{"enable-pprof", Kept, "serves /debug/pprof/ on --http-endpoint"},
	{"extra-create-metadata", Carried, "the provisioner adds the PVC/PV names to CreateVolume's parameters"},
	{"feature-gates", Carried, "refused as csi-provisioner refuses them (an unknown gate, a locked one changed); carried: the provisioner honours Topology and VolumeAttributesClass for this driver, and CrossNamespaceVolumeDataSource must match its own; ReleaseLeaderElectionOnExit releases the leader lock on exit; the others change nothing, as in csi-provisioner"},
	{"http-endpoint", Kept, "serves /healthz, /healthz/leader-election and /metrics"},
	{"immediate-topology", Carried, "false: the provisioner sends no topology for a claim with Immediate binding whose class has no allowedTopologies"},
	{"kube-api-burst", Kept, "the sidecar's API client (registration, leader lock, CA ConfigMap)"},
	{"kube-api-capacity-burst", Accepted, "volplane's provisioner publishes capacity with its own client"},
	{"kube-api-capacity-qps", Accepted, "volplane's provisioner publishes capacity with its own client"},
	{"kube-api-qps", Kept, "the sidecar's API client (registration, leader lock, CA ConfigMap)"},
	{"kubeconfig", Kept, "the sidecar's API client; $KUBECONFIG wins, as with csi-provisioner"},
	{"leader-election", Kept, "takes csi-provisioner's leader lock and registers only while holding it"},
	{"leader-election-labels", Kept, "labels of the leader lock's Lease"},
	{"leader-election-lease-duration", Kept, "the leader lock's lease duration"},
	{"leader-election-namespace", Kept, "the leader lock's namespace"},
	{"leader-election-renew-deadline", Kept, "the leader lock's renew deadline"},
	{"leader-election-retry-period", Kept, "the leader lock's retry period"},
	{"log-flush-frequency", Accepted, "the sidecar's log lines are written at once"},
	{"log-json-info-buffer-size", Accepted, "the sidecar writes one stream, unbuffered"},
	{"log-json-split-stream", Accepted, "the sidecar writes one stream, to stderr"},
	{"log-text-info-buffer-size", Accepted, "the sidecar writes one stream, unbuffered"},
	{"log-text-split-stream", Accepted, "the sidecar writes one stream, to stderr"},
	{"logging-format", Kept, "text or json log lines"},
	{"master", Kept, "the sidecar's API server address"},
	{"metrics-address", Kept, "(deprecated) serves /metrics, as --http-endpoint; only one of the two"},
	{"metrics-path", Kept, "the path of the metrics on --http-endpoint"},
	{"node-deployment", Carried, "the sidecar registers for its node ($NODE_NAME, required) with the topology of the driver's NodeGetInfo; the provisioner sends it only the claims whose selected node is that node, the deletions of volumes accessible there, and the capacity queries of that node's segment"},
	{"node-deployment-base-delay", Accepted, "the provisioner places an Immediate claim on one node in one step, so no node waits to race the others for it"},
	{"node-deployment-immediate-binding", Carried, "false: the provisioner places no claim of Immediate binding on this node"},
	{"node-deployment-max-delay", Accepted, "the provisioner places an Immediate claim on one node in one step, so no node waits to race the others for it"},
	{"prevent-volume-mode-conversion", Carried, "the provisioner's check of a restore's volume mode; a value other than the provisioner's own --prevent-volume-mode-conversion makes the driver not ready"},
	{"retry-interval-max", Accepted, "volplane's binder and reclaimer schedule the retries (their own --retry-interval-max)"},
	{"retry-interval-start", Accepted, "volplane's binder and reclaimer schedule the retries (their own --retry-interval-start)"},
	{"snapshot-orphan-sweep-interval", Accepted, "volplane's provisioner sweeps snapshot finalizers (its own --snapshot-orphan-sweep-interval)"},
	{"strict-topology", Carried, "the provisioner asks only for the selected node's topology"},
	{"timeout", Carried, "the deadline of each call through the sidecar, and carried to the provisioner for its CSI calls"},
	{"v", Kept, "the log level: 0 to 3 info, 4 and more debug"},
	{"version", Kept, "prints the version and exits"},
	{"vmodule", Accepted, "the sidecar has one log level (--v)"},
	{"volume-name-prefix", Carried, "the provisioner names the PVs <prefix>-<claim UID>"},
	{"volume-name-uuid-length", Carried, "the provisioner truncates the UID in PV names; -1 (the whole UID) or 1 to 32"},
	{"worker-threads", Kept, "caps the calls in flight through the sidecar"},
}

// FlagByName is Flags by name.
func FlagByName(name string) (Flag, bool) {
	for _, f := range Flags {
		if f.Name == name {
			return f, true
		}
	}
	return Flag{}, false
}

// ProvisionerFlags are the values of csi-provisioner's flags that the
// sidecar reads; the others are parsed into placeholders and only
// reported.
type ProvisionerFlags struct {
	Kubeconfig, Master      string
	CSIAddress              string
	LeaderElection          bool
	LeaderElectionNamespace string
	LeaseDuration           time.Duration
	RenewDeadline           time.Duration
	RetryPeriod             time.Duration
	LeaderElectionLabels    map[string]string
	KubeAPIQPS              float64
	KubeAPIBurst            int
	HTTPEndpoint            string
	MetricsAddress          string
	MetricsPath             string
	EnablePprof             bool
	Timeout                 time.Duration
	WorkerThreads           uint
	Verbosity               uint32
	LoggingFormat           string
	// UUIDLength is --volume-name-uuid-length (-1: the whole UID).
	UUIDLength        int
	ImmediateTopology bool
	// PreventVolumeModeConversion is --prevent-volume-mode-conversion.
	PreventVolumeModeConversion bool
	NodeDeployment              bool
	// NodeImmediateBinding is --node-deployment-immediate-binding.
	NodeImmediateBinding bool
	PublishReadOnly      bool
}

// addProvisionerFlags registers csi-provisioner v6.3.0's flags, with its
// names, types and defaults, on fs: the values the sidecar reads into p
// and s, the others into placeholders.
func addProvisionerFlags(fs *pflag.FlagSet, p *ProvisionerFlags, s *sidecar.Settings) {
	// csi-lib-utils standardflags (--version is the command's own:
	// cmdutil's General group).
	fs.StringVar(&p.Kubeconfig, "kubeconfig", "", "Absolute path to the kubeconfig file. Required only when running out of cluster.")
	fs.StringVar(&p.CSIAddress, "csi-address", "/run/csi/socket", "Address of the CSI driver socket.")
	fs.BoolVar(&p.LeaderElection, "leader-election", false, "Enable leader election.")
	fs.StringVar(&p.LeaderElectionNamespace, "leader-election-namespace", "", "Namespace where the leader election resource lives. Defaults to the pod namespace if not set.")
	fs.DurationVar(&p.LeaseDuration, "leader-election-lease-duration", 15*time.Second, "Duration that non-leader candidates will wait to force acquire leadership.")
	fs.DurationVar(&p.RenewDeadline, "leader-election-renew-deadline", 10*time.Second, "Duration that the acting leader will retry refreshing leadership before giving up.")
	fs.DurationVar(&p.RetryPeriod, "leader-election-retry-period", 5*time.Second, "Duration the LeaderElector clients should wait between tries of actions.")
	p.LeaderElectionLabels = map[string]string{}
	fs.Var((*labelMap)(&p.LeaderElectionLabels), "leader-election-labels", "Labels of the leader lock's Lease, key:value,key:value.")
	fs.Float64Var(&p.KubeAPIQPS, "kube-api-qps", 5, "QPS to use while communicating with the kubernetes apiserver.")
	fs.IntVar(&p.KubeAPIBurst, "kube-api-burst", 10, "Burst to use while communicating with the kubernetes apiserver.")
	fs.StringVar(&p.HTTPEndpoint, "http-endpoint", "", "The TCP network address where the HTTP server for diagnostics, including metrics and leader election health check, will listen (example: `:8080`).")
	fs.StringVar(&p.MetricsAddress, "metrics-address", "", "(deprecated) The TCP network address where the prometheus metrics endpoint will listen (example: `:8080`).")
	fs.StringVar(&p.MetricsPath, "metrics-path", "/metrics", "The HTTP path where prometheus metrics will be exposed.")
	fs.Var(&optionalBool{}, "automaxprocs", "automatically set GOMAXPROCS to match Linux container CPU quota")
	fs.Lookup("automaxprocs").NoOptDefVal = "true"
	// csi-provisioner's own.
	fs.StringVar(&p.Master, "master", "", "Master URL to build a client config from.")
	fs.StringVar(&s.VolumeNamePrefix, "volume-name-prefix", "pvc", "Prefix to apply to the name of a created volume.")
	fs.IntVar(&p.UUIDLength, "volume-name-uuid-length", -1, "Truncates generated UUID of a created volume to this length.")
	fs.DurationVar(new(time.Duration), "retry-interval-start", time.Second, "Initial retry interval of failed provisioning or deletion.")
	fs.DurationVar(new(time.Duration), "retry-interval-max", 5*time.Minute, "Maximum retry interval of failed provisioning or deletion.")
	fs.UintVar(&p.WorkerThreads, "worker-threads", 100, "Number of simultaneous CSI calls.")
	fs.UintVar(new(uint), "cloning-protection-threads", 1, "Number of simultaneously running threads, handling cloning finalizer removal")
	fs.DurationVar(new(time.Duration), "snapshot-orphan-sweep-interval", 5*time.Minute, "How often to check for orphaned snapshot source-protection finalizers.")
	fs.UintVar(new(uint), "capacity-threads", 1, "Number of simultaneously running threads, handling CSIStorageCapacity objects")
	fs.DurationVar(&p.Timeout, "timeout", 10*time.Second, "Timeout for waiting for volume operation (creation, deletion, capacity queries)")
	fs.BoolVar(&s.StrictTopology, "strict-topology", false, "Late binding: pass only selected node topology to CreateVolume Request.")
	fs.BoolVar(&p.ImmediateTopology, "immediate-topology", true, "Immediate binding: pass aggregated cluster topologies for all nodes where the CSI driver is available.")
	fs.BoolVar(&s.ExtraCreateMetadata, "extra-create-metadata", false, "If set, add pv/pvc metadata to plugin create requests as parameters.")
	fs.BoolVar(&p.EnablePprof, "enable-pprof", false, "Enable pprof profiling on the TCP network address specified by --http-endpoint.")
	fs.StringVar(&s.DefaultFSType, "default-fstype", "", "The default filesystem type of the volume to provision when fstype is unspecified in the StorageClass.")
	fs.Float32Var(new(float32), "kube-api-capacity-qps", 1, "QPS to use for storage capacity updates.")
	fs.IntVar(new(int), "kube-api-capacity-burst", 5, "Burst to use for storage capacity updates.")
	fs.BoolVar(new(bool), "enable-capacity", false, "This enables producing CSIStorageCapacity objects.")
	fs.BoolVar(new(bool), "capacity-for-immediate-binding", false, "Enables producing capacity information for storage classes with immediate binding.")
	fs.DurationVar(new(time.Duration), "capacity-poll-interval", time.Minute, "How long the external-provisioner waits before checking for storage capacity changes.")
	fs.IntVar(new(int), "capacity-ownerref-level", 1, "The owner level of CSIStorageCapacity objects.")
	fs.BoolVar(&p.NodeDeployment, "node-deployment", false, "Enables deploying the external-provisioner together with a CSI driver on nodes.")
	fs.BoolVar(&p.NodeImmediateBinding, "node-deployment-immediate-binding", true, "Determines whether immediate binding is supported when deployed on each node.")
	fs.DurationVar(new(time.Duration), "node-deployment-base-delay", 20*time.Second, "Initial delay before trying to own a PVC with immediate binding.")
	fs.DurationVar(new(time.Duration), "node-deployment-max-delay", 60*time.Second, "Maximum delay before trying to own a PVC with immediate binding.")
	fs.BoolVar(&p.PublishReadOnly, "controller-publish-readonly", false, "Mark PVs readonly at controller publish volume call if PVC accessmode has been set to ROX.")
	fs.BoolVar(&p.PreventVolumeModeConversion, "prevent-volume-mode-conversion", true, "Prevents an unauthorised user from modifying the volume mode when creating a PVC from an existing VolumeSnapshot.")
	s.FeatureGates = map[string]bool{}
	fs.Var((*gateMap)(&s.FeatureGates), "feature-gates", "A set of key=value pairs that describe feature gates for alpha/experimental features.")
	addLoggingFlags(fs, p)
}

// addLoggingFlags registers component-base's logging flags, as
// csi-provisioner (with JSON registered) has them.
func addLoggingFlags(fs *pflag.FlagSet, p *ProvisionerFlags) {
	fs.StringVar(&p.LoggingFormat, "logging-format", "text", "Sets the log format. Permitted formats: \"json\", \"text\".")
	fs.DurationVar(new(time.Duration), "log-flush-frequency", 5*time.Second, "Maximum number of seconds between log flushes")
	fs.Uint32VarP(&p.Verbosity, "v", "v", 0, "number for the log level verbosity")
	fs.String("vmodule", "", "comma-separated list of pattern=N settings for file-filtered logging")
	fs.Bool("log-text-split-stream", false, "In text format, write error messages to stderr and info messages to stdout.")
	fs.Var(&quantity{}, "log-text-info-buffer-size", "In text format with split output streams, the info messages can be buffered.")
	fs.Bool("log-json-split-stream", false, "In JSON format, write error messages to stderr and info messages to stdout.")
	fs.Var(&quantity{}, "log-json-info-buffer-size", "In JSON format with split output streams, the info messages can be buffered.")
}

// labelMap is --leader-election-labels: key:value,key:value.
type labelMap map[string]string

// String prints the map as csi-lib-utils does (its default is "map[]").
func (m *labelMap) String() string { return fmt.Sprintf("%v", map[string]string(*m)) }
func (m *labelMap) Type() string   { return "labels" }
func (m *labelMap) Set(v string) error {
	for item := range strings.SplitSeq(v, ",") {
		kv := strings.Split(item, ":")
		if len(kv) != 2 {
			return fmt.Errorf("malformed item in list of labels: %s", item)
		}
		(*m)[kv[0]] = kv[1]
	}
	return nil
}

// gateMap is --feature-gates: Name=bool,Name=bool.
type gateMap map[string]bool

func (m *gateMap) String() string {
	items := make([]string, 0, len(*m))
	for k, v := range *m {
		items = append(items, k+"="+strconv.FormatBool(v))
	}
	sort.Strings(items)
	return strings.Join(items, ",")
}
func (m *gateMap) Type() string { return "mapStringBool" }
func (m *gateMap) Set(v string) error {
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, val, ok := strings.Cut(item, "=")
		if !ok {
			return fmt.Errorf("malformed pair, expect string=bool: %s", item)
		}
		b, err := strconv.ParseBool(strings.TrimSpace(val))
		if err != nil {
			return fmt.Errorf("invalid value of %s: %s, err: %v", k, val, err)
		}
		(*m)[strings.TrimSpace(k)] = b
	}
	return nil
}

// optionalBool is a boolean flag given with or without a value.
type optionalBool struct{ v string }

func (b *optionalBool) String() string { return b.v }
func (b *optionalBool) Type() string   { return "bool" }
func (b *optionalBool) Set(s string) error {
	if _, err := strconv.ParseBool(s); err != nil {
		return err
	}
	b.v = s
	return nil
}

// quantity is a size such as 512, 1K or 2Mi.
type quantity struct{ v string }

func (q *quantity) String() string { return q.v }
func (q *quantity) Type() string   { return "quantity" }
func (q *quantity) Set(s string) error {
	if _, err := resource.ParseQuantity(s); err != nil {
		return err
	}
	q.v = s
	return nil
}
