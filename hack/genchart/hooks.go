package main

import (
	"fmt"
	"strings"
)

// How a hook's field becomes template text.
type hookKind int

const (
	// inline: the field's value is replaced by {{ expr }} (by default
	// toJson of the values key).
	inline hookKind = iota
	// optional: the field, present or not in the base, is rendered only
	// when the values key is not empty.
	optional
	// elems: the adjacent list elements a ~ selector picks are replaced by
	// one element per index below the values key (a count); expr renders
	// element $i.
	elems
	// cond: the list element (or field) is kept only when the values key is
	// true.
	cond
)

// A hook is one place where a value of the chart reaches into an object
// of the base. Its target is found by kind and name; a target or a path
// that is gone fails the generator.
type hook struct {
	kind string // the object's kind
	name string // and name
	at   path
	key  string   // the values key, e.g. "binder.replicas"
	how  hookKind // inline unless set
	expr string   // the template expression; toJson .Values.<key> when empty (inline)
	def  any      // the key's default when the base's value is not it (cond, or a field the base lacks)
	// expect, when set, gives what expr renders at the default values: the
	// base's values at the site must be exactly these, or the base has
	// changed in a way the expression does not follow. Such a hook sets no
	// default: its key is another hook's.
	expect func(defaults map[string]any) []any
	// defaults, when set, makes the defaults of the base's value (by
	// default {key: value}).
	defaults func(v any) map[string]any
	// expectAt are the base's values at the site (set when applied).
	expectAt []any
}

// components are the workloads each with values replicas, resources and
// priorityClassName: values key, kind, name, main container.
var components = []struct{ key, kind, name, container string }{
	{"etcd", "StatefulSet", "volplane-etcd", "etcd"},
	{"watcher", "StatefulSet", "volplane-watcher", "watcher"},
	{"binder", "StatefulSet", "volplane-binder", "binder"},
	{"provisioner", "Deployment", "volplane-provisioner", "provisioner"},
	{"reclaimer", "StatefulSet", "volplane-reclaimer", "reclaimer"},
	{"gateway", "Deployment", "volplane-gateway", "gateway"},
}

// podSpec is a Deployment's or StatefulSet's pod spec path.
var podSpec = path{"spec", "template", "spec"}

func containerAt(name string, rest ...string) path {
	return append(append(append(path{}, podSpec...), "containers", "name="+name), rest...)
}

// hooks is every hook found by kind and name.
func hooks() []hook {
	var hs []hook
	for _, c := range components {
		hs = append(hs,
			hook{kind: c.kind, name: c.name, at: path{"spec", "replicas"}, key: c.key + ".replicas"},
			hook{kind: c.kind, name: c.name, at: containerAt(c.container, "resources"), key: c.key + ".resources"},
			hook{kind: c.kind, name: c.name, at: append(append(path{}, podSpec...), "priorityClassName"), key: c.key + ".priorityClassName", how: optional, def: ""},
		)
	}
	return append(hs, append(etcdHooks(), append(provisionerHooks(), otherHooks()...)...)...)
}

// etcdHooks follow etcd.replicas into every list of members, and put the
// data volume in etcd.dataVolume and the members' placement in
// etcd.affinity and etcd.topologySpreadConstraints.
func etcdHooks() []hook {
	return []hook{
		{kind: "StatefulSet", name: "volplane-etcd", at: containerAt("etcd", "command", "~^--initial-cluster="), key: "etcd.replicas", how: inline,
			expr: `printf "--initial-cluster=%s" (include "volplane.etcdInitialCluster" .) | toJson`,
			expect: func(d map[string]any) []any {
				return []any{"--initial-cluster=" + etcdMembers(count(d, "etcd.replicas"), "%[1]s=https://%[1]s.volplane-etcd.volplane-system.svc:2380")}
			}},
		{kind: "StatefulSet", name: "volplane-etcd", at: append(append(path{}, podSpec...), "volumes", "name=data"), key: "etcd.dataVolume",
			expr: `merge (dict "name" "data") .Values.etcd.dataVolume | toJson`,
			defaults: func(v any) map[string]any {
				m := map[string]any{}
				for k, x := range v.(map[string]any) {
					if k != "name" {
						m[k] = x
					}
				}
				return map[string]any{"etcd.dataVolume": m}
			}},
		{kind: "StatefulSet", name: "volplane-etcd", at: append(append(path{}, podSpec...), "affinity"), key: "etcd.affinity"},
		{kind: "StatefulSet", name: "volplane-etcd", at: append(append(path{}, podSpec...), "topologySpreadConstraints"), key: "etcd.topologySpreadConstraints"},
		{kind: "PodDisruptionBudget", name: "volplane-etcd", at: path{"spec", "minAvailable"}, key: "etcd.replicas",
			expr:   `add1 (div (int .Values.etcd.replicas) 2)`,
			expect: func(d map[string]any) []any { return []any{int64(count(d, "etcd.replicas")/2 + 1)} }},
		{kind: "Certificate", name: "volplane-etcd", at: path{"spec", "dnsNames", `~^volplane-etcd-[0-9]+\.`}, key: "etcd.replicas", how: elems,
			expr: `printf "volplane-etcd-%d.volplane-etcd.volplane-system.svc" $i`,
			expect: func(d map[string]any) []any {
				return each(count(d, "etcd.replicas"), "volplane-etcd-%d.volplane-etcd.volplane-system.svc")
			}},
	}
}

// provisionerHooks: the watchers it and the binder stream from, and the
// dev CSI driver in its pod (provisioner.devDriver.enabled; off, the pod
// is deploy/components/sidecar-drivers' provisioner alone).
func provisionerHooks() []hook {
	watchers := func(kind, name, container string) hook {
		return hook{kind: kind, name: name, at: containerAt(container, "command", "~^--watcher-address="), key: "watcher.replicas", how: elems,
			expr: `printf "--watcher-address=volplane-watcher-%d.volplane-watcher-peers.volplane-system.svc:7701" $i`,
			expect: func(d map[string]any) []any {
				return each(count(d, "watcher.replicas"), "--watcher-address=volplane-watcher-%d.volplane-watcher-peers.volplane-system.svc:7701")
			}}
	}
	dev := func(at path) hook {
		return hook{kind: "Deployment", name: "volplane-provisioner", at: at, key: "provisioner.devDriver.enabled", how: cond, def: true}
	}
	return []hook{
		watchers("StatefulSet", "volplane-binder", "binder"),
		watchers("Deployment", "volplane-provisioner", "provisioner"),
		{kind: "Deployment", name: "volplane-provisioner", at: containerAt("csi-driver", "resources"), key: "provisioner.devDriver.resources"},
		dev(append(append(path{}, podSpec...), "containers", "name=csi-driver")),
		dev(containerAt("provisioner", "command", "=--csi-endpoint=unix:///csi/csi.sock")),
		dev(containerAt("provisioner", "volumeMounts", "name=socket-dir")),
		dev(append(append(path{}, podSpec...), "volumes", "name=socket-dir")),
		dev(append(append(path{}, podSpec...), "volumes", "name=data")),
	}
}

// otherHooks: where Prometheus runs, and the labels its selectors want.
func otherHooks() []hook {
	promNS := func(name string, rule string) hook {
		return hook{kind: "NetworkPolicy", name: name, key: "monitoring.prometheusNamespace",
			at: path{"spec", "ingress", rule, "from", "#0", "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name"}}
	}
	labels := func(kind string) hook {
		return hook{kind: kind, name: "volplane", at: path{"metadata", "labels"}, key: "monitoring.labels", how: optional, def: map[string]any{}}
	}
	return []hook{
		promNS("volplane-metrics", "#0"),
		promNS("volplane-etcd", "#2"),
		labels("ServiceMonitor"),
		labels("PrometheusRule"),
	}
}

// objectConds keep an object only when a values key is true: kind, name,
// key, default.
var objectConds = []struct {
	kind, name, key string
	def             bool
}{
	// Helm's --create-namespace (or Argo CD's, Flux's) makes the release's
	// namespace; a chart that holds it too cannot be installed there.
	{"Namespace", "volplane-system", "createNamespace", false},
}

// images are the images the chart's values name: the repository the base
// names and the values key of its repository and tag.
var images = map[string]string{
	"ghcr.io/volplane/volplane": "image",
	"ghcr.io/volplane/etcd":     "etcd.image",
}

// imageHooks hook the image and pull policy of every container of every
// workload (new ones too), and fail on an image the values do not name.
func imageHooks(objs []*object) ([]hook, error) {
	var hs []hook
	for _, o := range objs {
		spec, ok := podSpecPath(o.kind)
		if !ok {
			continue
		}
		for _, list := range []string{"initContainers", "containers"} {
			s, present, err := resolve(o.u, append(append(path{}, spec...), list))
			if err != nil || !present {
				continue
			}
			for _, c := range s.m[s.key].([]any) {
				name, _ := c.(map[string]any)["name"].(string)
				image, _ := c.(map[string]any)["image"].(string)
				repo, _, _ := strings.Cut(image, ":")
				key, ok := images[repo]
				if !ok {
					return nil, fmt.Errorf("%s/%s container %s: image %s is none of the chart's values (hack/genchart's images)", o.kind, o.name, name, image)
				}
				at := append(append(path{}, spec...), list, "name="+name)
				hs = append(hs,
					hook{kind: o.kind, name: o.name, at: append(append(path{}, at...), "image"), key: key,
						expr: fmt.Sprintf(`printf "%%s:%%s" .Values.%[1]s.repository .Values.%[1]s.tag | toJson`, key),
						defaults: func(v any) map[string]any {
							repo, tag, _ := strings.Cut(fmt.Sprint(v), ":")
							return map[string]any{key + ".repository": repo, key + ".tag": tag}
						}},
					hook{kind: o.kind, name: o.name, at: append(append(path{}, at...), "imagePullPolicy"), key: key + ".pullPolicy"})
			}
		}
	}
	return hs, nil
}

// endpointHooks follow etcd.replicas into every --etcd-endpoints= of
// every container (new ones too).
func endpointHooks(objs []*object) []hook {
	var hs []hook
	for _, o := range objs {
		spec, ok := podSpecPath(o.kind)
		if !ok {
			continue
		}
		s, present, err := resolve(o.u, append(append(path{}, spec...), "containers"))
		if err != nil || !present {
			continue
		}
		for _, c := range s.m[s.key].([]any) {
			cm := c.(map[string]any)
			for _, a := range asList(cm["command"]) {
				if strings.HasPrefix(fmt.Sprint(a), "--etcd-endpoints=") {
					hs = append(hs, hook{kind: o.kind, name: o.name, key: "etcd.replicas",
						at:   append(append(path{}, spec...), "containers", "name="+cm["name"].(string), "command", "~^--etcd-endpoints="),
						expr: `printf "--etcd-endpoints=%s" (include "volplane.etcdEndpoints" .) | toJson`,
						expect: func(d map[string]any) []any {
							return []any{"--etcd-endpoints=" + etcdMembers(count(d, "etcd.replicas"), "https://%[1]s.volplane-etcd.volplane-system.svc:2379")}
						}})
				}
			}
		}
	}
	return hs
}

// podSpecPath is where a workload kind keeps its pod spec.
func podSpecPath(kind string) (path, bool) {
	switch kind {
	case "Deployment", "StatefulSet", "DaemonSet", "Job":
		return podSpec, true
	case "CronJob":
		return path{"spec", "jobTemplate", "spec", "template", "spec"}, true
	}
	return nil, false
}

func asList(v any) []any { l, _ := v.([]any); return l }

// count is a default that is a count (JSON numbers are float64 or int64).
func count(d map[string]any, key string) int {
	switch n := d[key].(type) {
	case int64:
		return int(n)
	case float64:
		return int(n)
	}
	return -1
}

// etcdMembers joins format over etcd's member names (%[1]s) 0..n-1, as
// the chart's helpers (skel/_helpers.tpl) do.
func etcdMembers(n int, format string) string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf(format, fmt.Sprintf("volplane-etcd-%d", i)))
	}
	return strings.Join(out, ",")
}

// each formats format (%d) over 0..n-1.
func each(n int, format string) []any {
	var out []any
	for i := range n {
		out = append(out, fmt.Sprintf(format, i))
	}
	return out
}
