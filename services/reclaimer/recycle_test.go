package reclaimer

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/volplane/volplane/pkg/served"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The scrub removes every entry, hidden files and nested directories
// included, removes symbolic links without following them, and keeps the
// directory.
func TestScrubDir(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "volume")
	outside := filepath.Join(root, "outside")
	write(t, filepath.Join(dir, "file"), "data")
	write(t, filepath.Join(dir, ".hidden"), "data")
	write(t, filepath.Join(dir, ".hidden-dir", "a", "b", ".deep"), "data")
	write(t, filepath.Join(dir, "nested", "x", "y"), "data")
	write(t, filepath.Join(outside, "keep"), "must survive")
	if err := os.Symlink(outside, filepath.Join(dir, "link-to-outside")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "keep"), filepath.Join(dir, "nested", "link-to-file")); err != nil {
		t.Fatal(err)
	}
	if err := scrubDir(dir + "/"); err != nil {
		t.Fatal(err)
	}
	left, err := os.ReadDir(dir)
	if err != nil || len(left) != 0 {
		t.Fatalf("after the scrub: %v entries, %v", len(left), err)
	}
	if b, err := os.ReadFile(filepath.Join(outside, "keep")); err != nil || string(b) != "must survive" {
		t.Fatalf("a symbolic link was followed: %q %v", b, err)
	}
	// Scrubbing an empty directory succeeds.
	if err := scrubDir(dir); err != nil {
		t.Fatal(err)
	}
}

func TestScrubDirRefuses(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "file"), "data")
	for _, tc := range []struct{ name, dir, want string }{
		{"missing", filepath.Join(root, "missing"), "no such file"},
		{"a file", filepath.Join(root, "file"), "not a directory"},
		{"relative", "tmp/x", "not absolute"},
		{"root", "/", "refusing"},
		{"root in disguise", "/tmp/..", "refusing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := scrubDir(tc.dir); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("scrubDir(%q) = %v, want an error with %q", tc.dir, err, tc.want)
			}
		})
	}
}

func TestRecyclerTimeout(t *testing.T) {
	for _, tc := range []struct {
		size string
		want int64
	}{
		{"", 60}, {"1Mi", 60}, {"1Gi", 60}, {"2Gi", 60}, {"3Gi", 90}, {"2500Mi", 90}, {"100Gi", 3000},
	} {
		t.Run(tc.size, func(t *testing.T) {
			v := releasedPV("a", corev1.PersistentVolumeReclaimRecycle)
			delete(v.Spec.Capacity, corev1.ResourceStorage)
			if tc.size != "" {
				v.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse(tc.size)
			}
			if got := recyclerTimeout(v, time.Minute, 30*time.Second); got != tc.want {
				t.Errorf("recyclerTimeout(%s) = %d, want %d", tc.size, got, tc.want)
			}
		})
	}
}

func TestRecyclerPod(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "me", kc, j, nil, config{namespace: "recyclers", image: "busybox:test"})
	v := releasedPV("pv-1", corev1.PersistentVolumeReclaimRecycle, func(v *corev1.PersistentVolume) {
		v.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse("10Gi")
	})
	rec := r.newRecord(v, decide(v, served.Set{Known: true}, RecyclePod, node{}))

	t.Run("default pod for hostPath", func(t *testing.T) {
		p, err := r.recyclerPod(v, rec)
		if err != nil {
			t.Fatal(err)
		}
		c := p.Spec.Containers[0]
		switch {
		case p.Name != "recycler-for-pv-1" || p.Namespace != "recyclers":
			t.Errorf("pod %s/%s", p.Namespace, p.Name)
		case c.Image != "busybox:test" || !slices.Equal(c.Command, []string{"/bin/sh"}) ||
			!slices.Equal(c.Args, []string{"-c", `test -e /scrub && find /scrub -mindepth 1 -delete && test -z "$(ls -A /scrub)" || exit 1`}):
			t.Errorf("container %+v", c)
		case len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != "vol" || c.VolumeMounts[0].MountPath != "/scrub":
			t.Errorf("mounts %+v", c.VolumeMounts)
		case p.Spec.Volumes[0].Name != "vol" || p.Spec.Volumes[0].HostPath == nil || p.Spec.Volumes[0].HostPath.Path != "/tmp/volplane-unit/pv-1":
			t.Errorf("volumes %+v", p.Spec.Volumes)
		case p.Spec.RestartPolicy != corev1.RestartPolicyNever || p.Spec.ActiveDeadlineSeconds == nil || *p.Spec.ActiveDeadlineSeconds != 300:
			t.Errorf("restart %s, deadline %v", p.Spec.RestartPolicy, p.Spec.ActiveDeadlineSeconds)
		case p.Labels[labelManagedBy] != managedBy || p.Annotations[annVolume] != "pv-1" || p.Annotations[annVolumeUID] != "uid-pv-1" || p.Annotations[annClaimUID] != "claim-uid":
			t.Errorf("labels %v, annotations %v", p.Labels, p.Annotations)
		}
	})
	t.Run("NFS", func(t *testing.T) {
		nfs := releasedPV("pv-2", corev1.PersistentVolumeReclaimRecycle, withNFS())
		p, err := r.recyclerPod(nfs, rec)
		if err != nil {
			t.Fatal(err)
		}
		if s := p.Spec.Volumes[0].NFS; s == nil || s.Server != "nfs.example" || s.Path != "/exports/pv-2" || s.ReadOnly {
			t.Errorf("nfs volume %+v", p.Spec.Volumes[0])
		}
	})
	t.Run("no recycler for CSI", func(t *testing.T) {
		if _, err := r.recyclerPod(releasedPV("pv-3", corev1.PersistentVolumeReclaimRecycle, withCSI("x")), rec); err == nil || err.Error() != msgNoRecycler {
			t.Errorf("CSI volume: %v", err)
		}
	})
	t.Run("template", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "pod.yaml")
		write(t, path, `apiVersion: v1
kind: Pod
metadata:
  generateName: pv-recycler-
  namespace: ignored
  labels: {team: storage}
spec:
  restartPolicy: Always
  containers:
  - name: scrub
    image: registry.example/scrubber:1
    volumeMounts: [{name: vol, mountPath: /data}]
  volumes:
  - name: scratch
    emptyDir: {}
  - name: vol
    hostPath: {path: /replaced}
`)
		tmpl, err := loadPodTemplate(path)
		if err != nil {
			t.Fatal(err)
		}
		rt := newReplica(t, "me", kc, j, nil, config{namespace: "recyclers", template: tmpl})
		p, err := rt.recyclerPod(v, rec)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case p.Name != "recycler-for-pv-1" || p.GenerateName != "" || p.Namespace != "recyclers":
			t.Errorf("pod %s/%s (%s)", p.Namespace, p.Name, p.GenerateName)
		case p.Spec.Containers[0].Image != "registry.example/scrubber:1" || p.Labels["team"] != "storage" || p.Labels[labelManagedBy] != managedBy:
			t.Errorf("template not kept: %+v %v", p.Spec.Containers[0], p.Labels)
		case p.Spec.Volumes[0].EmptyDir == nil || p.Spec.Volumes[1].HostPath.Path != "/tmp/volplane-unit/pv-1":
			t.Errorf("volumes %+v", p.Spec.Volumes)
		case p.Spec.RestartPolicy != corev1.RestartPolicyNever || *p.Spec.ActiveDeadlineSeconds != 300:
			t.Errorf("restart %s deadline %d", p.Spec.RestartPolicy, *p.Spec.ActiveDeadlineSeconds)
		}
		if tmpl.Name != "" || tmpl.Spec.Volumes[1].HostPath.Path != "/replaced" {
			t.Error("the template itself was changed")
		}
	})
}

func TestLoadPodTemplateErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, body, want string }{
		{"no vol", "kind: Pod\nspec:\n  containers: [{name: a, image: b}]\n", `no volume named "vol"`},
		{"no containers", "kind: Pod\nspec:\n  volumes: [{name: vol}]\n", "no containers"},
		{"not a pod", "kind: Deployment\n", "want Pod"},
		{"garbage", "{{{", "not a Pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			write(t, path, tc.body)
			if _, err := loadPodTemplate(path); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("loadPodTemplate = %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := loadPodTemplate(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing template loaded")
	}
}

// The default image is volplane's own, at this build's version, and its
// pod runs the reclaimer's scrub as root (busybox's runs as root too: a
// recycled volume's files belong to whoever wrote them).
func TestDefaultRecyclerPodIsVolplanes(t *testing.T) {
	if !strings.HasPrefix(DefaultRecyclerImage, "ghcr.io/volplane/volplane:") || strings.Contains(DefaultRecyclerImage, ":v") {
		t.Errorf("DefaultRecyclerImage %s, want ghcr.io/volplane/volplane:VERSION (no v, as make images tags)", DefaultRecyclerImage)
	}
	for _, image := range []string{DefaultRecyclerImage, "registry.corp.example:5000/mirror/volplane:0.1.0", "ghcr.io/volplane/volplane@sha256:0123"} {
		c := defaultRecyclerPod(image).Spec.Containers[0]
		sc := c.SecurityContext
		if !slices.Equal(c.Command, []string{"/usr/local/bin/reclaimer", "scrub", "/scrub"}) || len(c.Args) != 0 ||
			sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.RunAsGroup == nil || *sc.RunAsGroup != 0 {
			t.Errorf("%s: command %v args %v security %+v, want reclaimer scrub /scrub as root", image, c.Command, c.Args, sc)
		}
	}
	for _, image := range []string{"busybox:1.37", "docker.io/library/busybox:1.37", "ghcr.io/volplane/volplane-csi-sidecar:0.1.0", "volplane:0.1.0",
		"registry.example/volplane/scrubber:1", "localhost:5000/volplane-etcd"} {
		if c := defaultRecyclerPod(image).Spec.Containers[0]; !slices.Equal(c.Command, []string{"/bin/sh"}) || c.SecurityContext != nil {
			t.Errorf("%s: command %v, want Kubernetes' /bin/sh command as the image's user", image, c.Command)
		}
	}
}

// Scrub, the recycler pod's command, is scrubDir: it empties a directory
// and refuses what scrubDir refuses.
func TestScrub(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "a", "b"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".hidden"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Scrub(dir); err != nil {
		t.Fatal(err)
	}
	if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
		t.Errorf("left %v, %v", left, err)
	}
	for _, bad := range []string{"/", "relative", filepath.Join(dir, "missing")} {
		if err := Scrub(bad); err == nil {
			t.Errorf("Scrub(%q) succeeded", bad)
		}
	}
}
