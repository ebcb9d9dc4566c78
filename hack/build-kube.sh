#!/usr/bin/env bash
# Builds a Kubernetes command (default kube-apiserver) at VERSION from the
# k8s.io/kubernetes module into OUT.
#
#   hack/build-kube.sh v1.36.3 ~/.cache/volplane/kube-apiserver-v1.36.3
#   hack/build-kube.sh v1.36.3 ~/.cache/volplane/kube-controller-manager-v1.36.3 kube-controller-manager
#
# `go install k8s.io/kubernetes/cmd/kube-apiserver@VERSION` does not work:
# k8s.io/kubernetes replaces every k8s.io staging module with a relative
# path. hack/kube-apiserver is a throwaway module that requires it and
# replaces each staging module with its published v0.x release instead.
# The build takes about 15 minutes and 2 GB of memory on 2 cores, so the
# Makefile caches OUT outside the tree, keyed by version.
set -euo pipefail

version=${1:?usage: $0 VERSION OUT [COMMAND]}
out=${2:?usage: $0 VERSION OUT [COMMAND]}
cmd=${3:-kube-apiserver}
case "$cmd" in
kube-apiserver | kube-controller-manager) ;;
*) echo "$0: COMMAND must be kube-apiserver or kube-controller-manager, got $cmd" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
mod="$here/kube-apiserver"

want=$(sed -n 's/^require k8s.io\/kubernetes \(v[^ ]*\)$/\1/p' "$mod/go.mod")
if [[ "$want" != "$version" ]]; then
	echo "hack/kube-apiserver/go.mod pins k8s.io/kubernetes $want, not $version: update it first" >&2
	exit 1
fi

minor=${version#v1.}
minor=${minor%%.*}
ldflags="-s -w"
for kv in "gitVersion=$version" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" \
	"buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
	ldflags+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
done

mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
echo "building $cmd $version into $out (about 15 minutes the first time)..." >&2
(cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags="$ldflags" -o "$tmp" "k8s.io/kubernetes/cmd/$cmd")
mv "$tmp" "$out"
trap - EXIT
echo "$cmd $version: $out" >&2
