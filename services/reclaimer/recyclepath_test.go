package reclaimer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// Every way a volume's path could get the node-local recycler to scrub a
// directory outside the allowed prefixes.
func TestAllowedPathRefusesEscapes(t *testing.T) {
	base := t.TempDir()
	data := filepath.Join(base, "data")
	for _, d := range []string{"data/v1", "data/v2/nested", "database/v", "etc", "linked-root/v"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, name string) string {
		p := filepath.Join(base, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	outside := link(filepath.Join(base, "etc"), "data/out")         // a volume dir linking outside
	inside := link(filepath.Join(base, "data", "v1"), "data/alias") // linking inside
	root := link(filepath.Join(base, "data"), "data-link")          // the prefix through a link
	up := link("..", "data/up")                                     // a relative link climbing out
	prefixes := []string{data}
	for _, tc := range []struct {
		name, path string
		prefixes   []string
		want       string // resolved path, or the error
	}{
		{"below", filepath.Join(data, "v1"), prefixes, filepath.Join(data, "v1")},
		{"deeper", filepath.Join(data, "v2", "nested"), prefixes, filepath.Join(data, "v2", "nested")},
		{"unclean but below", data + "//v2/./nested/../nested", prefixes, filepath.Join(data, "v2", "nested")},
		{"a link to inside", inside, prefixes, filepath.Join(data, "v1")},
		{"through a linked prefix", filepath.Join(root, "v1"), prefixes, filepath.Join(data, "v1")},
		{"a prefix given through a link", filepath.Join(data, "v1"), []string{root}, filepath.Join(data, "v1")},
		{"no prefixes", filepath.Join(data, "v1"), nil, "--recycle-path-prefixes"},
		{"the prefix itself", data, prefixes, "is not below any of"},
		{"the prefix with a slash", data + "/", prefixes, "is not below any of"},
		{"dot-dot escape", filepath.Join(data, "v1") + "/../../etc", prefixes, "is not below any of"},
		{"dot-dot to the prefix", data + "/v1/..", prefixes, "is not below any of"},
		{"prefix without the slash", filepath.Join(base, "database", "v"), prefixes, "is not below any of"},
		{"a volume dir linking outside", outside, prefixes, "resolves to"},
		{"a relative link climbing out", filepath.Join(up, "etc"), prefixes, "resolves to"},
		{"relative", "data/v1", prefixes, "not absolute"},
		{"missing", filepath.Join(data, "gone"), prefixes, "no such file"},
		{"root", "/", prefixes, "is not below any of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := allowedPath(tc.path, tc.prefixes)
			if strings.HasPrefix(tc.want, "/") {
				if err != nil || got != tc.want {
					t.Fatalf("allowedPath(%q) = %q, %v; want %q", tc.path, got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("allowedPath(%q) = %q, %v; want an error with %q", tc.path, got, err, tc.want)
			}
		})
	}
}

func TestRecyclePathPrefixesOption(t *testing.T) {
	for _, tc := range []struct {
		prefixes []string
		want     string
	}{
		{[]string{"/srv/volumes", "/data"}, ""},
		{[]string{"relative/dir"}, `"relative/dir" is not absolute`},
		{[]string{"/"}, `"/" would let any directory be scrubbed`},
		{[]string{"/srv/.."}, `"/" would let any directory be scrubbed`},
	} {
		err := checkPrefixes(tc.prefixes)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--recycle-path-prefixes")) {
			t.Errorf("checkPrefixes(%q) = %v, want %q", tc.prefixes, err, tc.want)
		}
	}
}

// A hostPath volume outside the prefixes fails its reclaim with
// VolumeFailedRecycle naming the flag, and keeps its data.
func TestNodeLocalRecycleOutsideThePrefixes(t *testing.T) {
	for name, prefixes := range map[string][]string{"none": {}, "elsewhere": {filepath.Join(os.TempDir(), "volplane-nowhere")}} {
		t.Run(name, func(t *testing.T) {
			kc, j := newFakeCluster(), newFakeJournal()
			r := newReplica(t, "me", kc, j, nil, config{mode: RecycleNodeLocal, nodeName: "node-a", prefixes: prefixes})
			dir := t.TempDir()
			write(t, filepath.Join(dir, "keep"), "x")
			v := releasedPV("hp", corev1.PersistentVolumeReclaimRecycle, withHostPath(dir))
			kc.addPV(v)
			r.start(t, v)
			rec := r.step(t, "hp")
			if rec.State != reclaimerv1.State_STATE_FAILED || !strings.Contains(rec.Message, "--recycle-path-prefixes") {
				t.Fatalf("record %v", rec)
			}
			if len(r.scrubs) != 0 || len(files(t, dir)) != 1 {
				t.Fatalf("scrubbed %v", r.scrubs)
			}
			if got := kc.pv("hp"); got.Status.Phase != corev1.VolumeFailed {
				t.Errorf("phase %s", got.Status.Phase)
			}
			if events := r.drain(); !hasEvent(events, "Warning VolumeFailedRecycle Recycle failed: ") {
				t.Errorf("events %q", events)
			}
		})
	}
}

func FuzzAllowedPath(f *testing.F) {
	for _, s := range []string{"/x/data/v", "/x/data", "/x/data/../etc", "/x/database/v", "data/v", "", "/", "/x/data/./v/..", "/x/data//v", "/x/data/v\x00", "/x/data/\xff"} {
		f.Add(s)
	}
	base := f.TempDir()
	data := filepath.Join(base, "data")
	for _, d := range []string{"data/v", "database/v", "etc"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(base, "etc"), filepath.Join(data, "out")); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, p string) {
		// Seeds are written for the prefix /x; they are tried under base.
		if rest, ok := strings.CutPrefix(p, "/x"); ok {
			p = base + rest
		}
		got, err := allowedPath(p, []string{data})
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, data+"/") || got == data {
			t.Fatalf("allowedPath(%q) allowed %q, not below %q", p, got, data)
		}
		if resolved, err := filepath.EvalSymlinks(got); err != nil || resolved != got {
			t.Fatalf("allowed %q resolves further to %q (%v)", got, resolved, err)
		}
	})
}

func FuzzBelow(f *testing.F) {
	for _, s := range [][2]string{{"/data/v", "/data"}, {"/data", "/data"}, {"/database", "/data"}, {"/data/../etc", "/data"}, {"/", "/"}, {"/a/..b", "/a"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, path, dir string) {
		if !filepath.IsAbs(path) || !filepath.IsAbs(dir) {
			return
		}
		path, dir = filepath.Clean(path), filepath.Clean(dir)
		want := path != dir && strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
		if got := below(path, dir); got != want {
			t.Fatalf("below(%q, %q) = %v, want %v", path, dir, got, want)
		}
	})
}
