package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Sizes are burst sizes (claims); as a flag, a comma separated list.
type Sizes []int

func (s *Sizes) String() string {
	if s == nil {
		return ""
	}
	out := make([]string, len(*s))
	for i, v := range *s {
		out[i] = strconv.Itoa(v)
	}
	return strings.Join(out, ",")
}

// Type is the flag's type in --help.
func (s *Sizes) Type() string { return "sizes" }

// Set adds the comma separated sizes in v.
func (s *Sizes) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return fmt.Errorf("size %q is not a positive number of claims", f)
		}
		*s = append(*s, n)
	}
	return nil
}

// cell is one line of the comparison: a system's runs at one size and
// mode.
type cell struct {
	system  string
	dynamic bool
	claims  int
	runs    []*Result
}

// runCompare runs, for each of Sizes (or N) and for static binding then
// dynamic provisioning, Compare rounds of volplane and of
// kube-controller-manager (with external-provisioner, dynamic)
// interleaved A/B, each on a fresh control plane, and prints one table
// of both and their ratios.
func runCompare(ctx context.Context, o *Options) error {
	sizes := o.Sizes
	if len(sizes) == 0 {
		sizes = Sizes{o.N}
	}
	var cells [][2]*cell
	for _, n := range sizes {
		for _, dynamic := range []bool{false, true} {
			vo, ko := *o, *o
			vo.N, ko.N = n, n
			vo.Dynamic, ko.Dynamic = dynamic, dynamic
			vo.KCM, vo.ExternalProvisioner = "", ""
			if !dynamic {
				ko.ExternalProvisioner = ""
			}
			pair := [2]*cell{{system: vo.name(sysVolplane), dynamic: dynamic, claims: n}, {system: ko.name(sysKCM), dynamic: dynamic, claims: n}}
			for round := 1; round <= o.Compare; round++ {
				for i, run := range []struct {
					o   *Options
					sys system
				}{{&vo, sysVolplane}, {&ko, sysKCM}} {
					fmt.Fprintf(o.Log, "== %d claims, %s, round %d of %d: %s\n", n, mode(dynamic), round, o.Compare, run.o.name(run.sys))
					r, err := once(ctx, run.o, run.sys, load{n: n, clients: o.Clients})
					if err != nil {
						return fmt.Errorf("%d claims, %s, round %d, %s: %w", n, mode(dynamic), round, run.o.name(run.sys), err)
					}
					r.Print(o.Log)
					pair[i].runs = append(pair[i].runs, r)
				}
			}
			cells = append(cells, pair)
		}
	}
	printCompare(o.Out, o, cells)
	return nil
}

func mode(dynamic bool) string {
	if dynamic {
		return "dynamic"
	}
	return "static"
}

// means are a cell's figures averaged over its runs (peak RSS: the
// highest).
type means struct {
	perSecond       float64
	p50, p99, cpu   time.Duration
	rss             int64
	apiPerClaim     float64
	writesPerClaim  float64
	controlPlaneCPU time.Duration
}

func (c *cell) means() means {
	var m means
	n := float64(len(c.runs))
	for _, r := range c.runs {
		m.perSecond += r.PerSecond / n
		m.p50 += time.Duration(float64(r.Latency.P50) / n)
		m.p99 += time.Duration(float64(r.Latency.P99) / n)
		m.cpu += time.Duration(float64(r.CPUPerClaim()) / n)
		if _, rss, _ := r.bindersCost(); rss > m.rss {
			m.rss = rss
		}
		claims := float64(max(r.Claims, 1))
		if q := r.Requests; q != nil {
			m.apiPerClaim += q.API.total() / claims / n
			m.writesPerClaim += q.API.total("POST ", "PUT ", "PATCH ", "DELETE ") / claims / n
		}
		for _, p := range r.Procs {
			if p.Name == "kube-apiserver" || p.Name == "etcd" {
				m.controlPlaneCPU += time.Duration(float64(p.Measured) / claims / n)
			}
		}
	}
	return m
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

// printCompare writes the comparison as one Markdown table: per size and
// mode, volplane's means, kube-controller-manager's, and their ratio
// (for throughput the higher the better, for the costs the lower).
func printCompare(w io.Writer, o *Options, cells [][2]*cell) {
	fmt.Fprintf(w, "volplane against kube-controller-manager (+ external-provisioner, dynamic), %d round(s) of A/B each, fresh control plane per run; placement %s; means over rounds (peak RSS: highest)\n\n", o.Compare, o.placement())
	fmt.Fprintln(w, "| claims | mode | binder | claims/s | p50 | p99 | CPU per claim (what binds) | peak RSS (what binds) | API requests per claim (writes) | control plane CPU per claim |")
	fmt.Fprintln(w, "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
	ratio := func(a, b float64) string {
		if b == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f×", a/b)
	}
	for _, pair := range cells {
		v, k := pair[0].means(), pair[1].means()
		for i, m := range []means{v, k} {
			c := pair[i]
			fmt.Fprintf(w, "| %d | %s | %s | %.1f | %s | %s | %s | %s | %.2f (%.2f) | %s |\n", c.claims, mode(c.dynamic), c.system,
				m.perSecond, secs(m.p50), secs(m.p99), ms(m.cpu), mib(m.rss), m.apiPerClaim, m.writesPerClaim, ms(m.controlPlaneCPU))
		}
		fmt.Fprintf(w, "| %d | %s | volplane ÷ kcm | %s | %s | %s | %s | %s | %s | %s |\n", pair[0].claims, mode(pair[0].dynamic),
			ratio(v.perSecond, k.perSecond), ratio(float64(v.p50), float64(k.p50)), ratio(float64(v.p99), float64(k.p99)),
			ratio(float64(v.cpu), float64(k.cpu)), ratio(float64(v.rss), float64(k.rss)), ratio(v.apiPerClaim, k.apiPerClaim),
			ratio(float64(v.controlPlaneCPU), float64(k.controlPlaneCPU)))
	}
	printRequestsByVerb(w, cells)
}

// apiPerClaim is the cell's apiserver_request_total per claim by verb and
// resource, the mean over its runs.
func (c *cell) apiPerClaim() counts {
	out := counts{}
	n := float64(len(c.runs))
	for _, r := range c.runs {
		if r.Requests == nil {
			continue
		}
		claims := float64(max(r.Claims, 1))
		for k, v := range r.Requests.API {
			out[k] += v / claims / n
		}
	}
	return out
}

// printRequestsByVerb writes the API requests per claim of both systems
// by verb and resource, and volplane's excess, per size and mode: where
// the totals of the first table come from. Rows under 0.005 per claim on
// both sides (the apiserver's own leases and endpoints) are left out of
// the rows, not of the totals.
func printRequestsByVerb(w io.Writer, cells [][2]*cell) {
	fmt.Fprintln(w, "\nAPI requests per claim by verb and resource (apiserver_request_total over the measured phase, the bench's own claim create included; means over rounds)")
	fmt.Fprintln(w, "\n| claims | mode | verb and resource | volplane | kube-controller-manager (+ external-provisioner) | volplane − kcm |")
	fmt.Fprintln(w, "|---:|---|---|---:|---:|---:|")
	for _, pair := range cells {
		v, k := pair[0].apiPerClaim(), pair[1].apiPerClaim()
		union := counts{}
		for key := range v {
			union[key] = 0
		}
		for key := range k {
			union[key] = 0
		}
		row := func(name string, a, b float64) {
			fmt.Fprintf(w, "| %d | %s | %s | %.2f | %.2f | %+.2f |\n", pair[0].claims, mode(pair[0].dynamic), name, a, b, a-b)
		}
		for _, key := range union.keys() {
			if v[key] < 0.005 && k[key] < 0.005 {
				continue
			}
			row(key, v[key], k[key])
		}
		writes := []string{"POST ", "PUT ", "PATCH ", "DELETE "}
		row("reads (GET, LIST, WATCH)", v.total()-v.total(writes...), k.total()-k.total(writes...))
		row("writes", v.total(writes...), k.total(writes...))
		row("total", v.total(), k.total())
	}
}
