package reclaimer

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/yaml"

	startup "github.com/volplane/volplane/pkg/replica"
	"github.com/volplane/volplane/pkg/version"
)

// Service is the reclaimer's name in etcd membership.
const Service = "reclaimer"

// RecycleMode is how a volume with policy Recycle is scrubbed.
type RecycleMode string

const (
	// RecyclePod runs a recycler pod that mounts the volume and deletes its
	// contents, as kube-controller-manager does (hostPath and NFS volumes).
	RecyclePod RecycleMode = "pod"
	// RecycleNodeLocal deletes the contents of hostPath volumes, and of
	// local volumes whose node affinity admits NodeName, from this process:
	// the reclaimer runs on that node (e.g. as a DaemonSet) with the
	// directories mounted at the same paths. Other volumes are left to
	// another reclaimer (SKIPPED).
	RecycleNodeLocal RecycleMode = "node-local"
)

// Defaults of the Options.
const (
	DefaultRecyclerNamespace        = "default"
	DefaultRecyclerMinimumTimeout   = 60 * time.Second
	DefaultRecyclerTimeoutIncrement = 30 * time.Second
	DefaultWorkers                  = 100
	DefaultRetryIntervalStart       = time.Second
	DefaultRetryIntervalMax         = 5 * time.Minute
	DefaultDriversRefreshPeriod     = time.Minute
	DefaultTakeoverPeriod           = 10 * time.Second
	DefaultRecordTTL                = 10 * time.Minute
)

// DefaultRecyclerImage is volplane's own image at this build's version
// (ghcr.io/volplane/volplane:0.1.0 for v0.1.0): the reclaimer binary in it
// scrubs (reclaimer scrub DIR), so an air-gapped cluster needs no image
// from Docker Hub.
var DefaultRecyclerImage = volplaneImage + ":" + strings.TrimPrefix(version.Get().Version, "v")

// volplaneImage is the repository of volplane's image (hack/images.txt).
const volplaneImage = "ghcr.io/volplane/volplane"

// Options configures a reclaimer replica.
type Options struct {
	// Options are the flags every replica shares (--kubeconfig, --listen,
	// --etcd-endpoints, the TLS files, ...).
	startup.Options

	// ProvisionerAddress is the provisioner service's gRPC address. Delete
	// of a CSI volume whose driver it serves goes through its DeleteVolume;
	// empty means it serves nothing, and such volumes are left to their own
	// deleters.
	ProvisionerAddress string
	// DriversRefreshPeriod is how often the provisioner's list of served
	// drivers (ListDrivers) is read again; default 1m.
	DriversRefreshPeriod time.Duration
	// RecycleMode is how Recycle scrubs a volume; default RecyclePod.
	RecycleMode RecycleMode
	// NodeName is the node this replica runs on; required in
	// RecycleNodeLocal mode.
	NodeName string
	// RecyclePathPrefixes are the directories under which RecycleNodeLocal
	// may scrub a volume (--recycle-path-prefixes, comma-separated): its
	// path, cleaned and with symbolic links resolved, must lie strictly
	// below one of them. Required in RecycleNodeLocal mode (without any it
	// would refuse every volume), refused in RecyclePod mode (unused).
	RecyclePathPrefixes []string
	// RecyclerPodTemplate is a file holding a Pod (YAML or JSON) to use as
	// the recycler pod; it must have a volume named "vol", whose source is
	// replaced by the volume's. Empty: a pod running RecyclerImage.
	RecyclerPodTemplate string
	// RecyclerImage is the image of the default recycler pod; default
	// DefaultRecyclerImage. An image whose repository is named volplane (a
	// mirror of volplane's) runs its reclaimer's scrub; any other runs
	// Kubernetes' shell command (an image with /bin/sh and find: busybox). Exclusive with RecyclerPodTemplate; like it,
	// refused in RecycleNodeLocal mode (unused).
	RecyclerImage string
	// RecyclerNamespace is where recycler pods run (a namespace name);
	// default "default".
	RecyclerNamespace string
	// RecyclerMinimumTimeout is the least activeDeadlineSeconds of a
	// recycler pod; default 60s (kube-controller-manager's
	// --pv-recycler-minimum-timeout-hostpath).
	RecyclerMinimumTimeout time.Duration
	// RecyclerTimeoutIncrement is added to a recycler pod's deadline per GiB
	// of the volume's capacity, when that exceeds the minimum; default 30s
	// (--pv-recycler-increment-timeout-hostpath).
	RecyclerTimeoutIncrement time.Duration
	// Workers is the number of reclaims carried out at once; default 100,
	// external-provisioner's --worker-threads: a Delete is a dozen
	// sequential round trips (API server, etcd, provisioner, driver), so
	// deleting many volumes at once is bound by how many are in flight.
	Workers int
	// RetryIntervalStart is the first delay before a failed step is retried;
	// it doubles per failure of the same volume; default 1s.
	RetryIntervalStart time.Duration
	// RetryIntervalMax caps the retry delay; default 5m.
	RetryIntervalMax time.Duration
	// TakeoverPeriod is how often the journal is scanned for reclaims whose
	// replica stopped; default 10s.
	TakeoverPeriod time.Duration
	// RecordTTL is how long a finished, retained or skipped reclaim stays
	// visible in the API; default 10m.
	RecordTTL time.Duration
	// Standalone runs the reclaimer without volplane's binder, beside
	// kube-controller-manager's (a managed cluster): it watches the PVs
	// itself and deletes the Released volumes with policy Delete of the
	// provisioner's drivers, as external-provisioner does
	// (standalone.go). It needs ProvisionerAddress.
	Standalone bool

	template *corev1.Pod // parsed RecyclerPodTemplate
}

// etcdUse is what the reclaimer keeps in etcd besides membership.
const etcdUse = "the reclaim journal"

func (o *Options) validate() error {
	var errs []error
	errs = append(errs, o.Options.Validate(etcdUse)...)
	// RetryReclaim is forwarded to the replica holding the reclaim, at the
	// address that one registers.
	if err := o.ValidatePeerAddress(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, o.validateRecycling()...)
	errs = append(errs, o.validateTiming()...)
	if o.Standalone && o.ProvisionerAddress == "" {
		errs = append(errs, errors.New("--standalone deletes volumes through volplane's provisioner: set --provisioner-address"))
	}
	if o.RecyclerImage == "" && o.template == nil {
		o.RecyclerImage = DefaultRecyclerImage
	}
	if o.RecyclerNamespace == "" {
		o.RecyclerNamespace = DefaultRecyclerNamespace
	}
	return errors.Join(errs...)
}

// validateRecycling checks the recycling flags (mode, node, prefixes,
// image or pod template, namespace) and loads the pod template.
func (o *Options) validateRecycling() []error {
	var errs []error
	switch o.RecycleMode {
	case "":
		o.RecycleMode = RecyclePod
	case RecyclePod, RecycleNodeLocal:
	default:
		errs = append(errs, fmt.Errorf("recycle mode must be %q or %q, got %q (--recycle-mode)", RecyclePod, RecycleNodeLocal, o.RecycleMode))
	}
	if o.RecycleMode == RecycleNodeLocal && o.NodeName == "" {
		errs = append(errs, errors.New("node-local recycling needs the name of this node (--node-name)"))
	}
	switch {
	case o.RecycleMode == RecycleNodeLocal && len(o.RecyclePathPrefixes) == 0:
		// Every Recycle would fail (errNoRecyclePrefixes), retried forever.
		errs = append(errs, errors.New("--recycle-mode=node-local needs the directories under which it may scrub volumes (--recycle-path-prefixes): without any it refuses every volume"))
	case o.RecycleMode != RecycleNodeLocal && len(o.RecyclePathPrefixes) > 0:
		errs = append(errs, fmt.Errorf("--recycle-path-prefixes applies to --recycle-mode=node-local only; this reclaimer recycles with --recycle-mode=%s: drop the prefixes or change the mode", o.RecycleMode))
	}
	if err := checkPrefixes(o.RecyclePathPrefixes); err != nil {
		errs = append(errs, err)
	}
	if o.RecycleMode == RecycleNodeLocal {
		for _, f := range []struct{ flag, v string }{{"--recycler-image", o.RecyclerImage}, {"--recycler-pod-template", o.RecyclerPodTemplate}} {
			if f.v != "" {
				errs = append(errs, fmt.Errorf("%s applies to --recycle-mode=pod only; this reclaimer scrubs volumes itself (--recycle-mode=node-local): drop it or change the mode", f.flag))
			}
		}
	}
	if o.RecyclerNamespace != "" {
		if msgs := validation.IsDNS1123Label(o.RecyclerNamespace); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("recycler namespace %q is not a namespace name: %s (--recycler-namespace)", o.RecyclerNamespace, strings.Join(msgs, "; ")))
		}
	}
	if o.RecyclerPodTemplate != "" && o.RecyclerImage != "" {
		errs = append(errs, errors.New("a recycler pod template and a recycler image are exclusive: set the image in the template (--recycler-pod-template, --recycler-image)"))
	}
	if o.RecyclerPodTemplate != "" {
		t, err := loadPodTemplate(o.RecyclerPodTemplate)
		if err != nil {
			errs = append(errs, fmt.Errorf("recycler pod template %s: %w (--recycler-pod-template)", o.RecyclerPodTemplate, err))
		}
		o.template = t
	}
	return errs
}

// validateTiming checks the periods, timeouts and the number of workers,
// and fills in their defaults.
func (o *Options) validateTiming() []error {
	var errs []error
	for _, d := range []struct {
		v    *time.Duration
		def  time.Duration
		flag string
	}{
		{&o.DriversRefreshPeriod, DefaultDriversRefreshPeriod, "drivers-refresh-period"},
		{&o.RecyclerMinimumTimeout, DefaultRecyclerMinimumTimeout, "recycler-minimum-timeout"},
		{&o.RecyclerTimeoutIncrement, DefaultRecyclerTimeoutIncrement, "recycler-timeout-increment"},
		{&o.RetryIntervalStart, DefaultRetryIntervalStart, "retry-interval-start"},
		{&o.RetryIntervalMax, DefaultRetryIntervalMax, "retry-interval-max"},
		{&o.TakeoverPeriod, DefaultTakeoverPeriod, "takeover-period"},
		{&o.RecordTTL, DefaultRecordTTL, "record-ttl"},
	} {
		switch {
		case *d.v < 0:
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s (--%s)", d.flag, *d.v, d.flag))
		case *d.v == 0:
			*d.v = d.def
		}
	}
	if o.RetryIntervalMax < o.RetryIntervalStart {
		errs = append(errs, fmt.Errorf("retry-interval-max %s is below retry-interval-start %s (--retry-interval-max)", o.RetryIntervalMax, o.RetryIntervalStart))
	}
	if o.Workers < 0 {
		errs = append(errs, fmt.Errorf("workers must be at least 1, got %d (--workers)", o.Workers))
	}
	if o.Workers == 0 {
		o.Workers = DefaultWorkers
	}
	return errs
}

// loadPodTemplate reads a recycler pod template: one Pod, YAML or JSON,
// with at least one container and a volume named "vol".
func loadPodTemplate(path string) (*corev1.Pod, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var pod corev1.Pod
	if err := yaml.NewYAMLOrJSONDecoder(f, 4096).Decode(&pod); err != nil {
		return nil, fmt.Errorf("not a Pod in YAML or JSON: %w", err)
	}
	if pod.Kind != "" && pod.Kind != "Pod" {
		return nil, fmt.Errorf("kind is %q, want Pod", pod.Kind)
	}
	if len(pod.Spec.Containers) == 0 {
		return nil, errors.New("the pod has no containers")
	}
	if recyclerVolume(&pod) == nil {
		return nil, fmt.Errorf("the pod has no volume named %q (its source is replaced by the recycled volume's)", recyclerVolumeName)
	}
	return &pod, nil
}
