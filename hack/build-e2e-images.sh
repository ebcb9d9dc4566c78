#!/usr/bin/env bash
# Builds the images Kubernetes' storage e2e tests start (hack/e2e-storage.sh,
# make test-e2e-storage), FROM scratch, under the very names e2e.test asks
# for (k8s.io/kubernetes test/utils/image/manifest.go at KUBE_VERSION), so
# that no KUBE_TEST_REPO_LIST is needed and the tests' pods find them in
# the node's containerd (their imagePullPolicy is IfNotPresent: a tag that
# is not :latest):
#
#   registry.k8s.io/e2e-test-images/busybox:1.37.0-1   the default test image on Linux
#   registry.k8s.io/e2e-test-images/agnhost:2.63.0     pod helpers, subPath, exec checks
#   registry.k8s.io/e2e-test-images/nginx:1.15-4       only volumes' "should allow exec of files
#                                                      on the volume": it runs a shell script
#   registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0
#                                                      multiVolume's pods: a shell loop, and
#                                                      dd, sha256sum, base64 checks run in them
#
#   hack/build-e2e-images.sh            (VOLPLANE_CACHE, KUBE_VERSION as hack/cluster/lib.sh)
#
# busybox is Debian's busybox-static (a static binary: it runs FROM
# scratch), fetched with `apt-get download` and unpacked with dpkg-deb into
# the cache, not installed on the host; every applet it lists is a symbolic
# link to it, as in the busybox image. Debian 12 ships 1.35.0, not the
# 1.37.0 of the tag: the tests use POSIX shell and coreutils applets only.
# agnhost is built static (CGO_ENABLED=0) from the k8s.io/kubernetes
# module's test/images/agnhost, in a copy of hack/kube-apiserver as
# hack/build-e2e.sh builds e2e.test, and sits at /agnhost (its entrypoint,
# /agnhost-2 a link to it, as upstream's) beside busybox, which stands in
# for the alpine base's shell and tools. "nginx" is the busybox image under
# nginx's name: the one test in the storage suites that starts it only runs
# /bin/sh in it. "glibc-dns-testing" is the same busybox image under that
# name: multiVolume (testsuites/multivolume.go) starts its pods from it only
# for the shell and the coreutils applets (its DNS tools serve the DNS
# tests, not storage's); without it each multiVolume spec waits out the
# 5-minute pod start.
#
# The binaries are cached in $VOLPLANE_CACHE/e2e-images/; the images are
# packed every time into $VOLPLANE_CACHE/cluster-images/e2e/NAME.tar with
# images.txt listing "TAR REF" per line, which hack/e2e-storage.sh imports
# into the running cluster's containerd.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=cluster/lib.sh
source "$here/cluster/lib.sh"

e2e_cache=$cache/e2e-images
e2e_images=$images_dir/e2e
kube_module=/k8s.io/kubernetes@$KUBE_VERSION
e2e_registry=registry.k8s.io/e2e-test-images
busybox_ref=$e2e_registry/busybox:1.37.0-1
nginx_ref=$e2e_registry/nginx:1.15-4
glibc_ref=$e2e_registry/glibc-dns-testing:2.0.0

# busybox: $e2e_cache/busybox-VERSION/bin/busybox, from Debian's
# busybox-static package; sets busybox.
fetch_busybox() {
	local version tmp
	version=$(apt-cache policy busybox-static 2>/dev/null | sed -n 's/^ *Candidate: \(.*\)$/\1/p')
	[[ -n $version && $version != "(none)" ]] || die "apt-cache knows no busybox-static: run apt-get update"
	busybox=$e2e_cache/busybox-${version//:/_}/bin/busybox
	[[ -x $busybox ]] && return 0
	tmp=$(mktemp -d)
	chmod 755 "$tmp" # apt-get download writes as the _apt user
	(cd "$tmp" && apt-get download "busybox-static=$version" >/dev/null)
	dpkg-deb -x "$tmp"/busybox-static_*.deb "$tmp/root"
	[[ -x $tmp/root/bin/busybox ]] || die "busybox-static $version has no /bin/busybox"
	mkdir -p "$(dirname "$busybox")"
	cp "$tmp/root/bin/busybox" "$busybox.tmp"
	mv -f "$busybox.tmp" "$busybox"
	rm -rf "$tmp"
	log "busybox: Debian's busybox-static $version at $busybox"
}

# build_agnhost: $e2e_cache/agnhost-VERSION, static; sets agnhost and
# agnhost_version (the module's test/images/agnhost/VERSION).
build_agnhost() {
	local dir mod
	dir=$(go env GOMODCACHE)$kube_module
	if [[ ! -f $dir/test/images/agnhost/VERSION ]]; then
		(cd "$here/kube-apiserver" && go mod download "k8s.io/kubernetes@$KUBE_VERSION")
	fi
	agnhost_version=$(<"$dir/test/images/agnhost/VERSION")
	agnhost=$e2e_cache/agnhost-$agnhost_version
	[[ -x $agnhost ]] && return 0
	mod=$(mktemp -d)
	cp "$here/kube-apiserver/go.mod" "$here/kube-apiserver/go.sum" "$mod/"
	(cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod with_progress "building agnhost $agnhost_version" "$e2e_cache/agnhost.build.log" \
		go build -v -trimpath -ldflags="-s -w" -o "$agnhost.tmp" k8s.io/kubernetes/test/images/agnhost)
	mv -f "$agnhost.tmp" "$agnhost"
	rm -rf "$mod" "$e2e_cache/agnhost.build.log"
}

# applet_links: -symlink flags for every applet busybox has, each a link
# to /bin/busybox (but /bin/busybox itself).
applet_links() {
	local p
	"$busybox" --list-full | sort -u | while read -r p; do
		[[ $p == bin/busybox ]] || printf -- '-symlink\n/%s=/bin/busybox\n' "$p"
	done
}

# pack NAME REF ARGS...: the image REF in $e2e_images/NAME.tar, root as
# upstream's test images, busybox and its applets in it.
pack() {
	local name=$1 ref=$2
	shift 2
	mapfile -t links < <(applet_links)
	"$oci" -name "$ref" -o "$e2e_images/$name.tar" -user 0:0 -add "/bin/busybox=$busybox" "${links[@]}" "$@" >/dev/null
	echo "$e2e_images/$name.tar $ref" >>"$e2e_images/images.txt.tmp"
}

main() {
	mkdir -p "$e2e_cache" "$e2e_images"
	step "busybox (Debian's busybox-static)" fetch_busybox
	step "agnhost (k8s.io/kubernetes $KUBE_VERSION test/images/agnhost)" build_agnhost
	oci=$e2e_cache/ociimage
	(cd "$root" && go build -trimpath -o "$oci" ./hack/ociimage)
	rm -f "$e2e_images/images.txt.tmp"
	pack busybox "$busybox_ref" -cmd sh
	pack nginx "$nginx_ref" -cmd sh
	pack glibc-dns-testing "$glibc_ref" -cmd sh
	pack agnhost "$e2e_registry/agnhost:$agnhost_version" -add "/agnhost=$agnhost" -symlink /agnhost-2=agnhost \
		-dir /uploads -entrypoint /agnhost -cmd pause
	mv -f "$e2e_images/images.txt.tmp" "$e2e_images/images.txt"
	log "e2e images: $e2e_images ($(wc -l <"$e2e_images/images.txt") images)"
	sed 's/^/    /' "$e2e_images/images.txt" >&2
}

main "$@"
