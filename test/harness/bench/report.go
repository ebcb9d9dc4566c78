package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Result is what one run measured.
type Result struct {
	System string // what bound: "volplane", "kube-controller-manager", "ceiling (bare client)", ...
	// Placement is where the processes ran (Options.Placement).
	Placement string
	Dynamic   bool // claims were provisioned, not bound to existing volumes
	// Deletion: the measured phase deleted the claims of provisioned
	// volumes; Elapsed and Latency run from a claim's delete to its
	// PersistentVolume (and the driver's volumes) gone.
	Deletion bool
	Claims   int           // claims created in the measured phase
	Rate     float64       // claims per second of open-loop arrivals; 0 for a burst
	Duration time.Duration // how long claims arrived at Rate
	// Elapsed runs from the first claim's create to the last claim seen
	// Bound; PerSecond is the claims Bound over it.
	Elapsed      time.Duration
	PerSecond    float64
	CreateWindow time.Duration // how long creating the claims took
	Latency      Latency       // create-to-Bound, of the claims Bound
	Unbound      int           // claims not Bound within boundWait (open loop only)
	Late         Lateness      // open loop only
	Setup        Setup
	// ClusterVolumes and ClusterClaims are the PVs and PVCs in the
	// cluster at the end (the existing population included): what the
	// processes' memory holds.
	ClusterVolumes, ClusterClaims int
	Procs                         []ProcUsage
	Requests                      *Requests
}

func (r *Result) mode() string {
	if r.Deletion {
		return "deletion of dynamically provisioned volumes (reclaim policy Delete, dev CSI driver)"
	}
	if r.Dynamic {
		return "dynamic provisioning (dev CSI driver)"
	}
	return "static binding"
}

func (r *Result) unit() string {
	if r.Deletion {
		return "volumes deleted/s"
	}
	if r.Dynamic {
		return "volumes/s"
	}
	return "binds/s"
}

// latencyName is what Latency times.
func (r *Result) latencyName() string {
	if r.Deletion {
		return "delete-to-gone"
	}
	return "create-to-Bound"
}

func round(d time.Duration) string { return d.Round(time.Millisecond).String() }

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// Print writes the result: the figures the README quotes, the setup, each
// process's cost and the requests per bind.
func (r *Result) Print(w io.Writer) {
	fmt.Fprintf(w, "binder:                %s\n", r.System)
	fmt.Fprintf(w, "placement:             %s\n", r.Placement)
	if r.Rate > 0 {
		fmt.Fprintf(w, "mode:                  %s, open loop at %g claims/s for %s\n", r.mode(), r.Rate, r.Duration)
	} else {
		fmt.Fprintf(w, "mode:                  %s, burst\n", r.mode())
	}
	if r.Dynamic {
		fmt.Fprintf(w, "claims:                %d\n", r.Claims)
	} else {
		fmt.Fprintf(w, "pairs:                 %d\n", r.Claims)
	}
	s := r.Setup
	if e := s.Existing; e.Volumes > 0 {
		fmt.Fprintf(w, "existing:              %d volumes, %d of them Bound to claims; created in %s (%d requests, %.0f/s)\n",
			e.Volumes, e.Claims, round(e.Took), e.Requests, float64(e.Requests)/e.Took.Seconds())
	}
	fmt.Fprintf(w, "setup:                 control plane %s, %s %s", round(s.ControlPlane), r.System, round(s.Services))
	if !r.Dynamic {
		fmt.Fprintf(w, ", volumes %s", round(s.Volumes))
	}
	if s.Existing.Volumes > 0 {
		if s.Quiet {
			fmt.Fprintf(w, ", idle after %s", round(s.Settled))
		} else {
			fmt.Fprintf(w, ", still busy after %s", round(s.Settled))
		}
	}
	fmt.Fprintln(w)
	verb := "created"
	if r.Deletion {
		verb = "deleted"
	}
	fmt.Fprintf(w, "elapsed:               %s (claims %s within %s)\n", round(r.Elapsed), verb, round(r.CreateWindow))
	fmt.Fprintf(w, "%-22s %.1f\n", r.unit()+":", r.PerSecond)
	for _, q := range []struct {
		name string
		d    time.Duration
	}{{"p50", r.Latency.P50}, {"p90", r.Latency.P90}, {"p99", r.Latency.P99}, {"max", r.Latency.Max}} {
		fmt.Fprintf(w, "%-22s %s\n", r.latencyName()+" "+q.name+":", round(q.d))
	}
	if r.Rate > 0 {
		fmt.Fprintf(w, "behind schedule:       %d of %d creations sent more than %s late (max %s)\n", r.Late.Count, r.Claims, lateAfter, round(r.Late.Max))
		fmt.Fprintf(w, "not Bound:             %d (within %s of the last create)\n", r.Unbound, boundWait(r.Claims))
	}
	fmt.Fprintf(w, "cluster at the end:    %d volumes, %d claims\n", r.ClusterVolumes, r.ClusterClaims)
	r.printProcs(w)
	r.printRequests(w)
}

// printProcs writes each process's peak memory and CPU time, over its
// life and over the measured phase, and the latter per claim.
func (r *Result) printProcs(w io.Writer) {
	fmt.Fprintf(w, "processes:             %-24s %10s %10s %12s %10s\n", "", "peak RSS", "CPU", "CPU measured", "per claim")
	for _, p := range r.Procs {
		fmt.Fprintf(w, "                       %-24s %10s %10s %12s %10s\n", p.Name, mib(p.PeakRSS), round(p.CPU), round(p.Measured),
			(p.Measured / time.Duration(max(r.Claims, 1))).Round(time.Microsecond))
	}
	if cpu, rss, ok := r.bindersCost(); ok {
		fmt.Fprintf(w, "                       %-24s %10s %10s %12s %10s\n", "(what binds, together)", mib(rss), "", round(cpu),
			(cpu / time.Duration(max(r.Claims, 1))).Round(time.Microsecond))
	}
}

// bindersCost is the measured CPU and the sum of the peak RSS of the
// processes of what binds (volplane's services, or kube-controller-manager
// and csi-provisioner); ok is false when none ran (the ceiling).
func (r *Result) bindersCost() (cpu time.Duration, rss int64, ok bool) {
	for _, p := range r.Procs {
		if p.Binds {
			cpu, rss, ok = cpu+p.Measured, rss+p.PeakRSS, true
		}
	}
	return cpu, rss, ok
}

// CPUPerClaim is the measured CPU per claim of what binds together.
func (r *Result) CPUPerClaim() time.Duration {
	cpu, _, _ := r.bindersCost()
	return cpu / time.Duration(max(r.Claims, 1))
}

// printRequests writes what the apiserver and etcd served in the measured
// phase, per claim.
func (r *Result) printRequests(w io.Writer) {
	q := r.Requests
	if q == nil {
		return
	}
	n := float64(max(r.Claims, 1))
	fmt.Fprintf(w, "requests per claim:    (measured phase; the bench's own claim create and claim watch included)\n")
	section := func(title string, c counts, perClaim bool) {
		for i, k := range c.keys() {
			head := ""
			if i == 0 {
				head = title
			}
			v := c[k]
			if perClaim {
				fmt.Fprintf(w, "  %-20s %-44s %8.2f\n", head, k, v/n)
			} else {
				fmt.Fprintf(w, "  %-20s %-44s %8.0f\n", head, k, v)
			}
		}
	}
	section("kube-apiserver", q.API, true)
	writes := q.API.total("POST ", "PUT ", "PATCH ", "DELETE ")
	fmt.Fprintf(w, "  %-20s %-44s %8.2f (writes %.2f)\n", "", "total", q.API.total()/n, writes/n)
	section("apiserver→etcd", q.APIEtcd, true)
	fmt.Fprintf(w, "  %-20s %-44s %8.2f\n", "", "total", q.APIEtcd.total()/n)
	section("etcd (gRPC msgs)", q.Etcd, true)
	fmt.Fprintf(w, "  %-20s %-44s %8.2f\n", "", "total", q.Etcd.total()/n)
	section("watch events sent", q.WatchEvents, true)
	section("watches opened", q.Watches, false)
}

// shortLine is one run in a line, for the comparisons.
func (r *Result) shortLine() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%.1f %s (p50 %s, p99 %s)", r.PerSecond, r.unit(), round(r.Latency.P50), round(r.Latency.P99))
	return b.String()
}
