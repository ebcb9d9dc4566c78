// Package deploy holds volplane's deployment files; its test checks that
// they run as shipped: every Kubernetes object decodes strictly, and every
// volplane command line in them is one its binary accepts.
package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	sigyaml "sigs.k8s.io/yaml"
)

// docs splits a multi-document YAML file.
func docs(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, part := range strings.Split(string(b), "\n---\n") {
		if strings.TrimSpace(stripComments(part)) == "" {
			continue
		}
		j, err := yaml.ToJSON([]byte(part))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, j)
	}
	return out
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// binaries are volplane's commands, by their path in the image.
var binaries = map[string]string{
	"/usr/local/bin/watcher":      "./services/watcher/cmd/watcher",
	"/usr/local/bin/binder":       "./services/binder/cmd/binder",
	"/usr/local/bin/provisioner":  "./services/provisioner/cmd/provisioner",
	"/usr/local/bin/reclaimer":    "./services/reclaimer/cmd/reclaimer",
	"/usr/local/bin/gateway":      "./gateway/cmd/gateway",
	"/usr/local/bin/volplane-csi": "./cmd/volplane-csi",
	// The etcd image's (ghcr.io/volplane/etcd).
	"/usr/local/bin/volplane-etcd-member": "./cmd/volplane-etcd-member",
	"/usr/local/bin/volplane-etcd-backup": "./cmd/volplane-etcd-backup",
}

var built struct {
	once sync.Once
	dir  string
	err  error
}

// build builds every volplane binary, once for all tests, into a
// temporary directory.
func build(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "volplane-deploy-"); built.err != nil {
			return
		}
		args := []string{"build", "-o", built.dir + "/"}
		for _, pkg := range binaries {
			args = append(args, pkg)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.dir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// acceptsFlags runs a volplane command line with --help appended: the
// flags parse in order, so an unknown flag or a bad value fails before the
// help, which exits 0.
func acceptsFlags(t *testing.T, bin, where string, command []string) {
	t.Helper()
	pkg, ok := binaries[command[0]]
	if !ok {
		return // not a volplane binary
	}
	args := append(append([]string{}, command[1:]...), "--help")
	cmd := exec.Command(filepath.Join(bin, filepath.Base(pkg)), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("%s: %s does not accept its command line: %v\n%s", where, command[0], err, firstLines(out.String(), 3))
	}
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

// The Kubernetes manifests decode strictly (no unknown or misspelled
// field) and every container's command line is one its binary accepts.
func TestKubernetesManifestsRunAsShipped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	bin := build(t)
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{Strict: true})
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	commands := 0
	for _, f := range files {
		for i, doc := range docs(t, f) {
			var meta struct {
				APIVersion string `json:"apiVersion"`
			}
			if err := sigyaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s #%d: %v", f, i, err)
			}
			if strings.HasPrefix(meta.APIVersion, "cert-manager.io/") || strings.HasPrefix(meta.APIVersion, "kustomize.config.k8s.io/") {
				continue // not in client-go's scheme; kustomize_test.go renders the kustomization
			}
			obj, _, err := strict.Decode(doc, nil, nil)
			if err != nil {
				t.Errorf("%s #%d: %v", f, i, err)
				continue
			}
			var spec *corev1.PodSpec
			switch o := obj.(type) {
			case *appsv1.Deployment:
				spec = &o.Spec.Template.Spec
			case *appsv1.StatefulSet:
				spec = &o.Spec.Template.Spec
			case *appsv1.DaemonSet:
				spec = &o.Spec.Template.Spec
			}
			if spec == nil {
				continue
			}
			for _, c := range spec.Containers {
				if len(c.Command) > 0 {
					commands++
					acceptsFlags(t, bin, f+" container "+c.Name, c.Command)
				}
			}
		}
	}
	if commands < 6 {
		t.Errorf("checked %d volplane command lines, want every service's", commands)
	}
}

// docker-compose.yaml's command lines are ones the binaries accept.
func TestComposeRunsAsShipped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	bin := build(t)
	b, err := os.ReadFile("../docker-compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command []string `json:"command"`
		} `json:"services"`
	}
	if err := sigyaml.Unmarshal(b, &compose); err != nil {
		t.Fatal(err)
	}
	n := 0
	for name, s := range compose.Services {
		if len(s.Command) > 0 {
			n++
			acceptsFlags(t, bin, "docker-compose.yaml service "+name, s.Command)
		}
	}
	if n < 6 {
		t.Errorf("checked %d services, want every one", n)
	}
}
