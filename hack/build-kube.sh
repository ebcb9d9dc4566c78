#!/usr/bin/env bash
# Builds the pinned Kubernetes commands from the k8s.io/kubernetes module
# at VERSION into DIR, all in one `go build` (they share most packages, so
# one build costs little more than kube-apiserver alone), and links
# DIR/../kube-apiserver-VERSION and DIR/../kube-controller-manager-VERSION,
# the paths the Makefile, the tests and `make up` use, to DIR's binaries.
#
#   hack/build-kube.sh v1.36.3 ~/.cache/volplane/kube-v1.36.3
#
# The commands: kube-apiserver, kube-controller-manager, kube-scheduler,
# kube-proxy, kubelet (make cluster) and kubectl, so that the cluster's
# scripts, tests and docs/install.md use the same version whatever kubectl
# the host has. DIR is built once; remove it to build again.
#
# `go install k8s.io/kubernetes/cmd/kube-apiserver@VERSION` does not work:
# k8s.io/kubernetes replaces every k8s.io staging module with a relative
# path. hack/kube-apiserver is a throwaway module that requires it and
# replaces each staging module with its published v0.x release instead.
# A cold build takes about 30 minutes and 1,500 CPU-seconds on 2 cores,
# and 3 GB of memory; progress is printed every 30 seconds.
set -euo pipefail

version=${1:?usage: $0 VERSION DIR}
dir=${2:?usage: $0 VERSION DIR}
commands=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)
here=$(cd "$(dirname "$0")" && pwd)
mod="$here/kube-apiserver"
# shellcheck source=cluster/lib.sh
source "$here/cluster/lib.sh"

want=$(sed -n 's/^require k8s.io\/kubernetes \(v[^ ]*\)$/\1/p' "$mod/go.mod")
if [[ "$want" != "$version" ]]; then
	echo "hack/kube-apiserver/go.mod pins k8s.io/kubernetes $want, not $version: update it first" >&2
	exit 1
fi

# link NAME: DIR/../NAME-VERSION becomes DIR/NAME, atomically (a test may be
# starting the old one right now; a rename never leaves the path missing).
link() {
	local to
	to="$(dirname "$dir")/$1-$version"
	[[ $to -ef $dir/$1 ]] && return 0
	ln -f "$dir/$1" "$to.tmp.$$"
	mv -f "$to.tmp.$$" "$to"
}

missing=()
for c in "${commands[@]}"; do
	[[ -x "$dir/$c" ]] || missing+=("$c")
done
if ((${#missing[@]} == 0)); then
	link kube-apiserver
	link kube-controller-manager
	exit 0
fi

minor=${version#v1.}
minor=${minor%%.*}
ldflags="-s -w"
for kv in "gitVersion=$version" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" \
	"buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
	ldflags+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
done

mkdir -p "$dir"
tmp="$dir.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
pkgs=()
for c in "${commands[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
log "building ${commands[*]} $version into $dir (about 30 minutes the first time)"
start=$SECONDS
(
	cd "$mod"
	export CGO_ENABLED=0 GOFLAGS=-mod=mod
	with_progress "building Kubernetes $version" "$tmp/build.log" \
		go build -v -trimpath -ldflags="$ldflags" -o "$tmp/" "${pkgs[@]}"
)
for c in "${commands[@]}"; do
	mv -f "$tmp/$c" "$dir/$c"
done
link kube-apiserver
link kube-controller-manager
log "kubernetes $version: ${commands[*]} in $dir ($(elapsed $((SECONDS - start))))"
