package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/volplane/volplane/internal/manifests"
)

// components are volplane's services; each runs at least two replicas
// behind a PodDisruptionBudget.
var components = []string{"volplane-watcher", "volplane-binder", "volplane-provisioner", "volplane-reclaimer", "volplane-gateway"}

// render runs kustomize on dir, as `kubectl kustomize` does.
func render(t *testing.T, dir string) [][]byte {
	t.Helper()
	docs, _, err := manifests.Render(dir)
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

// makefileVersion is the Makefile's VERSION, the tag make images gives.
func makefileVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSION\s*\?=\s*(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no VERSION ?= in the Makefile")
	}
	return string(m[1])
}

// The kustomize base and its overlays render, decode strictly, and every
// workload is shipped as production wants it: replicas, disruption
// budgets, probes, resources, the restricted Pod Security profile,
// topology spread, pinned images; and every volplane command line in
// them is one its binary accepts.
func TestKustomizationRunsAsShipped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	bin := build(t)
	version := makefileVersion(t)
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{Strict: true})
	for _, tc := range []struct {
		dir string
		// replicas of the provisioner: the dev driver keeps its volumes in
		// the provisioner's pod, so the dev overlay runs one.
		provisioners int32
	}{
		{"kubernetes", 2},
		{"overlays/dev", 1},
		{"overlays/csi-driver", 2},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			budgets := map[string]bool{}
			workloads := map[string]bool{}
			for i, doc := range render(t, tc.dir) {
				if strings.Contains(string(doc), `"apiVersion":"cert-manager.io/`) {
					continue // not in client-go's scheme
				}
				obj, _, err := strict.Decode(doc, nil, nil)
				if err != nil {
					t.Errorf("#%d: %v", i, err)
					continue
				}
				var (
					name     string
					replicas *int32
					pod      *corev1.PodTemplateSpec
				)
				switch o := obj.(type) {
				case *policyv1.PodDisruptionBudget:
					if o.Spec.MinAvailable == nil || o.Spec.MinAvailable.IntValue() < 1 {
						t.Errorf("PodDisruptionBudget %s lets every replica go", o.Name)
					}
					budgets[o.Name] = true
					continue
				case *appsv1.Deployment:
					name, replicas, pod = o.Name, o.Spec.Replicas, &o.Spec.Template
				case *appsv1.StatefulSet:
					name, replicas, pod = o.Name, o.Spec.Replicas, &o.Spec.Template
				default:
					continue
				}
				workloads[name] = true
				checkWorkload(t, bin, version, name, replicas, pod, tc.provisioners)
			}
			for _, c := range components {
				if !workloads[c] {
					t.Errorf("no workload %s", c)
				}
				if !budgets[c] {
					t.Errorf("no PodDisruptionBudget for %s", c)
				}
			}
		})
	}
}

func checkWorkload(t *testing.T, bin, version, name string, replicas *int32, pod *corev1.PodTemplateSpec, provisioners int32) {
	t.Helper()
	component := false
	for _, c := range components {
		component = component || c == name
	}
	switch {
	case replicas == nil:
		t.Errorf("%s: no replicas", name)
	case name == "volplane-provisioner" && *replicas != provisioners:
		t.Errorf("%s: replicas %d, want %d", name, *replicas, provisioners)
	case name == "volplane-etcd" && *replicas != 3:
		t.Errorf("%s: replicas %d, want 3 (a quorum that survives one member; docs/etcd.md)", name, *replicas)
	case component && name != "volplane-provisioner" && *replicas < 2:
		t.Errorf("%s: replicas %d, want at least 2", name, *replicas)
	}
	ps := pod.Spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: the pod is not restricted (runAsNonRoot, seccomp RuntimeDefault): %+v", name, ps)
	}
	if len(pod.Spec.TopologySpreadConstraints) == 0 {
		t.Errorf("%s: no topology spread", name)
	}
	for _, c := range pod.Spec.Containers {
		where := name + " container " + c.Name
		image, tag, tagged := strings.Cut(c.Image[strings.LastIndex(c.Image, "/")+1:], ":")
		switch {
		case !tagged || tag == "latest":
			t.Errorf("%s: image %q is not pinned by a tag", where, c.Image)
		case image == "volplane" && tag != version:
			t.Errorf("%s: image %q, want the Makefile's VERSION %s", where, c.Image, version)
		}
		if c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("%s: imagePullPolicy %q, want IfNotPresent", where, c.ImagePullPolicy)
		}
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("%s: securityContext %+v, want no privilege escalation, a read-only root and every capability dropped", where, sc)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := c.Resources.Requests[r]; !ok {
				t.Errorf("%s: no %s request", where, r)
			}
			if _, ok := c.Resources.Limits[r]; !ok {
				t.Errorf("%s: no %s limit", where, r)
			}
		}
		if component && c.Name != "csi-driver" && (c.ReadinessProbe == nil || c.LivenessProbe == nil) {
			t.Errorf("%s: readiness %v, liveness %v: want both", where, c.ReadinessProbe, c.LivenessProbe)
		}
		if len(c.Command) > 0 {
			acceptsFlags(t, bin, where, c.Command)
		}
	}
}

// docker-compose.yaml's volplane image is pinned to the Makefile's
// VERSION too, and no image is :latest.
func TestComposeImagesPinned(t *testing.T) {
	version := makefileVersion(t)
	b, err := os.ReadFile("../docker-compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	images := regexp.MustCompile(`(?m)^\s*image:\s*(\S+)`).FindAllSubmatch(b, -1)
	if len(images) == 0 {
		t.Fatal("no image in docker-compose.yaml")
	}
	for _, m := range images {
		image := string(m[1])
		name, tag, tagged := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":")
		if !tagged || tag == "latest" || (name == "volplane" && tag != version) {
			t.Errorf("docker-compose.yaml: image %s, want a pinned tag (volplane:%s)", image, version)
		}
	}
}
