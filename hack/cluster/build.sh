#!/usr/bin/env bash
# Builds every part of the local cluster (make cluster) that is not a
# Debian package, each pinned and cached outside the tree:
#
#   kube        kube-apiserver, kube-controller-manager, kube-scheduler,
#               kube-proxy, kubelet, kubectl (hack/build-kube.sh)
#   containerd  containerd, containerd-shim-runc-v2 and ctr from the Go module
#   etcd        etcd from hack/etcd (the control plane's, and the etcd image's)
#   coredns     CoreDNS with a minimal plugin set from hack/coredns
#   images      the image tarballs, FROM scratch (hack/ociimage): pause,
#               volplane, etcd, coredns, workload, volplane-csi-sidecar
#   sidecars    the upstream CSI sidecars and their images, for a driver
#               deployed as vendors ship them (hack/build-csi-sidecars.sh);
#               only when asked: make test-cluster
#   prev        volplane:VERSION-prev, the previous release's services
#               (hack/prev-release) built from git history and packed as
#               volplane's image, once; only when asked: make test-cluster
#
#   hack/cluster/build.sh [PART...]     (default: every part but sidecars, prev)
#
# The versioned parts are built once; the images are packed again each time
# (the volplane binaries come from the working tree; an unchanged input
# gives the same digest).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

export CGO_ENABLED=0

build_kube() {
	"$root/hack/build-kube.sh" "$KUBE_VERSION" "$kube_dir"
}

build_containerd() {
	local bins=(containerd containerd-shim-runc-v2 ctr) b missing=0 tmp
	for b in "${bins[@]}"; do [[ -x "$containerd_dir/$b" ]] || missing=1; done
	((missing)) || return 0
	tmp=$(mktemp -d "$cache/containerd.XXXXXX")
	# shellcheck disable=SC2064
	trap "rm -rf '$tmp'" RETURN
	local pkgs=()
	for b in "${bins[@]}"; do pkgs+=("github.com/containerd/containerd/v2/cmd/$b@$CONTAINERD_VERSION"); done
	# The tags leave out the snapshotters that need cgo or host tools.
	GOBIN=$tmp with_progress "building containerd $CONTAINERD_VERSION" "$tmp/build.log" \
		go install -v -trimpath -ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
		-tags "no_btrfs no_devmapper no_zfs" "${pkgs[@]}"
	mkdir -p "$containerd_dir"
	for b in "${bins[@]}"; do mv -f "$tmp/$b" "$containerd_dir/$b"; done
}

# build_module DIR OUT: the main package of a throwaway module under hack/.
build_module() {
	local dir=$1 out=$2
	[[ -x "$out" ]] && return 0
	(cd "$dir" && GOFLAGS=-mod=mod with_progress "building $(basename "$out")" "$out.build.log" \
		go build -v -trimpath -ldflags='-s -w' -o "$out.tmp" .)
	mv -f "$out.tmp" "$out"
	rm -f "$out.build.log"
}

build_sidecars() { "$root/hack/build-csi-sidecars.sh"; }

build_etcd() { build_module "$root/hack/etcd" "$etcd_bin"; }
build_coredns() { build_module "$root/hack/coredns" "$coredns_bin"; }

build_images() {
	local bin=$images_dir/bin ca=/etc/ssl/certs/ca-certificates.crt
	[[ -r $ca ]] || die "$ca is missing: install Debian's ca-certificates (the images carry the host's CA bundle)"
	[[ -x $etcd_bin ]] || build_etcd
	[[ -x $coredns_bin ]] || build_coredns
	mkdir -p "$bin"
	local commit
	commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
	(cd "$root" && go build -trimpath -o "$bin/" \
		-ldflags="-s -w -X github.com/volplane/volplane/pkg/version.Version=v${VERSION:-0.0.0-dev} -X github.com/volplane/volplane/pkg/version.Commit=$commit" \
		./services/watcher/cmd/watcher ./services/binder/cmd/binder ./services/provisioner/cmd/provisioner \
		./services/reclaimer/cmd/reclaimer ./gateway/cmd/gateway ./cmd/volplane-csi ./cmd/volplane-csi-sidecar \
		./cmd/volplane-etcd-member ./cmd/volplane-etcd-backup \
		./hack/pause ./test/cluster/workload ./hack/ociimage)
	local oci=$bin/ociimage
	# Each image is a list of -add DEST=SRC and -dir PATH:UID:GID:MODE: add a
	# binary to an image by adding a line.
	"$oci" -name "$pause_image" -o "$images_dir/pause.tar" -base=false -user 65535:65535 \
		-entrypoint /pause -add "/pause=$bin/pause"
	"$oci" -name "$volplane_image" -o "$images_dir/volplane.tar" \
		-add "/usr/local/bin/watcher=$bin/watcher" \
		-add "/usr/local/bin/binder=$bin/binder" \
		-add "/usr/local/bin/provisioner=$bin/provisioner" \
		-add "/usr/local/bin/reclaimer=$bin/reclaimer" \
		-add "/usr/local/bin/gateway=$bin/gateway" \
		-add "/usr/local/bin/volplane-csi=$bin/volplane-csi" \
		-add "/usr/local/bin/volplane-csi-sidecar=$bin/volplane-csi-sidecar" \
		-dir /var/lib/volplane/etcd:65532:65532:0755 \
		-dir /var/lib/volplane/csi:65532:65532:0755 \
		-dir /var/lib/volplane/csi-socket:65532:65532:0755
	# volplane's etcd (deploy/kubernetes: docs/etcd.md): its entrypoint
	# volplane-etcd-member embeds etcd; etcd itself for docker-compose.
	"$oci" -name "$etcd_image" -o "$images_dir/etcd.tar" \
		-add "/usr/local/bin/volplane-etcd-member=$bin/volplane-etcd-member" \
		-add "/usr/local/bin/volplane-etcd-backup=$bin/volplane-etcd-backup" \
		-add "/usr/local/bin/etcd=$etcd_bin" \
		-dir /var/lib/etcd:65532:65532:0700
	# The sidecar as its entrypoint: a driver's chart gives the container
	# csi-provisioner's args only (docs/sidecar.md).
	"$oci" -name "$sidecar_image" -o "$images_dir/volplane-csi-sidecar.tar" \
		-entrypoint /usr/local/bin/volplane-csi-sidecar -add "/usr/local/bin/volplane-csi-sidecar=$bin/volplane-csi-sidecar"
	"$oci" -name "$coredns_image" -o "$images_dir/coredns.tar" \
		-entrypoint /coredns -add "/coredns=$coredns_bin"
	# Root, like the busybox of upstream tests, so that it writes into a
	# volume whoever owns it; a test that wants otherwise sets runAsUser.
	"$oci" -name "$workload_image" -o "$images_dir/workload.tar" -user 0:0 \
		-entrypoint /usr/local/bin/volplane-workload -add "/usr/local/bin/volplane-workload=$bin/workload"
}

# build_prev: the previous release's five services, built from git
# history (hack/build-prev.sh, static as every binary here, cached in
# $images_dir/bin-prev) and packed as volplane's image, tagged $prev_image,
# into volplane-prev.tar; packed again only when the commit or the tag
# changed. A clone without that commit (a shallow one) gets no such image,
# and says so.
build_prev() {
	local oci=$images_dir/bin/ociimage prev=$images_dir/bin-prev tar=$images_dir/volplane-prev.tar rc=0
	"$root/hack/build-prev.sh" "$prev_commit" "$prev" || rc=$?
	if ((rc == 3)); then
		rm -f "$tar" "$tar.stamp"
		echo "no image $prev_image: the clone lacks the previous release $prev_commit" >&2
		return 0
	fi
	((rc == 0)) || die "hack/build-prev.sh $prev_commit failed"
	local stamp
	stamp="$(cat "$prev/commit") $prev_image"
	if [[ -f $tar && -f $tar.stamp && "$(cat "$tar.stamp")" == "$stamp" ]]; then
		echo "image $prev_image: cached in $tar"
		return 0
	fi
	[[ -x $oci ]] || (cd "$root" && go build -o "$images_dir/bin/" ./hack/ociimage)
	rm -f "$tar.stamp"
	"$oci" -name "$prev_image" -o "$tar" \
		-add "/usr/local/bin/watcher=$prev/watcher" \
		-add "/usr/local/bin/binder=$prev/binder" \
		-add "/usr/local/bin/provisioner=$prev/provisioner" \
		-add "/usr/local/bin/reclaimer=$prev/reclaimer" \
		-add "/usr/local/bin/gateway=$prev/gateway" \
		-dir /var/lib/volplane/etcd:65532:65532:0755 \
		-dir /var/lib/volplane/csi:65532:65532:0755 \
		-dir /var/lib/volplane/csi-socket:65532:65532:0755
	echo "$stamp" >"$tar.stamp"
}

parts=("$@")
((${#parts[@]})) || parts=(kube containerd etcd coredns images)
mkdir -p "$cache"
for p in "${parts[@]}"; do
	case $p in
	kube | containerd | etcd | coredns | images | sidecars | prev) step "build $p" "build_$p" ;;
	*) die "unknown part $p (kube, containerd, etcd, coredns, images, sidecars, prev)" ;;
	esac
done
