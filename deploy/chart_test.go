package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/volplane/volplane/test/harness/manifests"
)

// chartDir is volplane's Helm chart, which hack/genchart writes from the
// kustomize base (make chart).
const chartDir = "helm/volplane"

// helm is the pinned helm (make verify-chart builds it into bin/ and
// exports VOLPLANE_HELM); the chart's tests skip without it.
func helm(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("VOLPLANE_HELM"); p != "" {
		return p
	}
	if p, err := filepath.Abs("../bin/helm"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no helm: make verify-chart builds the pinned one into bin/ (or set VOLPLANE_HELM)")
	return ""
}

// helmTemplate renders the chart in dir with --set flags (and -f for a
// values file, set named *.yaml), as `helm template` does; an error
// carries helm's message.
func helmTemplate(t *testing.T, dir string, set ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	args := []string{"template", "volplane", dir, "--namespace", "volplane-system"}
	for _, s := range set {
		if strings.HasSuffix(s, ".yaml") { // a values file
			args = append(args, "-f", s)
			continue
		}
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helm(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return decodeObjects(out)
}

// decodeObjects decodes a multi-document YAML stream, skipping empty
// documents.
func decodeObjects(b []byte) ([]*unstructured.Unstructured, error) {
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			if err.Error() == "EOF" {
				return out, nil
			}
			return nil, err
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// kustomized renders kustomization dirs (and plain YAML files) under deploy/.
func kustomized(t *testing.T, sources ...string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, s := range sources {
		if strings.HasSuffix(s, ".yaml") {
			b, err := os.ReadFile(s)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decodeObjects(b)
			if err != nil {
				t.Fatalf("%s: %v", s, err)
			}
			out = append(out, objs...)
			continue
		}
		_, objs, err := manifests.Render(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, objs...)
	}
	return out
}

// keyOf names an object: apiVersion, kind, namespace and name.
func keyOf(u *unstructured.Unstructured) string {
	return fmt.Sprintf("%s %s %s/%s", u.GetAPIVersion(), u.GetKind(), u.GetNamespace(), u.GetName())
}

// normalized is an object as JSON values (numbers float64), so that YAML's
// and kustomize's typings compare equal.
func normalized(u *unstructured.Unstructured) (map[string]any, error) {
	b, err := json.Marshal(u.Object)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m)
}

// differences lists, object by object, how got differs from want: objects
// only one side has, and a diff of each object both have.
func differences(got, want []*unstructured.Unstructured) []string {
	index := func(objs []*unstructured.Unstructured) (map[string]map[string]any, []string) {
		m := map[string]map[string]any{}
		var bad []string
		for _, o := range objs {
			n, err := normalized(o)
			if _, dup := m[keyOf(o)]; dup || err != nil {
				bad = append(bad, fmt.Sprintf("%s: twice, or %v", keyOf(o), err))
			}
			m[keyOf(o)] = n
		}
		return m, bad
	}
	g, diffs := index(got)
	w, wbad := index(want)
	diffs = append(diffs, wbad...)
	for k, wo := range w {
		co, ok := g[k]
		switch {
		case !ok:
			diffs = append(diffs, k+": the chart does not render it")
		case !cmp.Equal(co, wo):
			diffs = append(diffs, k+": (-kustomize +chart)\n"+cmp.Diff(wo, co))
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			diffs = append(diffs, k+": only the chart renders it")
		}
	}
	slices.Sort(diffs)
	return diffs
}

// without drops the objects of a kind and name.
func without(objs []*unstructured.Unstructured, kind, name string) []*unstructured.Unstructured {
	return slices.DeleteFunc(slices.Clone(objs), func(u *unstructured.Unstructured) bool { return u.GetKind() == kind && u.GetName() == name })
}

// The chart is the kustomize base: with the default values `helm template`
// renders exactly the objects `kubectl kustomize deploy/kubernetes` does
// (but the namespace volplane-system, which Helm's --create-namespace
// makes), field by field; and each choice of the values renders what its
// kustomize counterpart does.
func TestChartRendersTheBase(t *testing.T) {
	helm(t)
	base := kustomized(t, "kubernetes")
	for _, tc := range []struct {
		name string
		set  []string
		want []*unstructured.Unstructured
	}{
		{"defaults", nil, without(base, "Namespace", "volplane-system")},
		{"createNamespace", []string{"createNamespace=true"}, base},
		{"no dev driver is overlays/cluster-dev", []string{"createNamespace=true", "provisioner.devDriver.enabled=false"},
			kustomized(t, "overlays/cluster-dev")},
		{"one-node-values.yaml is overlays/one-node", []string{"createNamespace=true", "provisioner.devDriver.enabled=false", "helm/one-node-values.yaml"},
			kustomized(t, "overlays/one-node")},
		{"cert-manager and monitoring", []string{"createNamespace=true", "certificates.source=cert-manager", "monitoring.enabled=true"},
			kustomized(t, "kubernetes", "kubernetes/certificates.yaml", "kubernetes/monitoring")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := helmTemplate(t, chartDir, tc.set...)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range differences(got, tc.want) {
				t.Error(d)
			}
			t.Logf("%d objects, the same as kustomize's", len(got))
		})
	}
}

// The equivalence check catches a template edited by hand: one field of
// one object changed in a copy of the chart is reported, naming the
// object.
func TestChartEquivalenceCatchesHandEdits(t *testing.T) {
	helm(t)
	dir := filepath.Join(t.TempDir(), "volplane")
	if err := os.CopyFS(dir, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "templates/base/statefulset-volplane-binder.yaml")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(b), "--kube-api-qps=1000", "--kube-api-qps=999", 1)
	if edited == string(b) {
		t.Fatal("the binder's template has no --kube-api-qps=1000 to edit")
	}
	if err := os.WriteFile(file, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := helmTemplate(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	diffs := differences(got, without(kustomized(t, "kubernetes"), "Namespace", "volplane-system"))
	if len(diffs) != 1 || !strings.Contains(diffs[0], "StatefulSet volplane-system/volplane-binder") || !strings.Contains(diffs[0], "--kube-api-qps=999") {
		t.Fatalf("differences %q, want the binder's StatefulSet and its edited flag", diffs)
	}
	t.Logf("caught: %s", diffs[0])
}

// A value of the wrong type, out of its range or unknown fails `helm
// template` with values.schema.json's message naming the value.
func TestChartSchemaRefusesBadValues(t *testing.T) {
	helm(t)
	for _, tc := range []struct {
		set  string
		want []string // in helm's message
	}{
		{"binder.replicas=two", []string{"at '/binder/replicas': got string, want integer"}},
		{"binder.resources=big", []string{"at '/binder/resources': got string, want object"}},
		{"etcd.replicas=4", []string{"at '/etcd/replicas': value must be one of 1, 3, 5, 7"}},
		{"certificates.source=vault", []string{"at '/certificates/source': value must be one of 'volplane-certs', 'cert-manager'"}},
		{"monitoring.enabled=yes", []string{"at '/monitoring/enabled': got string, want boolean"}},
		{"bindr.replicas=2", []string{"additional properties 'bindr' not allowed"}},
		{"image.pullPolicy=Sometimes", []string{"at '/image/pullPolicy'"}},
		{"watcher.replicas=0", []string{"at '/watcher/replicas': minimum: got 0, want 1"}},
		{"etcd.dataVolume.name=other", []string{"at '/etcd/dataVolume'"}},
		{"etcd.dataVolume.hostPath.path=/var/lib/etcd", []string{"at '/etcd/dataVolume': maxProperties"}},
	} {
		t.Run(tc.set, func(t *testing.T) {
			_, err := helmTemplate(t, chartDir, tc.set)
			if err == nil {
				t.Fatalf("--set %s rendered", tc.set)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("--set %s: %v\nwant %q in it", tc.set, err, w)
				}
			}
		})
	}
}

// Each value reaches every place it must: etcd's members in every member
// list, the watchers in the binder's and the provisioner's flags, images,
// resources, priority classes, Prometheus' labels.
func TestChartValues(t *testing.T) {
	helm(t)
	objs, err := helmTemplate(t, chartDir, "etcd.replicas=5", "etcd.dataVolume.emptyDir=null", "etcd.dataVolume.hostPath.path=/var/lib/volplane-etcd", "watcher.replicas=3", "image.repository=registry.example/volplane", "image.tag=9.9.9",
		"etcd.image.tag=9.9.8", "binder.priorityClassName=system-cluster-critical", "watcher.priorityClassName=", "gateway.resources.limits.memory=3Gi",
		"certificates.source=cert-manager", "monitoring.enabled=true", "monitoring.labels.release=kps")
	if err != nil {
		t.Fatal(err)
	}
	find := func(kind, name string) *unstructured.Unstructured {
		for _, o := range objs {
			if o.GetKind() == kind && o.GetName() == name {
				return o
			}
		}
		t.Fatalf("no %s %s", kind, name)
		return nil
	}
	str := func(o *unstructured.Unstructured, fields ...string) string {
		v, _, _ := unstructured.NestedFieldNoCopy(o.Object, fields...)
		b, _ := json.Marshal(v)
		return string(b)
	}
	checks := []struct{ what, got, want string }{
		{"etcd replicas", str(find("StatefulSet", "volplane-etcd"), "spec", "replicas"), "5"},
		{"etcd's fifth member", str(find("StatefulSet", "volplane-etcd"), "spec", "template", "spec", "containers"), "volplane-etcd-4=https://volplane-etcd-4.volplane-etcd.volplane-system.svc:2380"},
		{"etcd's data volume", str(find("StatefulSet", "volplane-etcd"), "spec", "template", "spec", "volumes"), `{"hostPath":{"path":"/var/lib/volplane-etcd"},"name":"data"}`},
		{"etcd image", str(find("StatefulSet", "volplane-etcd"), "spec", "template", "spec", "containers"), `"ghcr.io/volplane/etcd:9.9.8"`},
		{"etcd quorum", str(find("PodDisruptionBudget", "volplane-etcd"), "spec", "minAvailable"), "3"},
		{"etcd certificate", str(find("Certificate", "volplane-etcd"), "spec", "dnsNames"), "volplane-etcd-4.volplane-etcd.volplane-system.svc"},
		{"binder's etcd", str(find("StatefulSet", "volplane-binder"), "spec", "template", "spec", "containers"), "https://volplane-etcd-4.volplane-etcd.volplane-system.svc:2379"},
		{"reclaimer's etcd", str(find("StatefulSet", "volplane-reclaimer"), "spec", "template", "spec", "containers"), "https://volplane-etcd-4.volplane-etcd.volplane-system.svc:2379"},
		{"binder's third watcher", str(find("StatefulSet", "volplane-binder"), "spec", "template", "spec", "containers"), "--watcher-address=volplane-watcher-2."},
		{"provisioner's third watcher", str(find("Deployment", "volplane-provisioner"), "spec", "template", "spec", "containers"), "--watcher-address=volplane-watcher-2."},
		{"image", str(find("Deployment", "volplane-gateway"), "spec", "template", "spec", "containers"), `"registry.example/volplane:9.9.9"`},
		{"dev driver image", str(find("Deployment", "volplane-provisioner"), "spec", "template", "spec", "containers"), `"image":"registry.example/volplane:9.9.9","imagePullPolicy":"IfNotPresent","name":"csi-driver"`},
		{"priority class", str(find("StatefulSet", "volplane-binder"), "spec", "template", "spec", "priorityClassName"), `"system-cluster-critical"`},
		{"no priority class", str(find("StatefulSet", "volplane-watcher"), "spec", "template", "spec", "priorityClassName"), "null"},
		{"resources", str(find("Deployment", "volplane-gateway"), "spec", "template", "spec", "containers"), `"limits":{"cpu":"1","memory":"3Gi"}`},
		{"Prometheus' label", str(find("PrometheusRule", "volplane"), "metadata", "labels"), `{"release":"kps"}`},
	}
	for _, c := range checks {
		if !strings.Contains(c.got, c.want) {
			t.Errorf("%s: %s, want %s in it", c.what, c.got, c.want)
		}
	}
}
