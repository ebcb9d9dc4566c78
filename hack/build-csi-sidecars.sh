#!/usr/bin/env bash
# Builds the upstream Kubernetes CSI sidecars a vendor's driver chart runs,
# each from its pinned module, and packs each into an image FROM scratch
# under the name the charts use, for the local cluster
# (deploy/drivers/volplane-csi, make test-cluster):
#
#   csi-provisioner      external-provisioner/v6 v6.3.0 (hack/build-external-provisioner.sh)
#   csi-attacher         external-attacher/v4 v4.12.0
#   csi-resizer          external-resizer/v2 v2.2.0
#   csi-snapshotter      external-snapshotter/v8 v8.5.0
#   snapshot-controller  external-snapshotter/v8 v8.5.0
#
#   hack/build-csi-sidecars.sh            (VOLPLANE_CACHE, VERSION as hack/cluster/lib.sh)
#
# Each binary is built once into $VOLPLANE_CACHE/csi-sidecars/NAME-VERSION
# (static, CGO_ENABLED=0, one `go build` at a time, about 2 minutes each
# cold), with `GOFLAGS=-mod=mod go build ./cmd/NAME` in a writable copy of
# the downloaded module: like k8s.io/kubernetes, these modules replace
# their k8s.io dependencies, so `go install MODULE@VERSION` refuses them.
# external-snapshotter's go.mod replaces its client/v8 module with ./client,
# a directory its module zip does not ship: the replace is dropped, so the
# client/v8 version its go.mod requires is used, from the module proxy.
#
# The snapshot CRDs (VolumeSnapshot, VolumeSnapshotContent,
# VolumeSnapshotClass) ship in that client/v8 module's config/crd; they are
# copied into $VOLPLANE_CACHE/csi-sidecars/snapshot-crds-CLIENTVERSION/
# (and the link snapshot-crds to it) for `kubectl apply -f`: the very CRDs
# the controller is compiled against. Only the .yaml files: kubectl apply
# -f DIR reads nothing else.
#
# The images (registry.k8s.io/sig-storage/NAME:VERSION, entrypoint /NAME,
# user 65532 as upstream's distroless images) are packed every time into
# $images_dir/csi-sidecars/NAME.tar with images.txt listing "TAR REF" per
# line; hack/cluster/up.sh imports them when VOLPLANE_CSI_SIDECARS=1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=cluster/lib.sh
source "$here/cluster/lib.sh"

export CGO_ENABLED=0
sidecar_cache=$cache/csi-sidecars
sidecar_images=$images_dir/csi-sidecars
provisioner_version=$(sed -n 's/^require github.com\/kubernetes-csi\/external-provisioner\/v6 \(v[^ ]*\)$/\1/p' "$here/external-provisioner/go.mod")
# NAME MODULE VERSION, one per binary.
sidecars=(
	"csi-attacher github.com/kubernetes-csi/external-attacher/v4 v4.12.0"
	"csi-resizer github.com/kubernetes-csi/external-resizer/v2 v2.2.0"
	"csi-snapshotter github.com/kubernetes-csi/external-snapshotter/v8 v8.5.0"
	"snapshot-controller github.com/kubernetes-csi/external-snapshotter/v8 v8.5.0"
)
snapshotter_module=github.com/kubernetes-csi/external-snapshotter/v8@v8.5.0
snapshot_client=github.com/kubernetes-csi/external-snapshotter/client/v8

# module_dir MODULE@VERSION: the module's directory in the module cache,
# downloaded if needed.
module_dir() {
	(cd "$sidecar_cache" && go mod download -json "$1") | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
}

# module_src MODULE VERSION: a writable copy of the module's source, made
# once, with external-snapshotter's replace of its client dropped.
module_src() {
	local module=$1 version=$2 dir src
	src=$sidecar_cache/src/$(basename "$(dirname "$module")")-$version
	if [[ ! -f $src/.complete ]]; then
		dir=$(module_dir "$module@$version")
		[[ -n $dir ]] || die "go mod download $module@$version gave no directory"
		rm -rf "$src" "$src.tmp"
		mkdir -p "$(dirname "$src")"
		cp -r "$dir" "$src.tmp"
		chmod -R u+w "$src.tmp"
		if grep -q "^replace $snapshot_client => " "$src.tmp/go.mod"; then
			(cd "$src.tmp" && go mod edit -dropreplace "$snapshot_client")
		fi
		touch "$src.tmp/.complete"
		mv "$src.tmp" "$src"
	fi
	echo "$src"
}

# build_sidecar NAME MODULE VERSION: the static binary, once.
build_sidecar() {
	local name=$1 module=$2 version=$3 out src
	out=$sidecar_cache/$name-$version
	[[ -x $out ]] && return 0
	src=$(module_src "$module" "$version")
	(cd "$src" && GOFLAGS=-mod=mod with_progress "building $name $version" "$out.build.log" \
		go build -v -trimpath -ldflags="-s -w -X main.version=$version" -o "$out.tmp" "./cmd/$name")
	mv -f "$out.tmp" "$out"
	rm -f "$out.build.log"
}

build_provisioner() {
	local out=$cache/csi-provisioner-$provisioner_version
	[[ -x $out ]] || "$here/build-external-provisioner.sh" "$provisioner_version" "$out"
}

# snapshot_crds: the three VolumeSnapshot CRDs from the client/v8 module
# external-snapshotter's go.mod requires.
snapshot_crds() {
	local version dir out f
	version=$(sed -n "s|^\t$snapshot_client \(v[^ ]*\).*|\1|p" "$(module_src github.com/kubernetes-csi/external-snapshotter/v8 v8.5.0)/go.mod")
	[[ -n $version ]] || die "$snapshotter_module's go.mod requires no $snapshot_client"
	out=$sidecar_cache/snapshot-crds-$version
	ln -sfn "snapshot-crds-$version" "$sidecar_cache/snapshot-crds"
	[[ -f $out/.complete ]] && return 0
	dir=$(module_dir "$snapshot_client@$version")
	rm -rf "$out" && mkdir -p "$out"
	for f in volumesnapshotclasses volumesnapshotcontents volumesnapshots; do
		[[ -f $dir/config/crd/snapshot.storage.k8s.io_$f.yaml ]] || die "$snapshot_client@$version has no config/crd/snapshot.storage.k8s.io_$f.yaml"
		cp "$dir/config/crd/snapshot.storage.k8s.io_$f.yaml" "$out/"
	done
	chmod -R u+w "$out"
	touch "$out/.complete"
	log "snapshot CRDs from $snapshot_client@$version: $out"
}

# pack NAME VERSION BINARY: registry.k8s.io/sig-storage/NAME:VERSION, as
# upstream's image: the binary at /NAME, its entrypoint, a non-root user.
pack() {
	local name=$1 version=$2 bin=$3 ref
	ref=registry.k8s.io/sig-storage/$name:$version
	"$oci" -name "$ref" -o "$sidecar_images/$name.tar" -entrypoint "/$name" -add "/$name=$bin"
	echo "$sidecar_images/$name.tar $ref" >>"$sidecar_images/images.txt.tmp"
}

main() {
	mkdir -p "$sidecar_cache" "$sidecar_images"
	build_provisioner
	local s name module version
	for s in "${sidecars[@]}"; do
		read -r name module version <<<"$s"
		step "build $name $version" build_sidecar "$name" "$module" "$version"
	done
	snapshot_crds
	oci=$sidecar_cache/ociimage
	(cd "$root" && go build -trimpath -o "$oci" ./hack/ociimage)
	rm -f "$sidecar_images/images.txt.tmp"
	pack csi-provisioner "$provisioner_version" "$cache/csi-provisioner-$provisioner_version"
	for s in "${sidecars[@]}"; do
		read -r name module version <<<"$s"
		pack "$name" "$version" "$sidecar_cache/$name-$version"
	done
	mv -f "$sidecar_images/images.txt.tmp" "$sidecar_images/images.txt"
	log "sidecar images: $sidecar_images ($(wc -l <"$sidecar_images/images.txt") images)"
}

main "$@"
