package oci

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// readTar returns every member of a tar file by name.
func readTar(t *testing.T, r io.Reader) (map[string][]byte, map[string]*tar.Header) {
	t.Helper()
	data, hdrs := map[string][]byte{}, map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return data, hdrs
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		data[h.Name], hdrs[h.Name] = b, h
	}
}

func sum(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }

func testOptions(t *testing.T) Options {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(bin, []byte("#!binary"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, []byte("CA BUNDLE"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Options{
		Name: "ghcr.io/volplane/tool:1.2.3", Out: filepath.Join(dir, "tool.tar"),
		Base: true, CABundle: ca,
		Files:      []File{{Path: "/usr/local/bin/tool", Source: bin, Mode: 0o755}},
		Dirs:       []Dir{{Path: "/var/lib/volplane/etcd", UID: NonRootUID, GID: NonRootUID, Mode: 0o700}},
		Links:      []Link{{Path: "/bin/tool", Target: "/usr/local/bin/tool"}},
		Entrypoint: []string{"/usr/local/bin/tool"}, Cmd: []string{"serve"},
		User: "65532:65532", WorkingDir: "/",
	}
}

// TestWriteLayout reads the image back as an importer would: index to
// manifest to config and layer, each blob checked against its digest.
func TestWriteLayout(t *testing.T) {
	o := testOptions(t)
	digest, err := Write(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(o.Out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files, _ := readTar(t, f)
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout: %s", files["oci-layout"])
	}
	var index imageIndex
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("index: %d manifests", len(index.Manifests))
	}
	md := index.Manifests[0]
	if md.Digest != digest || md.Annotations[AnnotationImageName] != o.Name || md.Annotations[AnnotationRefName] != "1.2.3" {
		t.Errorf("index manifest %+v, want digest %s and the name's annotations", md, digest)
	}
	blob := func(d descriptor) []byte {
		t.Helper()
		b, ok := files[blobName(d.Digest)]
		if !ok {
			t.Fatalf("blob %s missing", d.Digest)
		}
		if sum(b) != d.Digest || int64(len(b)) != d.Size {
			t.Fatalf("blob %s: digest %s, size %d (want %d)", d.Digest, sum(b), len(b), d.Size)
		}
		return b
	}
	var man imageManifest
	if err := json.Unmarshal(blob(md), &man); err != nil {
		t.Fatal(err)
	}
	var cfg imageConfig
	if err := json.Unmarshal(blob(man.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	if len(man.Layers) != 1 || len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != man.Layers[0].Digest {
		t.Fatalf("layers %+v, diff_ids %v: want one uncompressed layer whose diff_id is its digest", man.Layers, cfg.RootFS.DiffIDs)
	}
	if got := strings.Join(cfg.Config.Entrypoint, " "); got != "/usr/local/bin/tool" || cfg.Config.User != "65532:65532" ||
		strings.Join(cfg.Config.Cmd, " ") != "serve" || !hasKey(cfg.Config.Env, "PATH") || cfg.OS != "linux" {
		t.Errorf("config %+v", cfg)
	}

	layer, hdrs := readTar(t, strings.NewReader(string(blob(man.Layers[0]))))
	for _, c := range []struct {
		name     string
		typ      byte
		mode     int64
		uid      int
		contents string
	}{
		{"etc/", tar.TypeDir, 0o755, 0, ""},
		{"etc/passwd", tar.TypeReg, 0o644, 0, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"},
		{"etc/ssl/certs/ca-certificates.crt", tar.TypeReg, 0o644, 0, "CA BUNDLE"},
		{"tmp/", tar.TypeDir, 0o1777, 0, ""},
		{"usr/local/bin/tool", tar.TypeReg, 0o755, 0, "#!binary"},
		{"var/lib/volplane/etcd/", tar.TypeDir, 0o700, NonRootUID, ""},
		{"var/lib/volplane/", tar.TypeDir, 0o755, 0, ""},
		{"bin/tool", tar.TypeSymlink, 0o777, 0, ""},
		{"bin/", tar.TypeDir, 0o755, 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, ok := hdrs[c.name]
			if !ok {
				t.Fatalf("missing from the layer")
			}
			if h.Typeflag != c.typ || h.Mode != c.mode || h.Uid != c.uid || h.Gid != c.uid || string(layer[c.name]) != c.contents {
				t.Errorf("type %c mode %o uid %d gid %d %q", h.Typeflag, h.Mode, h.Uid, h.Gid, layer[c.name])
			}
			if want := map[string]string{"bin/tool": "/usr/local/bin/tool"}[c.name]; h.Linkname != want {
				t.Errorf("link target %q, want %q", h.Linkname, want)
			}
			if !h.ModTime.Equal(hdrs["etc/"].ModTime) || h.Uname != "" {
				t.Errorf("host details leak: mtime %v uname %q", h.ModTime, h.Uname)
			}
		})
	}
}

func TestWriteIsDeterministic(t *testing.T) {
	o := testOptions(t)
	first, err := Write(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	a, err := os.ReadFile(o.Out)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Write(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(o.Out)
	if err != nil {
		t.Fatal(err)
	}
	if first != second || sum(a) != sum(b) {
		t.Errorf("two writes differ: %s, %s", first, second)
	}
}

// TestWriteRefuses tries to get past each check of the options.
func TestWriteRefuses(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(*Options)
		want   string
	}{
		{"short name", func(o *Options) { o.Name = "volplane:0.1.0" }, "not fully qualified"},
		{"no registry host", func(o *Options) { o.Name = "volplane/volplane:0.1.0" }, "not fully qualified"},
		{"no tag", func(o *Options) { o.Name = "ghcr.io/volplane/volplane" }, "no tag"},
		{"port but no tag", func(o *Options) { o.Name = "localhost:5000/volplane" }, "no tag"},
		{"upper case", func(o *Options) { o.Name = "ghcr.io/Volplane/volplane:1" }, "lower case"},
		{"relative path", func(o *Options) { o.Files[0].Path = "usr/local/bin/tool" }, "clean absolute path"},
		{"unclean path", func(o *Options) { o.Files[0].Path = "/usr/../etc/passwd" }, "clean absolute path"},
		{"root", func(o *Options) { o.Dirs[0].Path = "/" }, "clean absolute path"},
		{"twice", func(o *Options) { o.Files[0].Path = "/etc/passwd" }, "twice"},
		{"file as parent", func(o *Options) { o.Dirs[0].Path = "/etc/passwd/x" }, "is a file and the parent"},
		{"link without target", func(o *Options) { o.Links[0].Target = "" }, "no target"},
		{"link over a file", func(o *Options) { o.Links[0].Path = "/usr/local/bin/tool" }, "twice"},
		{"link as parent", func(o *Options) { o.Dirs[0].Path = "/bin/tool/x" }, "is a file and the parent"},
		{"unclean link path", func(o *Options) { o.Links[0].Path = "/bin/../tool" }, "clean absolute path"},
		{"missing source", func(o *Options) { o.Files[0].Source = "/nonexistent" }, "no such file"},
		{"no CA bundle", func(o *Options) { o.CABundle = "" }, "CA bundle"},
		{"platform without arch", func(o *Options) { o.Platforms = []string{"linux/"} }, "want linux/ARCH"},
		{"another OS", func(o *Options) { o.Platforms = []string{"windows/amd64"} }, "want linux/ARCH"},
		{"platform twice", func(o *Options) { o.Platforms = []string{"linux/amd64", "linux/amd64"} }, "given twice"},
		{"placeholder left", func(o *Options) { o.Platforms = []string{"linux/{arch}"} }, "want linux/ARCH"},
		{"missing arch build", func(o *Options) {
			o.Platforms, o.Files[0].Source = []string{"linux/amd64", "linux/arm64"}, filepath.Join(filepath.Dir(o.Files[0].Source), "{arch}", "tool")
		}, "no such file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := testOptions(t)
			c.change(&o)
			_, err := Write(t.Context(), o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
			if _, serr := os.Stat(o.Out); serr == nil {
				t.Errorf("%s was written", o.Out)
			}
		})
	}
}

func TestParseDir(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Dir
		err  bool
	}{
		{"/data", Dir{Path: "/data", Mode: 0o755}, false},
		{"/data:65532:65532", Dir{Path: "/data", UID: 65532, GID: 65532, Mode: 0o755}, false},
		{"/data:65532:65532:0700", Dir{Path: "/data", UID: 65532, GID: 65532, Mode: 0o700}, false},
		{"/data:65532", Dir{}, true},
		{"/data:x:1", Dir{}, true},
		{"/data:1:1:999", Dir{}, true},
	} {
		t.Run(c.in, func(t *testing.T) {
			got, err := ParseDir(c.in)
			if (err != nil) != c.err || (!c.err && got != c.want) {
				t.Fatalf("ParseDir = %+v, %v", got, err)
			}
		})
	}
}

// TestWriteIndex writes two platforms, each with its own binary, and reads
// them back as containerd does (index.json: one image, an index of one
// manifest per platform) and as docker load does (manifest.json: the build
// host's platform, tagged).
func TestWriteIndex(t *testing.T) {
	o := testOptions(t)
	dir := filepath.Dir(o.Files[0].Source)
	for _, arch := range []string{"amd64", "arm64"} {
		if err := os.MkdirAll(filepath.Join(dir, arch), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, arch, "tool"), []byte("binary for "+arch), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	o.Platforms = []string{"linux/amd64", "linux/arm64"}
	o.Files[0].Source = filepath.Join(dir, ArchPlaceholder, "tool")
	digest, err := Write(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(o.Out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files, _ := readTar(t, f)
	blob := func(d string, into any) []byte {
		t.Helper()
		b, ok := files[blobName(d)]
		if !ok || sum(b) != d {
			t.Fatalf("blob %s missing or corrupt", d)
		}
		if into != nil {
			if err := json.Unmarshal(b, into); err != nil {
				t.Fatal(err)
			}
		}
		return b
	}
	var top, index imageIndex
	if err := json.Unmarshal(files["index.json"], &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != MediaTypeIndex || top.Manifests[0].Digest != digest ||
		top.Manifests[0].Annotations[AnnotationImageName] != o.Name {
		t.Fatalf("index.json %+v: want one named image index %s", top, digest)
	}
	blob(digest, &index)
	configs := map[string]string{}
	for i, m := range index.Manifests {
		var man imageManifest
		var cfg imageConfig
		blob(m.Digest, &man)
		blob(man.Config.Digest, &cfg)
		layer, _ := readTar(t, strings.NewReader(string(blob(man.Layers[0].Digest, nil))))
		arch := o.Platforms[i][len("linux/"):]
		if m.Platform == nil || m.Platform.Architecture != arch || cfg.Architecture != arch || cfg.OS != "linux" ||
			string(layer["usr/local/bin/tool"]) != "binary for "+arch {
			t.Errorf("manifest %d: platform %+v, config %s/%s, binary %q: want %s's", i, m.Platform, cfg.OS, cfg.Architecture, layer["usr/local/bin/tool"], arch)
		}
		configs[arch] = blobName(man.Config.Digest)
	}
	var load []dockerImage
	if err := json.Unmarshal(files["manifest.json"], &load); err != nil {
		t.Fatal(err)
	}
	want := configs[runtime.GOARCH]
	if want == "" {
		want = configs["amd64"]
	}
	if len(load) != 1 || load[0].Config != want || len(load[0].RepoTags) != 1 || load[0].RepoTags[0] != o.Name {
		t.Errorf("manifest.json %+v: want the host's platform (config %s) tagged %s", load, want, o.Name)
	}
}
