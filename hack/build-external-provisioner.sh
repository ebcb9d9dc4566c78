#!/usr/bin/env bash
# Builds the CSI external-provisioner's csi-provisioner at the version
# hack/external-provisioner/go.mod pins, into OUT (for the side-by-side
# benchmark, make bench-external-provisioner).
#
#   hack/build-external-provisioner.sh v6.3.0 ~/.cache/volplane/csi-provisioner-v6.3.0
#
# Like k8s.io/kubernetes, the module replaces its k8s.io dependencies, so
# 'go install ...@version' refuses it; hack/external-provisioner is a
# throwaway module that requires it and carries the same replaces.
# A cold build takes a few minutes; progress is printed every 30 seconds.
set -euo pipefail
version=${1:?usage: $0 VERSION OUT}
out=${2:?usage: $0 VERSION OUT}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=cluster/lib.sh
source "$here/cluster/lib.sh"
want=$(sed -n 's/^require github.com\/kubernetes-csi\/external-provisioner\/v6 \(v[^ ]*\)$/\1/p' "$here/external-provisioner/go.mod")
if [[ "$want" != "$version" ]]; then
	echo "hack/external-provisioner/go.mod pins external-provisioner $want, not $version: update it first" >&2
	exit 1
fi
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp" "$tmp.log"' EXIT
log "building csi-provisioner $version into $out (a few minutes the first time)"
(
	cd "$here/external-provisioner"
	export CGO_ENABLED=0 GOFLAGS=-mod=mod
	with_progress "building csi-provisioner $version" "$tmp.log" \
		go build -v -trimpath -ldflags="-s -w" -o "$tmp" \
		github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner
)
mv "$tmp" "$out"
log "csi-provisioner: $out"
