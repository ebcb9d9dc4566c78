// Package oci writes a single-layer image built FROM scratch as an OCI
// image layout packed in a tar file: the format `ctr images import` and
// other OCI tools load without a registry or a Docker daemon.
//
// The layer is an uncompressed tar whose entries are sorted and carry no
// time stamps, user names or host ownership, so that the same inputs always
// give the same digests.
package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The media types of what Write produces.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// The index annotations naming the image: containerd's importer takes the
// full reference from AnnotationImageName, other tools the tag from
// AnnotationRefName.
const (
	AnnotationImageName = "io.containerd.image.name"
	AnnotationRefName   = "org.opencontainers.image.ref.name"
)

// NonRootUID is the user (and group) the base's /etc/passwd names nonroot,
// as in distroless images.
const NonRootUID = 65532

// File is a file of the build host copied into the image.
type File struct {
	// Path is the absolute path in the image.
	Path string
	// Source is the file on the build host.
	Source string
	// Mode is the file's permission bits (0755 for a binary).
	Mode fs.FileMode
}

// Dir is an empty directory in the image.
type Dir struct {
	// Path is the absolute path in the image.
	Path string
	// UID and GID own the directory.
	UID, GID int
	// Mode is the directory's permission bits.
	Mode fs.FileMode
}

// Link is a symbolic link in the image.
type Link struct {
	// Path is the link's absolute path in the image.
	Path string
	// Target is what it points to, as the link holds it (absolute or
	// relative to the link's directory).
	Target string
}

// Options describes the image Write produces.
type Options struct {
	// Name is the image's fully qualified reference with a tag, e.g.
	// ghcr.io/volplane/volplane:0.1.0 (the kubelet asks the runtime for
	// exactly this name).
	Name string
	// Out is the tar file written (replaced atomically).
	Out string
	// Base adds /etc/passwd and /etc/group (root and nonroot, 65532), the
	// CA bundle CABundle at /etc/ssl/certs/ca-certificates.crt and an
	// empty /tmp with mode 1777.
	Base bool
	// CABundle is the build host's CA bundle (required with Base).
	CABundle string
	// Files and Dirs are the rest of the root filesystem; missing parent
	// directories are added root-owned with mode 0755.
	Files []File
	Dirs  []Dir
	// Links are symbolic links (a multi-call binary's applets: busybox's
	// /bin/sh -> /bin/busybox).
	Links []Link
	// Entrypoint, Cmd, Env, User and WorkingDir are the image config's.
	// Env gains a PATH when it has none.
	Entrypoint, Cmd, Env []string
	User, WorkingDir     string
	// Platforms are the OS/ARCH pairs built (linux/amd64, linux/arm64), one
	// manifest each under one image index; empty: the build host's
	// architecture alone. A File's Source may hold ArchPlaceholder, replaced
	// by each platform's architecture (bin/{arch}/binder).
	Platforms []string
}

// ArchPlaceholder in a File's Source stands for the platform's
// architecture (GOARCH).
const ArchPlaceholder = "{arch}"

// platforms parses o.Platforms (validated) or gives the host's.
func (o Options) platforms() []platform {
	if len(o.Platforms) == 0 {
		return []platform{{Architecture: runtime.GOARCH, OS: "linux"}}
	}
	var ps []platform
	for _, s := range o.Platforms {
		osName, arch, _ := strings.Cut(s, "/")
		ps = append(ps, platform{Architecture: arch, OS: osName})
	}
	return ps
}

// forArch is o with ArchPlaceholder in its files' sources replaced.
func (o Options) forArch(arch string) Options {
	files := make([]File, len(o.Files))
	for i, f := range o.Files {
		f.Source = strings.ReplaceAll(f.Source, ArchPlaceholder, arch)
		files[i] = f
	}
	o.Files = files
	return o
}

// ParseDir parses PATH[:UID:GID[:MODE]] (MODE in octal; the defaults are
// root and 0755).
func ParseDir(s string) (Dir, error) {
	parts := strings.Split(s, ":")
	d := Dir{Path: parts[0], Mode: 0o755}
	if len(parts) != 1 && len(parts) != 3 && len(parts) != 4 {
		return d, fmt.Errorf("directory %q: want PATH[:UID:GID[:MODE]]", s)
	}
	var err error
	if len(parts) >= 3 {
		if d.UID, err = strconv.Atoi(parts[1]); err != nil {
			return d, fmt.Errorf("directory %q: uid: %w", s, err)
		}
		if d.GID, err = strconv.Atoi(parts[2]); err != nil {
			return d, fmt.Errorf("directory %q: gid: %w", s, err)
		}
	}
	if len(parts) == 4 {
		m, err := strconv.ParseUint(parts[3], 8, 32)
		if err != nil {
			return d, fmt.Errorf("directory %q: mode: %w", s, err)
		}
		d.Mode = fs.FileMode(m)
	}
	return d, nil
}

// entry is one member of the layer: a directory, or a file with its
// content from Source or Data.
type entry struct {
	dir      bool
	mode     fs.FileMode
	uid, gid int
	source   string
	data     []byte
	// link is a symbolic link's target ("": not a link).
	link string
}

func (o Options) validate() error {
	var errs []error
	if err := checkName(o.Name); err != nil {
		errs = append(errs, err)
	}
	if o.Out == "" {
		errs = append(errs, errors.New("no output file"))
	}
	if o.Base && o.CABundle == "" {
		errs = append(errs, errors.New("the base needs a CA bundle"))
	}
	for _, f := range o.Files {
		if f.Source == "" {
			errs = append(errs, fmt.Errorf("file %s: no source", f.Path))
		}
	}
	seen := map[string]bool{}
	for _, p := range o.Platforms {
		osName, arch, ok := strings.Cut(p, "/")
		switch {
		case !ok || osName != "linux" || arch == "" || strings.ContainsAny(arch, "/{} "):
			errs = append(errs, fmt.Errorf("platform %q: want linux/ARCH", p))
		case seen[p]:
			errs = append(errs, fmt.Errorf("platform %s given twice", p))
		}
		seen[p] = true
	}
	return errors.Join(errs...)
}

// checkName accepts a reference with a registry host (a first component
// with a dot or a port, or localhost) and a tag: the runtime would
// otherwise complete a short name to docker.io/library/NAME:latest and miss
// the imported image.
func checkName(name string) error {
	if name == "" {
		return errors.New("no image name")
	}
	repo, tag := splitTag(name)
	host, rest, ok := strings.Cut(repo, "/")
	switch {
	case tag == "":
		return fmt.Errorf("image name %q has no tag", name)
	case !ok || rest == "" || !(strings.ContainsAny(host, ".:") || host == "localhost"):
		return fmt.Errorf("image name %q is not fully qualified (want HOST/REPOSITORY:TAG)", name)
	case repo != strings.ToLower(repo):
		return fmt.Errorf("image name %q: the repository must be lower case", name)
	}
	return nil
}

// splitTag splits REPOSITORY:TAG; a colon before the last slash is a
// registry port, not a tag.
func splitTag(name string) (repo, tag string) {
	colon := strings.LastIndex(name, ":")
	if colon < strings.LastIndex(name, "/") {
		return name, ""
	}
	return name[:colon], name[colon+1:]
}

// cleanPath turns an absolute image path into a tar member name.
func cleanPath(p string) (string, error) {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return "", fmt.Errorf("path %q: want a clean absolute path below /", p)
	}
	return p[1:], nil
}

// tree builds the layer's members, keyed by tar name.
func (o Options) tree() (map[string]*entry, error) {
	members := map[string]*entry{}
	add := func(p string, e *entry) error {
		name, err := cleanPath(p)
		if err != nil {
			return err
		}
		if _, dup := members[name]; dup {
			return fmt.Errorf("path %s is in the image twice", p)
		}
		members[name] = e
		return nil
	}
	if o.Base {
		ca, err := os.ReadFile(o.CABundle)
		if err != nil {
			return nil, fmt.Errorf("CA bundle: %w", err)
		}
		uid := strconv.Itoa(NonRootUID)
		passwd := "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:" + uid + ":" + uid + ":nonroot:/home/nonroot:/sbin/nologin\n"
		group := "root:x:0:\nnonroot:x:" + uid + ":\n"
		for _, f := range []struct {
			p string
			e *entry
		}{
			{"/etc/passwd", &entry{mode: 0o644, data: []byte(passwd)}},
			{"/etc/group", &entry{mode: 0o644, data: []byte(group)}},
			{"/etc/ssl/certs/ca-certificates.crt", &entry{mode: 0o644, data: ca}},
			{"/tmp", &entry{dir: true, mode: 0o1777}},
		} {
			if err := add(f.p, f.e); err != nil {
				return nil, err
			}
		}
	}
	for _, f := range o.Files {
		st, err := os.Stat(f.Source)
		if err != nil {
			return nil, err
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%s: not a regular file", f.Source)
		}
		if err := add(f.Path, &entry{mode: f.Mode, source: f.Source}); err != nil {
			return nil, err
		}
	}
	for _, d := range o.Dirs {
		if err := add(d.Path, &entry{dir: true, mode: d.Mode, uid: d.UID, gid: d.GID}); err != nil {
			return nil, err
		}
	}
	for _, l := range o.Links {
		if l.Target == "" {
			return nil, fmt.Errorf("link %s has no target", l.Path)
		}
		if err := add(l.Path, &entry{mode: 0o777, link: l.Target}); err != nil {
			return nil, err
		}
	}
	// Parents: root-owned 0755 directories; a file cannot be a parent.
	for name := range members {
		for p := path.Dir(name); p != "."; p = path.Dir(p) {
			if e, ok := members[p]; ok {
				if !e.dir {
					return nil, fmt.Errorf("/%s is a file and the parent of /%s", p, name)
				}
				continue
			}
			members[p] = &entry{dir: true, mode: 0o755}
		}
	}
	return members, nil
}

// Write writes the image described by o to o.Out and returns the digest
// of what the name points to (sha256:...): the image's manifest, or with
// several platforms the image index that lists one manifest per platform.
// The tar also holds a manifest.json, so that `docker load` (which reads
// no OCI index before Docker 25) loads the platform of the build host, or
// the first platform where the host's is not built.
func Write(ctx context.Context, o Options) (string, error) {
	if err := o.validate(); err != nil {
		return "", err
	}
	dir := filepath.Dir(o.Out)
	out, err := os.CreateTemp(dir, ".image-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	tw := &layout{Writer: tar.NewWriter(out), seen: map[string]bool{}}
	for _, name := range []string{"blobs/", "blobs/sha256/"} {
		if err := writeMember(tw, name, nil); err != nil {
			return "", err
		}
	}
	var manifests []descriptor
	var load dockerImage
	for _, p := range o.platforms() {
		man, img, err := o.writeImage(ctx, tw, p)
		if err != nil {
			return "", fmt.Errorf("%s: %w", p, err)
		}
		manifests = append(manifests, man)
		if load.Config == "" || p.Architecture == runtime.GOARCH {
			load = img
		}
	}
	top, err := writeTop(tw, o.Name, manifests)
	if err != nil {
		return "", err
	}
	load.RepoTags = []string{o.Name}
	dockerManifest, err := json.Marshal([]dockerImage{load})
	if err != nil {
		return "", err
	}
	if err := writeMember(tw, "manifest.json", dockerManifest); err != nil {
		return "", err
	}
	if err := writeMember(tw, "oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := out.Close(); err != nil {
		return "", err
	}
	if err := os.Chmod(out.Name(), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(out.Name(), o.Out); err != nil {
		return "", err
	}
	return top, nil
}

// writeTop writes index.json naming the image: with one platform it points
// to that manifest (as before several platforms were written); with more,
// to an image index blob listing them, so that an importer names one image
// whatever the platform (containerd takes the name from index.json's
// entries: two entries with one name would be two images, the last kept).
func writeTop(tw *layout, name string, manifests []descriptor) (string, error) {
	_, tag := splitTag(name)
	annotations := map[string]string{AnnotationImageName: name, AnnotationRefName: tag}
	top := manifests[0]
	if len(manifests) > 1 {
		idx, err := json.Marshal(imageIndex{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: manifests})
		if err != nil {
			return "", err
		}
		top = descriptor{MediaType: MediaTypeIndex, Digest: digestBytes(idx), Size: int64(len(idx))}
		if err := tw.blob(top, bytes.NewReader(idx)); err != nil {
			return "", err
		}
	}
	top.Annotations = annotations
	index, err := json.Marshal(imageIndex{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []descriptor{top}})
	if err != nil {
		return "", err
	}
	return top.Digest, writeMember(tw, "index.json", index)
}

// writeImage writes one platform's layer, config and manifest blobs and
// returns the manifest's descriptor and the image as docker load finds it.
func (o Options) writeImage(ctx context.Context, tw *layout, p platform) (descriptor, dockerImage, error) {
	members, err := o.forArch(p.Architecture).tree()
	if err != nil {
		return descriptor{}, dockerImage{}, err
	}
	layer, err := os.CreateTemp(filepath.Dir(o.Out), ".layer-*")
	if err != nil {
		return descriptor{}, dockerImage{}, err
	}
	defer os.Remove(layer.Name())
	defer layer.Close()
	h := sha256.New()
	if err := writeLayer(ctx, io.MultiWriter(layer, h), members); err != nil {
		return descriptor{}, dockerImage{}, fmt.Errorf("layer: %w", err)
	}
	layerDesc := descriptor{MediaType: MediaTypeLayer, Digest: digestOf(h), Size: size(layer)}
	env := o.Env
	if !hasKey(env, "PATH") {
		env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, env...)
	}
	cfg, err := json.Marshal(imageConfig{
		Architecture: p.Architecture,
		OS:           p.OS,
		Config: execConfig{
			User: o.User, Entrypoint: o.Entrypoint, Cmd: o.Cmd, Env: env, WorkingDir: o.WorkingDir,
		},
		RootFS:  rootFS{Type: "layers", DiffIDs: []string{layerDesc.Digest}},
		History: []history{{CreatedBy: "volplane hack/ociimage"}},
	})
	if err != nil {
		return descriptor{}, dockerImage{}, err
	}
	cfgDesc := descriptor{MediaType: MediaTypeConfig, Digest: digestBytes(cfg), Size: int64(len(cfg))}
	manifest, err := json.Marshal(imageManifest{
		SchemaVersion: 2, MediaType: MediaTypeManifest, Config: cfgDesc, Layers: []descriptor{layerDesc},
	})
	if err != nil {
		return descriptor{}, dockerImage{}, err
	}
	manDesc := descriptor{MediaType: MediaTypeManifest, Digest: digestBytes(manifest), Size: int64(len(manifest)), Platform: &p}
	for _, b := range []struct {
		digest string
		data   []byte
	}{{cfgDesc.Digest, cfg}, {manDesc.Digest, manifest}} {
		if err := tw.blob(descriptor{Digest: b.digest, Size: int64(len(b.data))}, bytes.NewReader(b.data)); err != nil {
			return descriptor{}, dockerImage{}, err
		}
	}
	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return descriptor{}, dockerImage{}, err
	}
	if err := tw.blob(layerDesc, layer); err != nil {
		return descriptor{}, dockerImage{}, err
	}
	return manDesc, dockerImage{Config: blobName(cfgDesc.Digest), Layers: []string{blobName(layerDesc.Digest)}}, nil
}

func writeLayer(ctx context.Context, w io.Writer, members map[string]*entry) error {
	names := make([]string, 0, len(members))
	for n := range members {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		e := members[n]
		if e.dir {
			hdr := header(n+"/", e.mode, 0)
			hdr.Typeflag, hdr.Uid, hdr.Gid = tar.TypeDir, e.uid, e.gid
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			continue
		}
		if e.link != "" {
			hdr := header(n, e.mode, 0)
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.link
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			continue
		}
		if e.source == "" {
			hdr := header(n, e.mode, int64(len(e.data)))
			hdr.Uid, hdr.Gid = e.uid, e.gid
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := tw.Write(e.data); err != nil {
				return err
			}
			continue
		}
		if err := copyFile(tw, n, e); err != nil {
			return err
		}
	}
	return tw.Close()
}

func copyFile(tw *tar.Writer, name string, e *entry) error {
	f, err := os.Open(e.source)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	hdr := header(name, e.mode, st.Size())
	hdr.Uid, hdr.Gid = e.uid, e.gid
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(tw, f)
	if err != nil {
		return fmt.Errorf("%s: %w", e.source, err)
	}
	if n != st.Size() {
		return fmt.Errorf("%s changed while it was copied", e.source)
	}
	return nil
}

// header is a regular file's header with nothing of the build host in it.
func header(name string, mode fs.FileMode, size int64) *tar.Header {
	// 0o1000 is how callers write the sticky bit of /tmp (1777).
	m := int64(mode.Perm())
	if mode&fs.ModeSticky != 0 || mode&0o1000 != 0 {
		m |= 0o1000
	}
	return &tar.Header{
		Typeflag: tar.TypeReg, Name: name, Mode: m, Size: size,
		ModTime: time.Unix(0, 0).UTC(), Format: tar.FormatPAX,
	}
}

// layout is the tar of an image layout; it writes each blob once (two
// platforms' layers are one blob when their files are the same).
type layout struct {
	*tar.Writer
	seen map[string]bool
}

func (l *layout) blob(d descriptor, r io.Reader) error {
	if l.seen[d.Digest] {
		return nil
	}
	l.seen[d.Digest] = true
	if err := l.WriteHeader(header(blobName(d.Digest), 0o644, d.Size)); err != nil {
		return err
	}
	_, err := io.Copy(l, r)
	return err
}

func writeMember(tw *layout, name string, data []byte) error {
	if strings.HasSuffix(name, "/") {
		hdr := header(name, 0o755, 0)
		hdr.Typeflag = tar.TypeDir
		return tw.WriteHeader(hdr)
	}
	if err := tw.WriteHeader(header(name, 0o644, int64(len(data)))); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func size(f *os.File) int64 {
	off, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return -1
	}
	return off
}

func hasKey(env []string, key string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			return true
		}
	}
	return false
}

func digestOf(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }
func digestBytes(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }
func blobName(digest string) string {
	return "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:")
}

// The OCI image-spec documents, only the fields Write sets.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// dockerImage is an entry of manifest.json, the file docker load reads.
type dockerImage struct {
	Config   string
	RepoTags []string
	Layers   []string
}

type imageIndex struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type imageManifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type imageConfig struct {
	Architecture string     `json:"architecture"`
	OS           string     `json:"os"`
	Config       execConfig `json:"config"`
	RootFS       rootFS     `json:"rootfs"`
	History      []history  `json:"history"`
}

type execConfig struct {
	User       string   `json:"User,omitempty"`
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	Env        []string `json:"Env,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type history struct {
	CreatedBy string `json:"created_by"`
}
