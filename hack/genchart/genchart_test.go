package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// root is the repository, whose deploy/ the generator reads.
const root = "../.."

// loaded is a chart of the base's objects, before any hook.
func loaded(t *testing.T) *chart {
	t.Helper()
	c := &chart{defaults: map[string]any{}}
	for _, s := range sources {
		objs, err := s.load(root)
		if err != nil {
			t.Fatal(err)
		}
		c.objs = append(c.objs, objs...)
	}
	return c
}

// containerOf is a workload's container by name.
func containerOf(t *testing.T, c *chart, kind, name, container string) map[string]any {
	t.Helper()
	o, err := c.find(kind, name)
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := resolve(o.u, containerAt(container))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := s.value()
	return v.(map[string]any)
}

// The committed chart is what the generator writes at the Makefile's
// VERSION (make verify-chart runs the same check with -check).
func TestChartIsGenerated(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSION\s*\?=\s*(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no VERSION ?= in the Makefile")
	}
	if err := run(root, "deploy/helm/volplane", string(m[1]), true); err != nil {
		t.Fatal(err)
	}
}

// -check names a file edited by hand, a file added and a file removed.
func TestChartCheckCatchesEdits(t *testing.T) {
	dir := t.TempDir()
	if err := run(root, dir, "0.1.0", false); err != nil {
		t.Fatal(err)
	}
	edit := filepath.Join(dir, "templates/base/statefulset-volplane-binder.yaml")
	b, _ := os.ReadFile(edit)
	os.WriteFile(edit, append(b, "# edited\n"...), 0o644)
	os.WriteFile(filepath.Join(dir, "templates/extra.yaml"), []byte("kind: ConfigMap\n"), 0o644)
	os.Remove(filepath.Join(dir, "templates/base/service-volplane-gateway.yaml"))
	err := run(root, dir, "0.1.0", true)
	if err == nil {
		t.Fatal("-check passed an edited chart")
	}
	for _, want := range []string{"statefulset-volplane-binder.yaml (differs)", "templates/extra.yaml (not generated)", "service-volplane-gateway.yaml (missing)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v\nwant %q in it", err, want)
		}
	}
}

// Every hook fails the generator loudly, naming its values key and its
// target, when the base no longer has what it reaches into; a base that
// changed the shape of what a computed hook renders fails the check.
func TestChartHooksFailWhenTheirTargetIsGone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, c *chart)
		want   []string
	}{
		{"object gone", func(t *testing.T, c *chart) {
			o, _ := c.find("StatefulSet", "volplane-reclaimer")
			o.name = "volplane-recycler"
		}, []string{"reclaimer.replicas", "0 objects StatefulSet/volplane-reclaimer"}},
		{"container gone", func(t *testing.T, c *chart) {
			containerOf(t, c, "StatefulSet", "volplane-binder", "binder")["name"] = "bind"
		}, []string{"binder.resources", "StatefulSet/volplane-binder", "no element name=binder"}},
		{"field gone", func(t *testing.T, c *chart) {
			delete(containerOf(t, c, "Deployment", "volplane-gateway", "gateway"), "resources")
		}, []string{"gateway.resources", "Deployment/volplane-gateway has no spec/template/spec/containers/name=gateway/resources"}},
		{"etcd's data volume gone", func(t *testing.T, c *chart) {
			o, _ := c.find("StatefulSet", "volplane-etcd")
			o.u["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["volumes"] = []any{}
		}, []string{"etcd.dataVolume", "no element name=data"}},
		{"members' shape changed", func(t *testing.T, c *chart) {
			cm := containerOf(t, c, "StatefulSet", "volplane-etcd", "etcd")
			for i, a := range cm["command"].([]any) {
				if strings.HasPrefix(a.(string), "--initial-cluster=") {
					cm["command"].([]any)[i] = strings.ReplaceAll(a.(string), ":2380", ":2390")
				}
			}
		}, []string{"--initial-cluster", "2390", "update hack/genchart's hook"}},
		{"an image the values do not name", func(t *testing.T, c *chart) {
			containerOf(t, c, "Deployment", "volplane-gateway", "gateway")["image"] = "docker.io/library/busybox:1.37"
		}, []string{"Deployment/volplane-gateway container gateway", "busybox"}},
		{"a member list outside a hook", func(t *testing.T, c *chart) {
			cm := containerOf(t, c, "Deployment", "volplane-gateway", "gateway")
			cm["command"] = append(cm["command"].([]any), "--etcd=https://volplane-etcd-0.volplane-etcd.volplane-system.svc:2379")
		}, []string{"outside a hook", "Deployment/volplane-gateway: --etcd=https://volplane-etcd-0."}},
		{"two images under one value", func(t *testing.T, c *chart) {
			containerOf(t, c, "Deployment", "volplane-gateway", "gateway")["image"] = "ghcr.io/volplane/volplane:0.0.9"
		}, []string{"image.tag", "0.0.9"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := loaded(t)
			tc.change(t, c)
			err := c.hookAll()
			if err == nil {
				t.Fatal("the generator passed")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v\nwant %q in it", err, w)
				}
			}
		})
	}
}

// What the hooks do not name passes through as it is: a new object and a
// new field of the base are in the chart without a change here, a
// workload's new container gets the image values, and a field a hook
// adds (a priority class) takes the base's value as its default once the
// base has one.
func TestChartTakesNewObjectsAndFields(t *testing.T) {
	c := loaded(t)
	c.objs = append(c.objs, &object{kind: "ConfigMap", name: "volplane-new", source: sources[0], u: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "volplane-new", "namespace": "volplane-system"},
		"data": map[string]any{"alert": "{{ $labels.pod }} is down"},
	}})
	etcd := containerOf(t, c, "StatefulSet", "volplane-etcd", "etcd")
	etcd["startupProbe"] = map[string]any{"httpGet": map[string]any{"path": "/livez", "port": int64(2381)}, "failureThreshold": int64(60)}
	o, _ := c.find("StatefulSet", "volplane-etcd")
	spec := o.u["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	spec["initContainers"] = []any{map[string]any{"name": "wait", "image": "ghcr.io/volplane/volplane:0.1.0", "imagePullPolicy": "IfNotPresent"}}
	binder, _ := c.find("StatefulSet", "volplane-binder")
	binder.u["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["priorityClassName"] = "volplane-critical"
	// The base gives every workload a priority class: take the watcher's
	// away, as a base without one would be.
	watcher, _ := c.find("StatefulSet", "volplane-watcher")
	delete(watcher.u["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any), "priorityClassName")
	if err := c.hookAll(); err != nil {
		t.Fatal(err)
	}
	if got := c.defaults["binder.priorityClassName"]; got != "volplane-critical" {
		t.Errorf("binder.priorityClassName defaults to %v, want the base's volplane-critical", got)
	}
	if got := c.defaults["watcher.priorityClassName"]; got != "" {
		t.Errorf("watcher.priorityClassName defaults to %v, want none", got)
	}
	files, err := c.files()
	if err != nil {
		t.Fatal(err)
	}
	cm := files["templates/base/configmap-volplane-new.yaml"]
	if !strings.Contains(cm, `alert: '{{ "{{" }} $labels.pod }} is down'`) {
		t.Errorf("the new ConfigMap's template:\n%s\nwant its {{ kept as text", cm)
	}
	sts := files["templates/base/statefulset-volplane-etcd.yaml"]
	for _, want := range []string{"startupProbe:", "failureThreshold: 60", "name: wait", `image: {{ printf "%s:%s" .Values.image.repository .Values.image.tag | toJson }}`} {
		if !strings.Contains(sts, want) {
			t.Errorf("etcd's template has no %q:\n%s", want, sts)
		}
	}
}
