package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
)

// driverDir is the dev CSI driver deployed as vendors ship drivers.
const driverDir = "drivers/volplane-csi"

// driverNamespace is its namespace.
const driverNamespace = "volplane-csi"

// sidecarVersions are the upstream sidecars' pinned versions, as
// hack/build-csi-sidecars.sh builds them (csi-provisioner's from
// hack/external-provisioner/go.mod).
func sidecarVersions(t *testing.T) map[string]string {
	t.Helper()
	script, err := os.ReadFile("../hack/build-csi-sidecars.sh")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\t"([a-z-]+) \S+ (v\S+)"$`).FindAllSubmatch(script, -1) {
		out[string(m[1])] = string(m[2])
	}
	gomod, err := os.ReadFile("../hack/external-provisioner/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^require github.com/kubernetes-csi/external-provisioner/v6 (v\S+)$`).FindSubmatch(gomod); m != nil {
		out["csi-provisioner"] = string(m[1])
	}
	if len(out) != 5 {
		t.Fatalf("sidecar versions from the build script: %v, want 5", out)
	}
	return out
}

// driverObjects decodes the kustomization strictly (the VolumeSnapshotClass,
// whose CRD client-go's scheme lacks, is skipped) and checks that every
// namespaced object is in the driver's namespace or kube-system (the
// snapshot controller's).
func driverObjects(t *testing.T) []any {
	t.Helper()
	return decodeStrictly(t, driverDir)
}

// decodeStrictly renders the kustomization in dir and decodes each object
// strictly, skipping the VolumeSnapshotClass, whose CRD client-go's
// scheme lacks.
func decodeStrictly(t *testing.T, dir string) []any {
	t.Helper()
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{Strict: true})
	var objs []any
	for i, doc := range render(t, dir) {
		if strings.Contains(string(doc), `"apiVersion":"snapshot.storage.k8s.io/`) {
			continue
		}
		obj, _, err := strict.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s #%d: %v", dir, i, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// The vendor-style deployment of the dev driver: the upstream sidecars at
// their pinned versions in the driver's controller pod, each taking its
// command from its image (so that csi-provisioner's place changes with its
// image alone), each with leader election and dialing the socket the
// driver serves in a directory they share; every ClusterRole bound to the
// controller's ServiceAccount; the driver's command line one volplane-csi
// accepts (TestClusterDevOverlay checks its parts against the kubelet's).
func TestVendorDriverDeployment(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	bin := build(t)
	versions := sidecarVersions(t)
	var (
		controller *appsv1.Deployment
		node       *appsv1.DaemonSet
		bound      = map[string]bool{} // ClusterRoles bound to the controller's ServiceAccount
	)
	for _, obj := range driverObjects(t) {
		switch o := obj.(type) {
		case *appsv1.Deployment:
			if o.Namespace == driverNamespace {
				controller = o
			}
		case *appsv1.DaemonSet:
			node = o
		case *rbacv1.ClusterRoleBinding:
			if boundTo(o.Subjects, driverNamespace, "volplane-csi-controller") {
				bound[o.RoleRef.Name] = true
			}
		}
	}
	if controller == nil || node == nil {
		t.Fatalf("controller %v, node plugin %v: want both", controller != nil, node != nil)
	}
	for _, role := range []string{"volplane-csi-external-provisioner", "volplane-csi-external-attacher", "volplane-csi-external-resizer", "volplane-csi-external-snapshotter"} {
		if !bound[role] {
			t.Errorf("ClusterRole %s is not bound to volplane-csi-controller", role)
		}
	}
	checkSidecars(t, bin, controller.Spec.Template.Spec, versions)
}

// checkSidecars checks the controller pod's containers.
func checkSidecars(t *testing.T, bin string, pod corev1.PodSpec, versions map[string]string) {
	t.Helper()
	var endpoint string
	seen := map[string]bool{}
	for _, c := range pod.Containers {
		if c.Name == "volplane-csi" {
			acceptsFlags(t, bin, "controller container volplane-csi", c.Command)
			endpoint = strings.TrimPrefix(flagValues(c.Command)["--endpoint"], "unix://")
			continue
		}
		seen[c.Name] = true
		if want := "registry.k8s.io/sig-storage/" + c.Name + ":" + versions[c.Name]; c.Image != want {
			t.Errorf("container %s: image %s, want %s", c.Name, c.Image, want)
		}
		if len(c.Command) > 0 {
			t.Errorf("container %s sets a command: only its image's entrypoint may choose the binary", c.Name)
		}
		args := map[string]bool{}
		for _, a := range c.Args {
			args[a] = true
		}
		if !args["--csi-address=$(ADDRESS)"] || !(args["--leader-election"] || args["--leader-election=true"]) {
			t.Errorf("container %s: args %v, want --csi-address=$(ADDRESS) and --leader-election", c.Name, c.Args)
		}
		if len(c.Env) == 0 || c.Env[0].Name != "ADDRESS" || c.Env[0].Value != endpoint || len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/csi" {
			t.Errorf("container %s: env %v, mounts %v: want ADDRESS=%s in /csi", c.Name, c.Env, c.VolumeMounts, endpoint)
		}
	}
	for name := range versions {
		if name != "snapshot-controller" && !seen[name] {
			t.Errorf("no container %s in the controller pod", name)
		}
	}
	if endpoint != "/csi/csi.sock" {
		t.Errorf("the driver serves %q, want /csi/csi.sock", endpoint)
	}
}
