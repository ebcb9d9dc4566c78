// Package manifests renders volplane's kustomizations (deploy/kubernetes
// and its overlays) as kubectl kustomize does, for the tests that check
// them: strictly decoded in deploy/, applied with a server-side dry run
// against a real API server in test/e2e/replicas.
package manifests

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Render runs kustomize on dir and returns each object, as JSON and as an
// unstructured object, in kustomize's order.
func Render(dir string) ([][]byte, []*unstructured.Unstructured, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	var docs [][]byte
	var objs []*unstructured.Unstructured
	for _, r := range m.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			return nil, nil, err
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			return nil, nil, fmt.Errorf("kustomize %s: %s: %w", dir, r.CurId(), err)
		}
		docs, objs = append(docs, b), append(objs, u)
	}
	return docs, objs, nil
}
