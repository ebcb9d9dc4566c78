// Command genchart writes volplane's Helm chart (deploy/helm/volplane)
// from the kustomize base, its one source of truth: it renders
// deploy/kubernetes (and cert-manager's certificates.yaml and the
// monitoring kustomization, each behind a value), turns every object into
// a template, and puts the chart's values where its hooks (hooks.go) say:
// replicas, resources and priority classes per component, images, etcd's
// members and data volume, the dev CSI driver, Prometheus' namespace.
// The values' defaults are the base's own values, so that `helm template`
// with the defaults renders the base (deploy/chart_test.go proves it).
//
//	go run ./hack/genchart -version 0.1.0           # make chart
//	go run ./hack/genchart -version 0.1.0 -check    # make verify-chart
//
// A hook's object is found by kind and name and its field by path; one
// that the base no longer has fails the generator, naming it, so that a
// change of the base is followed here rather than dropped. New objects
// and fields of the base need nothing: they are rendered as they are.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

func main() {
	root := flag.String("C", ".", "the repository's top directory")
	out := flag.String("out", "deploy/helm/volplane", "the chart's directory, under -C")
	version := flag.String("version", "", "the chart's version and appVersion: the Makefile's VERSION")
	check := flag.Bool("check", false, "write nothing: fail when the chart on disk is not what would be written")
	flag.Parse()
	if err := run(*root, *out, *version, *check); err != nil {
		fmt.Fprintln(os.Stderr, "genchart:", err)
		os.Exit(1)
	}
}

func run(root, out, version string, check bool) error {
	if version == "" {
		return fmt.Errorf("-version is required (the Makefile's VERSION)")
	}
	files, err := generate(root, version)
	if err != nil {
		return err
	}
	dir := out
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(root, out)
	}
	if check {
		return compare(dir, files)
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// generate makes every file of the chart, by its path in the chart.
func generate(root, version string) (map[string]string, error) {
	c := &chart{defaults: map[string]any{}}
	for _, s := range sources {
		objs, err := s.load(root)
		if err != nil {
			return nil, err
		}
		c.objs = append(c.objs, objs...)
	}
	if err := c.hookAll(); err != nil {
		return nil, err
	}
	files, err := c.files()
	if err != nil {
		return nil, err
	}
	skel, err := skeleton(c.defaults, version)
	if err != nil {
		return nil, err
	}
	for k, v := range skel {
		files[k] = v
	}
	return files, nil
}

// hookAll applies every hook: the objects' conditions, the hooks by kind
// and name, those on every workload; then checks the computed ones.
func (c *chart) hookAll() error {
	for _, oc := range objectConds {
		o, err := c.find(oc.kind, oc.name)
		if err != nil {
			return fmt.Errorf("values key %s: %w", oc.key, err)
		}
		o.cond, c.defaults[oc.key] = oc.key, oc.def
	}
	generic, err := imageHooks(c.objs)
	if err != nil {
		return err
	}
	all := append(hooks(), append(generic, endpointHooks(c.objs)...)...)
	for _, h := range all {
		if err := c.apply(h); err != nil {
			return err
		}
	}
	if err := c.check(); err != nil {
		return err
	}
	return c.unhooked()
}

// members matches the name of one etcd member or one watcher: a list of
// them must follow etcd.replicas or watcher.replicas, through a hook.
var members = regexp.MustCompile(`volplane-(etcd|watcher)-[0-9]+\.`)

// unhooked fails when a string of an object names an etcd member or a
// watcher outside a hook (a new flag, a new certificate): the chart would
// keep the base's members whatever the replicas.
func (c *chart) unhooked() error {
	var bad []string
	for _, o := range c.objs {
		walkStrings(o.u, func(s string) {
			if members.MatchString(s) {
				bad = append(bad, fmt.Sprintf("%s/%s: %.120s", o.kind, o.name, s))
			}
		})
	}
	if len(bad) > 0 {
		return fmt.Errorf("members of etcd or of the watchers named outside a hook (add one in hack/genchart/hooks.go so that the replicas values reach them):\n  %s", strings.Join(bad, "\n  "))
	}
	return nil
}

// walkStrings calls f on every string in v.
func walkStrings(v any, f func(string)) {
	switch x := v.(type) {
	case string:
		f(x)
	case map[string]any:
		for _, e := range x {
			walkStrings(e, f)
		}
	case []any:
		for _, e := range x {
			walkStrings(e, f)
		}
	}
}

// compare fails when the chart in dir is not files, naming each file that
// differs, is missing or is extra.
func compare(dir string, files map[string]string) error {
	var bad []string
	seen := map[string]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		seen[rel] = true
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		want, ok := files[rel]
		switch {
		case !ok:
			bad = append(bad, rel+" (not generated)")
		case !bytes.Equal(b, []byte(want)):
			bad = append(bad, rel+" (differs)")
		}
		return nil
	})
	if err != nil {
		return err
	}
	for name := range files {
		if !seen[name] {
			bad = append(bad, name+" (missing)")
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return fmt.Errorf("the chart in %s is not what the generator writes (make chart, then commit):\n  %s", dir, strings.Join(bad, "\n  "))
	}
	return nil
}
