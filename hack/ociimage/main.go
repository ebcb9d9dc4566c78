// Command ociimage packs files into a single-layer container image built
// FROM scratch and writes it as an OCI image layout in a tar file, which
// `ctr -n k8s.io images import` loads into containerd with no registry and
// no Docker daemon (hack/cluster/images.sh).
//
//	ociimage -name ghcr.io/volplane/pause:0.1.0 -o pause.tar \
//	    -entrypoint /pause -add /pause=bin/pause
//
// With -platforms linux/amd64,linux/arm64 it writes one image index with a
// manifest per platform; {arch} in an -add source stands for the
// platform's architecture (-add /usr/local/bin/binder=bin/{arch}/binder).
// The tar carries a manifest.json too, which `docker load` reads: it loads
// the build host's platform.
//
// The root filesystem is a base (with -base, the default: /etc/passwd and
// /etc/group with root and the non-root user 65532, the build host's CA
// bundle at /etc/ssl/certs/ca-certificates.crt, an empty /tmp with mode
// 1777) plus each -add file (root-owned, mode 0755), each -dir and each
// -symlink. The
// output is deterministic: the same inputs give the same digests, so a
// re-import is a no-op.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/volplane/volplane/hack/ociimage/oci"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var o oci.Options
	var adds, dirs, links, env list
	var entrypoint, cmd, platforms string
	flag.StringVar(&o.Name, "name", "", "the image's fully qualified reference, e.g. ghcr.io/volplane/volplane:0.1.0 (required)")
	flag.StringVar(&o.Out, "o", "", "the tar file to write (required)")
	flag.BoolVar(&o.Base, "base", true, "add /etc/passwd, /etc/group, the CA bundle and /tmp")
	flag.StringVar(&o.CABundle, "ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "the CA bundle copied with -base")
	flag.Var(&adds, "add", "DEST=SRC: a file of the build host added as DEST, root-owned, mode 0755 (repeatable)")
	flag.Var(&dirs, "dir", "PATH[:UID:GID[:MODE]]: an empty directory, e.g. /var/lib/volplane/etcd:65532:65532:0700 (repeatable)")
	flag.Var(&links, "symlink", "DEST=TARGET: a symbolic link DEST pointing to TARGET (repeatable)")
	flag.StringVar(&entrypoint, "entrypoint", "", "the image's entrypoint, comma-separated")
	flag.StringVar(&cmd, "cmd", "", "the image's default arguments, comma-separated")
	flag.StringVar(&o.User, "user", "65532:65532", "the user the image runs as")
	flag.StringVar(&o.WorkingDir, "workdir", "/", "the working directory")
	flag.Var(&env, "env", "KEY=VALUE in the image's environment (repeatable)")
	flag.StringVar(&platforms, "platforms", "", "comma-separated OS/ARCH built, e.g. linux/amd64,linux/arm64 (default: linux and the build host's architecture); {arch} in an -add source is each one's GOARCH")
	flag.Parse()

	o.Entrypoint = split(entrypoint)
	o.Cmd = split(cmd)
	o.Env = env
	o.Platforms = split(platforms)
	for _, a := range adds {
		dest, src, ok := strings.Cut(a, "=")
		if !ok {
			fail(fmt.Errorf("-add %q: want DEST=SRC", a))
		}
		o.Files = append(o.Files, oci.File{Path: dest, Source: src, Mode: 0o755})
	}
	for _, l := range links {
		dest, target, ok := strings.Cut(l, "=")
		if !ok {
			fail(fmt.Errorf("-symlink %q: want DEST=TARGET", l))
		}
		o.Links = append(o.Links, oci.Link{Path: dest, Target: target})
	}
	for _, d := range dirs {
		dir, err := oci.ParseDir(d)
		if err != nil {
			fail(err)
		}
		o.Dirs = append(o.Dirs, dir)
	}

	// An interrupt stops the write and removes the partial tar.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	digest, err := oci.Write(ctx, o)
	if err != nil {
		fail(err)
	}
	built := platforms
	if built == "" {
		built = "linux/" + runtime.GOARCH
	}
	fmt.Printf("%s %s %s %s\n", o.Name, digest, o.Out, built)
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "ociimage:", err)
	os.Exit(1)
}
