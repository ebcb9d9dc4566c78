package replicas

import (
	"context"
	"path/filepath"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/volplane/volplane/test/harness/manifests"
)

// The kustomize base and its overlays, rendered as kubectl kustomize
// renders them, are accepted by a real API server: every object passes a
// server-side dry-run create (validation, defaulting, admission; strict
// field validation, so a misspelled field fails) in the namespace the
// manifests create. cert-manager's objects are left out: this API server
// has no cert-manager CRDs.
func TestManifestsPassServerSideDryRun(t *testing.T) {
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(env.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(env.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	for _, dir := range []string{"kubernetes", "overlays/dev", "overlays/csi-driver", "overlays/cluster-dev", "overlays/standalone"} {
		t.Run(dir, func(t *testing.T) {
			_, objs, err := manifests.Render(filepath.Join("..", "..", "..", "deploy", dir))
			if err != nil {
				t.Fatal(err)
			}
			checked := 0
			for _, o := range objs {
				gvk := o.GroupVersionKind()
				if gvk.Group == "cert-manager.io" {
					continue
				}
				m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if err != nil {
					t.Errorf("%s %s: %v", gvk, o.GetName(), err)
					continue
				}
				r := dyn.Resource(m.Resource)
				var ri dynamic.ResourceInterface = r
				if m.Scope.Name() == meta.RESTScopeNameNamespace {
					ri = r.Namespace(o.GetNamespace())
				}
				if gvk.Kind == "Namespace" {
					// Namespaced objects are checked in it: create it for real.
					if _, err := ri.Create(ctx, o, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
						t.Fatalf("namespace %s: %v", o.GetName(), err)
					}
					continue
				}
				_, err = ri.Create(ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict})
				if err != nil && !apierrors.IsAlreadyExists(err) {
					t.Errorf("%s %s/%s: the API server refuses it: %v", gvk.Kind, o.GetNamespace(), o.GetName(), err)
					continue
				}
				checked++
			}
			if checked < 30 {
				t.Errorf("dry-ran %d objects, want every object of the manifests", checked)
			}
			t.Logf("%s: %d objects accepted by a server-side dry run", dir, checked)
		})
	}
}
