package deploy

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/volplane/volplane/services/reclaimer"
	"github.com/volplane/volplane/test/harness/manifests"
)

// imageRegistry is where every image make images builds is named.
const imageRegistry = "ghcr.io/volplane/"

// builtImages are the references make images tags, from hack/images.txt
// (the list hack/build-images.sh builds): ghcr.io/volplane/NAME:VERSION.
func builtImages(t *testing.T) map[string]bool {
	t.Helper()
	script, err := os.ReadFile("../hack/build-images.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), `"$root/hack/images.txt"`) || !strings.Contains(string(script), `-name "$registry/$name:$version"`) {
		t.Fatal("hack/build-images.sh no longer builds hack/images.txt's images as $registry/$name:$version: change this test with it")
	}
	b, err := os.ReadFile("../hack/images.txt")
	if err != nil {
		t.Fatal(err)
	}
	version := makefileVersion(t)
	out := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) < 3 {
			t.Fatalf("hack/images.txt: %q: want NAME ENTRYPOINT PACKAGE...", line)
		}
		for _, pkg := range f[2:] {
			if _, err := os.Stat("../" + pkg); err != nil {
				t.Errorf("hack/images.txt: image %s: package %s: %v", f[0], pkg, err)
			}
		}
		out[imageRegistry+f[0]+":"+version] = true
	}
	if len(out) == 0 {
		t.Fatal("hack/images.txt lists no image")
	}
	return out
}

// imageProblems lists the images of volplane's namespace that make images
// does not build, and the images of ghcr.io/volplane anywhere that it
// does not build under that name and tag. Others' images (a driver's
// upstream sidecars in its own namespace; the placeholder of the
// csi-driver overlay, which the user replaces) are theirs to build.
func imageProblems(specs map[string][]string, built map[string]bool) []string {
	var problems []string
	for key, images := range specs {
		_, rest, _ := strings.Cut(key, "/")
		ns, _, _ := strings.Cut(rest, "/")
		for _, image := range images {
			ours := strings.HasPrefix(image, imageRegistry) || (ns == "volplane-system" && !strings.HasPrefix(image, "registry.example.com/"))
			if ours && !built[image] {
				problems = append(problems, key+": image "+image+" is not one make images builds (hack/images.txt)")
			}
		}
	}
	slices.Sort(problems)
	return problems
}

// renderedImages renders dir and returns each workload's images (init
// containers too), by Kind/namespace/name.
func renderedImages(t *testing.T, dir string) map[string][]string {
	t.Helper()
	_, objs, err := manifests.Render(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for key, spec := range podSpecs(t, objs) {
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			out[key] = append(out[key], c.Image)
		}
	}
	return out
}

// Every image a kustomization names (the base, each overlay, the backup
// component, the dev driver) under ghcr.io/volplane, and every image of
// volplane's own namespace, is one make images builds with that very tag;
// so is docker-compose.yaml's (but for the harness's kube-apiserver), and
// the reclaimer's default recycler image.
func TestEveryImageIsBuilt(t *testing.T) {
	built := builtImages(t)
	t.Logf("make images builds %v", slices.Sorted(maps.Keys(built)))
	for _, dir := range append(slices.Clone(kustomizations), driverDir, backupOverlay(t)) {
		for _, p := range imageProblems(renderedImages(t, dir), built) {
			t.Error(p)
		}
	}

	b, err := os.ReadFile("../docker-compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	harness := "localhost/volplane-kube-apiserver:" + makefileVar(t, "KUBE_VERSION")
	for _, m := range regexp.MustCompile(`(?m)^\s*image:\s*(\S+)`).FindAllSubmatch(b, -1) {
		if image := string(m[1]); !built[image] && image != harness {
			t.Errorf("docker-compose.yaml: image %s is neither one make images builds nor %s (make compose-images)", image, harness)
		}
	}

	// The test binary has no version linked in; make images links VERSION.
	repo := reclaimer.DefaultRecyclerImage[:strings.LastIndex(reclaimer.DefaultRecyclerImage, ":")]
	if image := repo + ":" + makefileVersion(t); !built[image] {
		t.Errorf("the reclaimer's default recycler image %s is not one make images builds", image)
	}
}

// makefileVar is the value of a `NAME := value` line of the Makefile.
func makefileVar(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + name + `\s*:=\s*(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no %s := in the Makefile", name)
	}
	return string(m[1])
}

// The image check catches an image of volplane's namespace or registry
// that make images does not build (etcd's old tag among them), and lets
// others' images be.
func TestImageCheckCatches(t *testing.T) {
	built := map[string]bool{"ghcr.io/volplane/volplane:0.1.0": true, "ghcr.io/volplane/etcd:0.1.0": true}
	specs := map[string][]string{
		"StatefulSet/volplane-system/volplane-etcd":  {"ghcr.io/volplane/etcd:v3.6.8"},
		"Deployment/volplane-system/volplane-gw":     {"ghcr.io/volplane/volplane:0.1.0", "docker.io/library/busybox:1.37"},
		"Deployment/volplane-csi/controller":         {"ghcr.io/volplane/volplane:0.2.0", "registry.k8s.io/sig-storage/csi-attacher:v4.12.0"},
		"Deployment/volplane-system/volplane-driver": {"registry.example.com/example-csi-driver:v1.0.0"},
	}
	got := imageProblems(specs, built)
	want := []string{
		"Deployment/volplane-csi/controller: image ghcr.io/volplane/volplane:0.2.0",
		"Deployment/volplane-system/volplane-gw: image docker.io/library/busybox:1.37",
		"StatefulSet/volplane-system/volplane-etcd: image ghcr.io/volplane/etcd:v3.6.8",
	}
	if len(got) != len(want) {
		t.Fatalf("problems %v, want %d", got, len(want))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %q, want %q", got[i], want[i])
		}
	}
}
