package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/test/harness/manifests"
)

// spreadOverlay is a kustomization of the overlay dir (relative to
// deploy/) with the components comps (deploy/components/...), as an
// operator adds deploy/components/spread.
func spreadOverlay(t *testing.T, dir string, comps ...string) string {
	t.Helper()
	overlay := t.TempDir()
	rel := func(p string) string {
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		r, err := filepath.Rel(overlay, abs) // kustomize takes no absolute path
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var cs []string
	for _, c := range comps {
		cs = append(cs, rel(filepath.Join("components", c)))
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\ncomponents: [%s]\n", rel(dir), strings.Join(cs, ", "))
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	return overlay
}

// requiredByHost reports whether spec requires its pods of app on
// distinct nodes (a required anti-affinity term by kubernetes.io/hostname
// selecting app's label).
func requiredByHost(spec corev1.PodSpec, app string) bool {
	if spec.Affinity == nil || spec.Affinity.PodAntiAffinity == nil {
		return false
	}
	for _, term := range spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		if term.TopologyKey == "kubernetes.io/hostname" && term.LabelSelector != nil && term.LabelSelector.MatchLabels["app"] == app {
			return true
		}
	}
	return false
}

// zoneSpread reports whether spec spreads app's pods over zones without
// scheduling a skew.
func zoneSpread(spec corev1.PodSpec, app string) bool {
	for _, c := range spec.TopologySpreadConstraints {
		if c.TopologyKey == "topology.kubernetes.io/zone" && c.WhenUnsatisfiable == corev1.DoNotSchedule &&
			c.LabelSelector != nil && c.LabelSelector.MatchLabels["app"] == app {
			return true
		}
	}
	return false
}

// spreadProblems lists the services of apps (and etcd) in specs not
// spread as deploy/components/spread spreads them.
func spreadProblems(specs map[string]corev1.PodSpec, apps []string) []string {
	var problems []string
	found := map[string]bool{}
	for key, spec := range specs {
		for _, app := range append(slices.Clone(apps), "volplane-etcd") {
			if key != "Deployment/volplane-system/"+app && key != "StatefulSet/volplane-system/"+app {
				continue
			}
			found[app] = true
			if !requiredByHost(spec, app) {
				problems = append(problems, key+": no required anti-affinity by kubernetes.io/hostname")
			}
			if app == "volplane-etcd" && !zoneSpread(spec, app) {
				problems = append(problems, key+": no DoNotSchedule spread by topology.kubernetes.io/zone")
			}
		}
	}
	for _, app := range append(slices.Clone(apps), "volplane-etcd") {
		if !found[app] {
			problems = append(problems, app+": not rendered")
		}
	}
	slices.Sort(problems)
	return problems
}

// TestSpreadComponent: deploy/components/spread, added to cluster-dev and
// to standalone (where the binder's patch matches nothing), requires each
// service's replicas on distinct nodes and spreads etcd over zones; the
// overlays without it only prefer a spread, but for etcd's one member per
// node, which the base requires (the check is not vacuous).
func TestSpreadComponent(t *testing.T) {
	for _, tc := range []struct {
		dir   string
		comps []string
	}{
		{"overlays/cluster-dev", []string{"spread"}},
		{"overlays/standalone", []string{"sidecar-drivers", "spread"}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			_, objs, err := manifests.Render(spreadOverlay(t, tc.dir, tc.comps...))
			if err != nil {
				t.Fatal(err)
			}
			specs := podSpecs(t, objs)
			if p := spreadProblems(specs, componentsOf(tc.dir)); len(p) > 0 {
				t.Errorf("with the spread component:\n%v", p)
			}
			_, objs, err = manifests.Render(tc.dir)
			if err != nil {
				t.Fatal(err)
			}
			without := spreadProblems(podSpecs(t, objs), componentsOf(tc.dir))
			if len(without) != len(componentsOf(tc.dir))+1 { // each service, etcd's zone (the base requires etcd's node)
				t.Errorf("without the component, the problems are %v: the base requires a spread already, or the check misses one", without)
			}
		})
	}
}

// TestSpreadProblemsCatches breaks each guard of spreadProblems on a
// rendered, spread cluster-dev.
func TestSpreadProblemsCatches(t *testing.T) {
	apps := componentsOf("overlays/cluster-dev")
	render := func() map[string]corev1.PodSpec {
		_, objs, err := manifests.Render(spreadOverlay(t, "overlays/cluster-dev", "spread"))
		if err != nil {
			t.Fatal(err)
		}
		return podSpecs(t, objs)
	}
	for _, tc := range []struct {
		name    string
		breakIt func(map[string]corev1.PodSpec)
	}{
		{"a service's affinity gone", func(s map[string]corev1.PodSpec) {
			spec := s["Deployment/volplane-system/volplane-gateway"]
			spec.Affinity = nil
			s["Deployment/volplane-system/volplane-gateway"] = spec
		}},
		{"another app's label", func(s map[string]corev1.PodSpec) {
			spec := s["StatefulSet/volplane-system/volplane-binder"]
			spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].LabelSelector.MatchLabels["app"] = "volplane-watcher"
		}},
		{"by zone, not node", func(s map[string]corev1.PodSpec) {
			spec := s["Deployment/volplane-system/volplane-provisioner"]
			spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey = "topology.kubernetes.io/zone"
		}},
		{"etcd's zone spread soft", func(s map[string]corev1.PodSpec) {
			spec := s["StatefulSet/volplane-system/volplane-etcd"]
			for i := range spec.TopologySpreadConstraints {
				spec.TopologySpreadConstraints[i].WhenUnsatisfiable = corev1.ScheduleAnyway
			}
		}},
		{"a service missing", func(s map[string]corev1.PodSpec) {
			delete(s, "StatefulSet/volplane-system/volplane-reclaimer")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			specs := render()
			tc.breakIt(specs)
			if p := spreadProblems(specs, apps); len(p) != 1 {
				t.Errorf("problems %v, want exactly one", p)
			}
		})
	}
}
