package bench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/volplane/volplane/test/harness/devenv"
)

// DefaultWorkers is the binder's --workers and the ceiling's worker count
// when Options.Workers is 0. The bench passes it to the binder instead of
// leaving the binder's own default (services/binder's DefaultWorkers, also
// 128 today) in force: the two sides then run with the same parallelism
// by construction, not because two constants happen to agree, and a
// change of the binder's default cannot silently change what the
// published numbers (docs/benchmarks.md) measured.
const DefaultWorkers = 128

// Options configures a benchmark invocation. The zero value of every field
// but BinDir is a sensible default: one burst of 1,000 pairs bound by
// volplane.
type Options struct {
	// N is the number of volume/claim pairs (claims, with Dynamic) of a
	// burst: every claim is created at once by Clients goroutines.
	N int
	// BinDir holds the service binaries and volplane-etcd (make build).
	BinDir string
	// KubeAPIServer is the kube-apiserver binary; empty finds the cached one.
	KubeAPIServer string
	// Binders is how many binder replicas bind (they share the claims by
	// etcd membership, as in production); 0 means one. volplane only.
	Binders int
	// Workers is the binder's --workers, and the ceiling's worker count;
	// 0 means DefaultWorkers for both.
	Workers int
	// Clients is how many goroutines create objects in parallel (the
	// burst's claims, every run's volumes, the Existing population).
	Clients int
	// ProfileDir, when set, receives CPU profiles of what binds (the
	// binder, the watcher and, dynamic, the provisioner; or
	// kube-controller-manager and, dynamic, csi-provisioner) and of
	// kube-apiserver, taken while the claims are bound (binder.pprof,
	// kube-controller-manager.pprof, …), and heap profiles of what binds
	// at the end (binder.heap, …); with Rates, one directory per rate
	// (rate-<R>/), profiled while the claims arrive. A single burst then
	// prints each process's CPU per claim split by cause (causes.go).
	ProfileDir string
	// ProfileSeconds is how long a burst is profiled, from its first
	// create; 0 means N/300 s, 2 s at least. A window longer than the
	// burst covers all of it: a CPU profile records only CPU used, so an
	// idle tail adds few samples (the processes' background work).
	ProfileSeconds int
	// KeepLogs keeps each run's directory (every process's log) instead
	// of removing it, and prints where it is.
	KeepLogs bool
	// KCM, when set, is a kube-controller-manager binary: its
	// persistentvolume-binder controller (client QPS KCMQPS) binds instead
	// of volplane, for a comparison on the same machine and apiserver.
	KCM string
	// KCMQPS is kube-controller-manager's --kube-api-qps (and burst), and
	// csi-provisioner's.
	KCMQPS int
	// ExternalProvisioner, with KCM and Dynamic, is a csi-provisioner
	// binary (the CSI external-provisioner): it provisions through the
	// same dev CSI driver instead of volplane's provisioner, for a
	// comparison on the same machine, apiserver and driver.
	ExternalProvisioner string
	// Dynamic measures dynamic provisioning instead of static binding: no
	// volumes are made up front; the claims are of a class of volplane's
	// dev CSI driver.
	Dynamic bool
	// Delete, with Dynamic, measures a deletion burst instead: the N
	// claims are provisioned (class reclaimPolicy Delete) and, once all
	// are Bound, deleted at once by Clients goroutines; the run ends when
	// every PersistentVolume is gone and the dev CSI driver holds no
	// volume (delete.go). volplane runs its reclaimer for it.
	Delete bool
	// Ceiling binds with the bare client instead of volplane: exactly the
	// API writes (and, with Dynamic, the Events and the dev driver's
	// CreateVolume) of a bind, from Workers goroutines, handed each claim
	// as its create returns. See ceiling.go.
	Ceiling bool
	// VsCeiling, when positive, interleaves that many runs of the binder
	// (volplane, or KCM) with as many of the ceiling, A/B/A/B, each on a
	// fresh control plane, and prints both figures and their ratio.
	VsCeiling int
	// Rates, when set, replaces the burst with open-loop arrivals: for
	// each rate (claims per second), on a fresh control plane, claims are
	// created on a fixed schedule for Duration whether or not earlier ones
	// are Bound, and create-to-Bound percentiles are reported.
	Rates Rates
	// Duration is how long claims arrive at each rate.
	Duration time.Duration
	// Existing is how many PersistentVolumes exist before the services
	// start (most Bound to claims; a spread over classes, access modes
	// and sizes), to measure at cluster scale. See existing.go.
	Existing int
	// ServiceFlags are added to the command lines of volplane's binder
	// and provisioner (e.g. --timeline=false, to measure what the
	// timeline costs).
	ServiceFlags []string
	// BinderFlags are added to the binders' command lines only (e.g.
	// --claims-by-shard=false with Binders, to compare with the default).
	BinderFlags []string
	// Compare, when positive, runs that many rounds of volplane and of
	// kube-controller-manager (KCM; with ExternalProvisioner for dynamic
	// provisioning) interleaved A/B, static then dynamic, at each of
	// Sizes, and prints one table of both and their ratios.
	Compare int
	// Sizes are the burst sizes of Compare; empty means N.
	Sizes Sizes
	// Hop, when positive, measures the sidecar's hop: that many rounds of
	// dynamic provisioning by volplane with the dev CSI driver on the
	// provisioner's own unix socket (--csi-endpoint) and through a
	// volplane-csi-sidecar process over mutual TLS (--discover-sidecars),
	// interleaved A/B, and one table of both and their ratio. It implies
	// Dynamic. See hop.go.
	Hop int
	// Placement is where the processes run: PlacementShared (the
	// default: every process on every CPU, as on one machine) or
	// PlacementSplit (kube-apiserver and etcd on ControlPlaneCPUs, what
	// binds, the CSI driver and the bench itself on the other CPUs, as
	// in a cluster whose controllers run on other nodes than its control
	// plane). The ceiling runs under the same placement.
	Placement string
	// ControlPlaneCPUs, with PlacementSplit, are the control plane's
	// CPUs; nil means the first half of the CPUs the bench may use.
	ControlPlaneCPUs devenv.CPUSet
	// Out receives the report; Log the progress lines.
	Out, Log io.Writer

	// The placement validate resolved: nil sets mean any CPU.
	controlPlane, others devenv.CPUSet
}

// The placements.
const (
	PlacementShared = "shared"
	PlacementSplit  = "split"
)

// place resolves the placement into the two CPU sets; it needs at least
// two CPUs to split.
func (o *Options) place(available devenv.CPUSet) error {
	switch o.Placement {
	case "", PlacementShared:
		if o.ControlPlaneCPUs != nil {
			return errors.New("--control-plane-cpus goes with --placement split")
		}
		o.Placement = PlacementShared
		return nil
	case PlacementSplit:
	default:
		return fmt.Errorf("placement %q: want %s or %s", o.Placement, PlacementShared, PlacementSplit)
	}
	if len(available) < 2 {
		return fmt.Errorf("--placement split needs at least 2 CPUs; this process may use %s", available)
	}
	cp := o.ControlPlaneCPUs
	if cp == nil {
		cp = available[:len(available)/2]
	}
	for _, c := range cp {
		if !slices.Contains(available, c) {
			return fmt.Errorf("control plane CPU %d is not one this process may use (%s)", c, available)
		}
	}
	var rest devenv.CPUSet
	for _, c := range available {
		if !slices.Contains(cp, c) {
			rest = append(rest, c)
		}
	}
	if len(rest) == 0 {
		return fmt.Errorf("--control-plane-cpus %s leaves no CPU for the rest (%s available)", cp, available)
	}
	o.controlPlane, o.others = cp, rest
	return nil
}

// placement describes where the processes ran, for the report.
func (o *Options) placement() string {
	if o.Placement != PlacementSplit {
		return "shared: every process on any CPU"
	}
	return fmt.Sprintf("split: kube-apiserver and etcd on CPU %s; what binds, the CSI driver and the load generator on CPU %s", o.controlPlane, o.others)
}

// DefaultDuration is how long claims arrive at each rate by default.
const DefaultDuration = 30 * time.Second

// Rates are arrival rates in claims per second; as a flag, a comma
// separated list (the flag may repeat).
type Rates []float64

func (r *Rates) String() string {
	if r == nil {
		return ""
	}
	s := make([]string, len(*r))
	for i, v := range *r {
		s[i] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	return strings.Join(s, ",")
}

// Type is the flag's type in --help.
func (r *Rates) Type() string { return "rates" }

// Set adds the comma separated rates in s.
func (r *Rates) Set(s string) error {
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return fmt.Errorf("rate %q is not a positive number of claims per second", f)
		}
		*r = append(*r, v)
	}
	return nil
}

func (o *Options) validate() error {
	var errs []error
	if o.N <= 0 {
		errs = append(errs, fmt.Errorf("n must be positive, got %d", o.N))
	}
	if o.Clients <= 0 {
		o.Clients = 32
	}
	if o.Workers < 0 {
		errs = append(errs, fmt.Errorf("workers must not be negative, got %d", o.Workers))
	}
	if o.Binders < 0 {
		errs = append(errs, fmt.Errorf("binders must not be negative, got %d", o.Binders))
	}
	if o.Binders > 1 && (o.KCM != "" || o.Ceiling) {
		errs = append(errs, errors.New("--binders runs several volplane binders: it does not go with --kube-controller-manager or --ceiling"))
	}
	if o.Existing < 0 {
		errs = append(errs, fmt.Errorf("existing must not be negative, got %d", o.Existing))
	}
	if o.BinDir == "" {
		o.BinDir = "bin"
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	if available, err := devenv.AvailableCPUs(); err != nil {
		errs = append(errs, err)
	} else if err := o.place(available); err != nil {
		errs = append(errs, err)
	}
	if o.Dynamic && o.KCM != "" && o.ExternalProvisioner == "" {
		errs = append(errs, errors.New("kube-controller-manager provisions nothing itself: compare dynamic provisioning with --external-provisioner too"))
	}
	if o.ExternalProvisioner != "" && (!o.Dynamic || o.KCM == "") && o.Compare == 0 {
		errs = append(errs, errors.New("--external-provisioner goes with --dynamic and --kube-controller-manager"))
	}
	if o.Delete {
		if !o.Dynamic {
			errs = append(errs, errors.New("--delete deletes dynamically provisioned volumes: it goes with --dynamic"))
		}
		if o.Ceiling || o.VsCeiling > 0 {
			errs = append(errs, errors.New("--delete has no ceiling to compare with: it does not go with --ceiling or --vs-ceiling"))
		}
		if len(o.Rates) > 0 {
			errs = append(errs, errors.New("--delete measures a burst of deletions: it does not go with --rate"))
		}
	}
	if o.Ceiling && o.KCM != "" {
		errs = append(errs, errors.New("--ceiling binds with the bare client: it does not go with --kube-controller-manager (use --vs-ceiling to compare them)"))
	}
	if o.Ceiling && o.VsCeiling > 0 {
		errs = append(errs, errors.New("--ceiling runs the ceiling alone; --vs-ceiling interleaves it with the binder: choose one"))
	}
	if o.VsCeiling < 0 {
		errs = append(errs, fmt.Errorf("vs-ceiling must not be negative, got %d", o.VsCeiling))
	}
	for _, f := range slices.Concat(o.ServiceFlags, o.BinderFlags) {
		if !strings.HasPrefix(f, "--") {
			errs = append(errs, fmt.Errorf("service flag %q: want --name or --name=value", f))
		}
	}
	if o.ProfileSeconds < 0 {
		errs = append(errs, fmt.Errorf("profile-seconds must not be negative, got %d", o.ProfileSeconds))
	}
	if o.Compare < 0 {
		errs = append(errs, fmt.Errorf("compare must not be negative, got %d", o.Compare))
	}
	if o.Compare > 0 {
		if o.KCM == "" || o.ExternalProvisioner == "" {
			errs = append(errs, errors.New("--compare needs --kube-controller-manager and --external-provisioner (make bench-compare builds them)"))
		}
		if o.Ceiling || o.VsCeiling > 0 || len(o.Rates) > 0 || o.Binders > 1 {
			errs = append(errs, errors.New("--compare runs bursts of one volplane binder and of kube-controller-manager: it does not go with --ceiling, --vs-ceiling, --rate or --binders"))
		}
	} else if len(o.Sizes) > 0 {
		errs = append(errs, errors.New("--sizes goes with --compare (use -n for one burst)"))
	}
	errs = append(errs, o.validateHop()...)
	for _, n := range o.Sizes {
		if n <= 0 {
			errs = append(errs, fmt.Errorf("sizes must be positive, got %d", n))
		}
	}
	if len(o.Rates) > 0 {
		if o.VsCeiling > 0 {
			errs = append(errs, errors.New("--vs-ceiling compares bursts; it does not go with --rate"))
		}
		if o.Duration <= 0 {
			errs = append(errs, fmt.Errorf("--rate needs a positive --duration, got %s", o.Duration))
		}
		for _, r := range o.Rates {
			if r <= 0 {
				errs = append(errs, fmt.Errorf("rates must be positive, got %g", r))
			}
		}
	}
	return errors.Join(errs...)
}

// validateHop checks Hop against the other modes; it makes the run
// dynamic.
func (o *Options) validateHop() []error {
	if o.Hop < 0 {
		return []error{fmt.Errorf("hop must not be negative, got %d", o.Hop)}
	}
	if o.Hop == 0 {
		return nil
	}
	o.Dynamic = true
	if o.KCM != "" || o.ExternalProvisioner != "" || o.Ceiling || o.VsCeiling > 0 || o.Compare > 0 || len(o.Rates) > 0 || o.Delete {
		return []error{errors.New("--hop compares volplane with itself, the driver on its socket and through the sidecar: it does not go with --kube-controller-manager, --external-provisioner, --ceiling, --vs-ceiling, --compare, --rate or --delete")}
	}
	return nil
}

// system is what binds in a run.
type system int

const (
	sysVolplane system = iota
	sysKCM             // kube-controller-manager, with csi-provisioner when dynamic
	sysCeiling         // the bare client
	sysSidecar         // volplane, reaching the dev CSI driver through volplane-csi-sidecar
)

func (o *Options) system() system {
	switch {
	case o.Ceiling:
		return sysCeiling
	case o.KCM != "":
		return sysKCM
	default:
		return sysVolplane
	}
}

func (o *Options) name(s system) string {
	switch s {
	case sysCeiling:
		return "ceiling (bare client)"
	case sysSidecar:
		return "volplane via volplane-csi-sidecar (mTLS, loopback)"
	case sysKCM:
		if o.ExternalProvisioner != "" {
			return "kube-controller-manager + external-provisioner"
		}
		return "kube-controller-manager"
	default:
		if o.Binders > 1 {
			return fmt.Sprintf("volplane (%d binders)", o.Binders)
		}
		if o.Hop > 0 {
			return "volplane, driver on its unix socket"
		}
		return "volplane"
	}
}

func (o *Options) workers() int {
	if o.Workers > 0 {
		return o.Workers
	}
	return DefaultWorkers
}
