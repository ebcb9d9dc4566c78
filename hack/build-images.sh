#!/usr/bin/env bash
# Builds volplane's images FROM scratch, with no registry: static binaries
# (CGO_ENABLED=0) packed with a non-root user (65532) and the build host's
# CA certificates.
#
#   hack/build-images.sh VERSION KUBE_APISERVER_BINARY KUBE_VERSION
#
#   volplane:VERSION                  the services, the gateway, the dev CSI driver, the driver sidecar
#                                     (also ghcr.io/volplane/volplane:VERSION, the manifests' name)
#   volplane-csi-sidecar:VERSION      the same volplane-csi-sidecar with it as the ENTRYPOINT, so that a
#                                     driver's chart swaps csi-provisioner's image and keeps its args
#                                     (also ghcr.io/volplane/volplane-csi-sidecar:VERSION)
#   volplane-etcd:ETCD_VERSION        etcd itself, from hack/etcd (go.mod's etcd version), and
#                                     volplane-etcd-member and volplane-etcd-backup
#                                     (also ghcr.io/volplane/etcd:ETCD_VERSION, deploy/kubernetes')
#   volplane-kube-apiserver:KUBE_VERSION  the cached kube-apiserver (make kube-apiserver)
#
# The contexts are staged under .cache/images; the Dockerfile at the top
# of the tree is built in each.
set -euo pipefail
version=${1:?usage: $0 VERSION KUBE_APISERVER_BINARY KUBE_VERSION}
apiserver=${2:?usage: $0 VERSION KUBE_APISERVER_BINARY KUBE_VERSION}
kube_version=${3:?usage: $0 VERSION KUBE_APISERVER_BINARY KUBE_VERSION}
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/.cache/images"
certs=/etc/ssl/certs/ca-certificates.crt
etcd_version=$(sed -n 's/^\tgo.etcd.io\/etcd\/server\/v3 \(v[^ ]*\)$/\1/p' "$root/go.mod")
want=$(sed -n 's/^require go.etcd.io\/etcd\/server\/v3 \(v[^ ]*\)$/\1/p' "$root/hack/etcd/go.mod")
if [[ "$etcd_version" != "$want" ]]; then
	echo "hack/etcd/go.mod pins etcd $want, go.mod $etcd_version: make them agree first" >&2
	exit 1
fi
if [[ ! -r "$certs" ]]; then
	echo "$certs is missing: install Debian's ca-certificates (the images carry the build host's CA bundle)" >&2
	exit 1
fi
if ! docker info >/dev/null 2>&1; then
	echo "no Docker daemon answers: run 'make docker-daemon' (installs docker.io and starts dockerd) first" >&2
	exit 1
fi
# The legacy builder where BuildKit's buildx plugin is missing (Debian's
# docker.io); it builds FROM scratch just as well.
if ! docker buildx version >/dev/null 2>&1; then
	export DOCKER_BUILDKIT=0
fi

rm -rf "$out"
# stage NAME: an image context with the root filesystem every image shares.
stage() {
	local d="$out/$1"
	mkdir -p "$d/rootfs/etc/ssl/certs" "$d/rootfs/usr/local/bin" "$d/rootfs/tmp" "$d/data/etcd" "$d/data/csi" "$d/data/csi-socket"
	chmod 1777 "$d/rootfs/tmp"
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$d/rootfs/etc/passwd"
	printf 'root:x:0:\nnonroot:x:65532:\n' >"$d/rootfs/etc/group"
	cp "$certs" "$d/rootfs/etc/ssl/certs/ca-certificates.crt"
	cp "$root/Dockerfile" "$d/Dockerfile"
	echo "$d/rootfs/usr/local/bin"
}
build() { # NAME TAG...
	local log name=$1 tags=()
	shift
	for t in "$@"; do tags+=(-t "$t"); done
	if ! log=$(docker build -q "${tags[@]}" "$out/$name" 2>&1); then
		echo "$log" >&2
		exit 1
	fi
	echo "built $*" >&2
}

export CGO_ENABLED=0
# --version and the startup log line say which build runs (pkg/version).
ldflags="-s -w -X github.com/volplane/volplane/pkg/version.Version=v$version -X github.com/volplane/volplane/pkg/version.Commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
bin=$(stage volplane)
(cd "$root" && go build -trimpath -ldflags="$ldflags" -o "$bin/" \
	./services/watcher/cmd/watcher ./services/binder/cmd/binder ./services/provisioner/cmd/provisioner \
	./services/reclaimer/cmd/reclaimer ./gateway/cmd/gateway ./cmd/volplane-csi ./cmd/volplane-csi-sidecar)
build volplane "volplane:$version" "ghcr.io/volplane/volplane:$version"

# csi-provisioner's image runs csi-provisioner as its ENTRYPOINT and charts
# give only args: the sidecar's image does the same.
sidecar_bin=$(stage csi-sidecar)
cp "$bin/volplane-csi-sidecar" "$sidecar_bin/"
echo 'ENTRYPOINT ["/usr/local/bin/volplane-csi-sidecar"]' >>"$out/csi-sidecar/Dockerfile"
build csi-sidecar "volplane-csi-sidecar:$version" "ghcr.io/volplane/volplane-csi-sidecar:$version"

bin=$(stage etcd)
(cd "$root/hack/etcd" && GOFLAGS=-mod=mod go build -trimpath -ldflags='-s -w' -o "$bin/etcd" .)
# deploy/kubernetes runs volplane-etcd-member (etcd embedded, at go.mod's
# version) and volplane-etcd-backup from the same image.
(cd "$root" && go build -trimpath -ldflags="$ldflags" -o "$bin/" ./cmd/volplane-etcd-member ./cmd/volplane-etcd-backup)
build etcd "volplane-etcd:$etcd_version" "ghcr.io/volplane/etcd:$etcd_version"

bin=$(stage kube-apiserver)
if ! file_out=$(go version "$apiserver" 2>&1) || ! grep -q 'CGO_ENABLED=0' <(go version -m "$apiserver"); then
	echo "$apiserver is not a static Go binary (CGO_ENABLED=0): ${file_out}" >&2
	exit 1
fi
cp "$apiserver" "$bin/kube-apiserver"
build kube-apiserver "volplane-kube-apiserver:$kube_version"
