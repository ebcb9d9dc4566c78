#!/usr/bin/env bash
# The kube-apiserver image docker-compose.yaml runs beside volplane's (a
# harness image: volplane ships no kube-apiserver, and make images builds
# no Kubernetes), packed FROM scratch by hack/ociimage from the cached
# static binary (make kube-apiserver) for the build host's platform and
# loaded into Docker as localhost/volplane-kube-apiserver:KUBE_VERSION.
#
#   hack/build-compose-image.sh KUBE_APISERVER_BINARY KUBE_VERSION
set -euo pipefail
apiserver=${1:?usage: $0 KUBE_APISERVER_BINARY KUBE_VERSION}
kube_version=${2:?usage: $0 KUBE_APISERVER_BINARY KUBE_VERSION}
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/.cache/compose-images"
if ! grep -q 'CGO_ENABLED=0' <(go version -m "$apiserver" 2>&1); then
	echo "$apiserver is not a static Go binary (CGO_ENABLED=0)" >&2
	exit 1
fi
if ! docker info >/dev/null 2>&1; then
	echo "no Docker daemon answers: run 'make docker-daemon' (installs docker.io and starts dockerd) first" >&2
	exit 1
fi
mkdir -p "$out"
(cd "$root" && go build -o "$out/" ./hack/ociimage)
"$out/ociimage" -name "localhost/volplane-kube-apiserver:$kube_version" -o "$out/kube-apiserver.tar" \
	-add "/usr/local/bin/kube-apiserver=$apiserver"
docker load -q -i "$out/kube-apiserver.tar"
