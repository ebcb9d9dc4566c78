package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/volplane/volplane/test/harness/manifests"
)

// priorityClass is the PriorityClass every volplane pod runs at
// (deploy/kubernetes/priorityclass.yaml).
const priorityClass = "volplane-critical"

// maxUserPriority is the highest value a PriorityClass not named system-*
// may have (the API server refuses more).
const maxUserPriority = 1_000_000_000

// podSpecPaths is where each workload kind holds its pods' spec.
var podSpecPaths = map[string][]string{
	"Deployment":  {"spec", "template", "spec"},
	"StatefulSet": {"spec", "template", "spec"},
	"DaemonSet":   {"spec", "template", "spec"},
	"ReplicaSet":  {"spec", "template", "spec"},
	"Job":         {"spec", "template", "spec"},
	"CronJob":     {"spec", "jobTemplate", "spec", "template", "spec"},
	"Pod":         {"spec"},
}

// podSpecs are the pod specs of every workload among objs, by
// Kind/namespace/name.
func podSpecs(t *testing.T, objs []*unstructured.Unstructured) map[string]corev1.PodSpec {
	t.Helper()
	out := map[string]corev1.PodSpec{}
	for _, o := range objs {
		path, ok := podSpecPaths[o.GetKind()]
		if !ok {
			continue
		}
		m, found, err := unstructured.NestedMap(o.Object, path...)
		if err != nil || !found {
			t.Fatalf("%s %s: no pod spec at %v: %v", o.GetKind(), o.GetName(), path, err)
		}
		var spec corev1.PodSpec
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &spec); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
		out[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = spec
	}
	return out
}

// backupOverlay is a kustomization of the base with the etcd-backup
// component, as docs/etcd.md tells to add it.
func backupOverlay(t *testing.T) string {
	t.Helper()
	base, err := filepath.Abs("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, base) // kustomize takes no absolute path
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\ncomponents: [%s]\n", rel, filepath.Join(rel, "etcd-backup"))
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	return overlay
}

// wantPriority is the class a workload must name: volplane's own for
// volplane's pods; the dev CSI driver, deployed as vendors ship drivers in
// a namespace of its own and before volplane, uses Kubernetes' classes
// as CSI drivers' charts do (system-node-critical for the node plugin).
func wantPriority(key string) string {
	kind, rest, _ := strings.Cut(key, "/")
	ns, _, _ := strings.Cut(rest, "/")
	switch {
	case ns != driverNamespace && ns != "kube-system":
		return priorityClass
	case kind == "DaemonSet":
		return "system-node-critical"
	default:
		return "system-cluster-critical"
	}
}

// priorityProblems lists the workloads without the class they must name,
// and a volplane-critical that is missing, a global default or out of
// range when a workload names it.
func priorityProblems(objs []*unstructured.Unstructured, specs map[string]corev1.PodSpec) []string {
	var problems []string
	named := false
	for key, spec := range specs {
		want := wantPriority(key)
		named = named || want == priorityClass
		if spec.PriorityClassName != want {
			problems = append(problems, fmt.Sprintf("%s: priorityClassName %q, want %q", key, spec.PriorityClassName, want))
		}
	}
	var pc *schedulingv1.PriorityClass
	for _, o := range objs {
		if o.GetKind() == "PriorityClass" && o.GetName() == priorityClass {
			pc = &schedulingv1.PriorityClass{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, pc); err != nil {
				return append(problems, err.Error())
			}
		}
	}
	switch {
	case !named:
	case pc == nil:
		problems = append(problems, "no PriorityClass "+priorityClass+" though workloads name it")
	case pc.GlobalDefault:
		problems = append(problems, priorityClass+" is the global default: every pod would get it")
	case pc.Value < maxUserPriority/2 || pc.Value > maxUserPriority:
		problems = append(problems, fmt.Sprintf("%s value %d, want a high one, at most %d", priorityClass, pc.Value, maxUserPriority))
	}
	slices.Sort(problems)
	return problems
}

// Every workload deploy/ ships (etcd, the services, the gateway, the
// backup job, the dev driver's pods) runs at a priority class, so that
// ordinary pods cannot preempt it, and the base carries that class.
func TestEveryWorkloadHasPriorityClass(t *testing.T) {
	dirs := append(slices.Clone(kustomizations), driverDir, backupOverlay(t))
	for _, dir := range dirs {
		name := dir
		if filepath.IsAbs(dir) {
			name = "kubernetes+etcd-backup"
		}
		t.Run(name, func(t *testing.T) {
			_, objs, err := manifests.Render(dir)
			if err != nil {
				t.Fatal(err)
			}
			specs := podSpecs(t, objs)
			if len(specs) == 0 {
				t.Fatal("no workload")
			}
			for _, p := range priorityProblems(objs, specs) {
				t.Error(p)
			}
		})
	}
}

// The priority check catches a workload without its class, one with
// another, and a class that is missing, a global default or too low.
func TestPriorityCheckCatches(t *testing.T) {
	_, objs, err := manifests.Render(backupOverlay(t))
	if err != nil {
		t.Fatal(err)
	}
	if p := priorityProblems(objs, podSpecs(t, objs)); len(p) != 0 {
		t.Fatalf("the shipped manifests: %v", p)
	}
	for _, tc := range []struct {
		name   string
		mutate func(objs []*unstructured.Unstructured) []*unstructured.Unstructured
		want   string
	}{
		{"a workload without", func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
			unstructured.RemoveNestedField(find(objs, "CronJob", "volplane-etcd-backup").Object, "spec", "jobTemplate", "spec", "template", "spec", "priorityClassName")
			return objs
		}, `CronJob/volplane-system/volplane-etcd-backup: priorityClassName ""`},
		{"another class", func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
			must(unstructured.SetNestedField(find(objs, "StatefulSet", "volplane-etcd").Object, "system-cluster-critical", "spec", "template", "spec", "priorityClassName"))
			return objs
		}, `StatefulSet/volplane-system/volplane-etcd: priorityClassName "system-cluster-critical"`},
		{"no class", func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
			return slices.DeleteFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == "PriorityClass" })
		}, "no PriorityClass"},
		{"global default", func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
			must(unstructured.SetNestedField(find(objs, "PriorityClass", priorityClass).Object, true, "globalDefault"))
			return objs
		}, "global default"},
		{"too low", func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
			must(unstructured.SetNestedField(find(objs, "PriorityClass", priorityClass).Object, int64(1000), "value"))
			return objs
		}, "value 1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, objs, err := manifests.Render(backupOverlay(t))
			if err != nil {
				t.Fatal(err)
			}
			objs = tc.mutate(objs)
			p := priorityProblems(objs, podSpecs(t, objs))
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("problems %v, want one with %q", p, tc.want)
			}
		})
	}
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	panic("no " + kind + " " + name)
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// startupProblems lists what is wrong with etcd's startup probe: missing,
// on a port the container does not declare, on another endpoint than the
// liveness probe's, or a budget shorter than the liveness probe's (which
// it must outlast: it exists to hold liveness off while a member replays
// its WAL or receives a snapshot).
func startupProblems(c corev1.Container) []string {
	s, l := c.StartupProbe, c.LivenessProbe
	switch {
	case s == nil:
		return []string{"etcd has no startupProbe"}
	case l == nil:
		return []string{"etcd has no livenessProbe"}
	case s.HTTPGet == nil || l.HTTPGet == nil:
		return []string{"etcd's startup and liveness probes are not HTTP GETs"}
	}
	var problems []string
	if _, ok := containerPort(c, s.HTTPGet.Port); !ok {
		problems = append(problems, fmt.Sprintf("startupProbe port %s is not the container's", s.HTTPGet.Port.String()))
	}
	if s.HTTPGet.Path != l.HTTPGet.Path || s.HTTPGet.Port != l.HTTPGet.Port {
		problems = append(problems, fmt.Sprintf("startupProbe %s:%s, livenessProbe %s:%s: want the same endpoint", s.HTTPGet.Port.String(), s.HTTPGet.Path, l.HTTPGet.Port.String(), l.HTTPGet.Path))
	}
	budget := func(p *corev1.Probe) int32 { return max(p.PeriodSeconds, 1) * max(p.FailureThreshold, 1) }
	if budget(s) < 2*budget(l) || budget(s) < 120 {
		problems = append(problems, fmt.Sprintf("startupProbe allows %ds, want at least 2 minutes and twice liveness's %ds", budget(s), budget(l)))
	}
	return problems
}

// etcd's members have a startup probe that holds the liveness probe off
// while a member starts, in every kustomization.
func TestEtcdStartupProbe(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			r := decodeAll(t, dir)
			for _, p := range startupProblems(mainContainer(r.workload(t, "volplane-etcd"))) {
				t.Error(p)
			}
		})
	}
}

// The startup probe check catches a missing probe, another port or path,
// and a budget too short.
func TestStartupCheckCatches(t *testing.T) {
	etcd := mainContainer(decodeAll(t, "kubernetes").workload(t, "volplane-etcd"))
	if p := startupProblems(etcd); len(p) != 0 {
		t.Fatalf("the shipped etcd: %v", p)
	}
	for _, tc := range []struct {
		name   string
		mutate func(c *corev1.Container)
		want   string
	}{
		{"none", func(c *corev1.Container) { c.StartupProbe = nil }, "no startupProbe"},
		{"another path", func(c *corev1.Container) { c.StartupProbe.HTTPGet.Path = "/readyz" }, "want the same endpoint"},
		{"undeclared port", func(c *corev1.Container) { c.StartupProbe.HTTPGet.Port.IntVal = 9999 }, "not the container's"},
		{"too short", func(c *corev1.Container) { c.StartupProbe.FailureThreshold = 3 }, "want at least 2 minutes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := *etcd.DeepCopy()
			tc.mutate(&c)
			p := startupProblems(c)
			if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("problems %v, want one with %q", p, tc.want)
			}
		})
	}
}

// sizingRows reads docs/operations.md's sizing table: per service, its
// request and limit cells ("100m, 256Mi").
func sizingRows(t *testing.T) map[string][2]string {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "## Sizing")
	if !ok {
		t.Fatal("docs/operations.md has no Sizing section")
	}
	rows := map[string][2]string{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 7 || strings.HasPrefix(cells[0], "---") || cells[0] == "service" {
			continue
		}
		name, _, _ := strings.Cut(cells[0], " ")
		rows["volplane-"+name] = [2]string{cells[5], cells[6]}
	}
	return rows
}

// sizeCell is a container's CPU and memory as the sizing table writes them.
func sizeCell(l corev1.ResourceList) string {
	return l.Cpu().String() + ", " + l.Memory().String()
}

// docs/operations.md's sizing table gives the requests and limits the base
// ships, for every workload of it.
func TestSizingTableMatchesBase(t *testing.T) {
	rows := sizingRows(t)
	r := decodeAll(t, "kubernetes")
	if len(rows) != len(r.workloads) {
		t.Errorf("the sizing table has %d services, the base %d workloads", len(rows), len(r.workloads))
	}
	for _, w := range r.workloads {
		c := mainContainer(w)
		row, ok := rows[w.name]
		switch {
		case !ok:
			t.Errorf("%s: not in docs/operations.md's sizing table", w.name)
		case row[0] != sizeCell(c.Resources.Requests) || row[1] != sizeCell(c.Resources.Limits):
			t.Errorf("%s: the table says request %s, limit %s; the base ships %s and %s", w.name, row[0], row[1], sizeCell(c.Resources.Requests), sizeCell(c.Resources.Limits))
		}
	}
}
