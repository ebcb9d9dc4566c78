package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/volplane/volplane/test/harness/manifests"
)

// An object is one object of the base, as a JSON map, where the hooks
// put their tokens.
type object struct {
	kind, name, namespace string
	u                     map[string]any
	source                *source
	cond                  string // the values key the object is kept on ("" always)
}

// A source is a set of objects the chart renders, all of them or none.
type source struct {
	dir  string // under the chart's templates/
	from string // a kustomization directory, or a YAML file, under the repository
	cond string // the template condition the source is rendered on ("" always)
	kust bool
}

// sources are the chart's objects: the kustomize base always, cert-manager's
// certificates and the Prometheus Operator's monitoring when chosen.
var sources = []*source{
	{dir: "base", from: "deploy/kubernetes", kust: true},
	{dir: "cert-manager", from: "deploy/kubernetes/certificates.yaml", cond: `eq .Values.certificates.source "cert-manager"`},
	{dir: "monitoring", from: "deploy/kubernetes/monitoring", kust: true, cond: `.Values.monitoring.enabled`},
}

// load reads a source's objects from the repository at root.
func (s *source) load(root string) ([]*object, error) {
	var maps []map[string]any
	if s.kust {
		_, objs, err := manifests.Render(filepath.Join(root, s.from))
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			maps = append(maps, o.Object)
		}
	} else {
		b, err := os.ReadFile(filepath.Join(root, s.from))
		if err != nil {
			return nil, err
		}
		if maps, err = decodeAll(b); err != nil {
			return nil, fmt.Errorf("%s: %w", s.from, err)
		}
	}
	var out []*object
	for _, m := range maps {
		meta, _ := m["metadata"].(map[string]any)
		o := &object{u: m, source: s}
		o.kind, _ = m["kind"].(string)
		o.name, _ = meta["name"].(string)
		o.namespace, _ = meta["namespace"].(string)
		if o.kind == "" || o.name == "" {
			return nil, fmt.Errorf("%s: an object without kind or name", s.from)
		}
		out = append(out, o)
	}
	return out, nil
}

// decodeAll decodes a multi-document YAML file, skipping empty documents.
func decodeAll(b []byte) ([]map[string]any, error) {
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []map[string]any
	for {
		var m map[string]any
		err := d.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(m) > 0 {
			out = append(out, m)
		}
	}
}
