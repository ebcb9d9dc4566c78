#!/usr/bin/env bash
# Builds Kubernetes' end-to-end test binary, e2e.test, from the
# k8s.io/kubernetes module at KUBE_VERSION into
# $VOLPLANE_CACHE/e2e-KUBE_VERSION/e2e.test, once (remove it to build
# again), for hack/e2e-storage.sh (make test-e2e-storage):
#
#   hack/build-e2e.sh            (VOLPLANE_CACHE, KUBE_VERSION as hack/cluster/lib.sh)
#
# As hack/build-kube.sh, the build runs in hack/kube-apiserver, the module
# that requires k8s.io/kubernetes and replaces its staging modules with
# their published releases; here in a copy of it, since `go test -c` with
# GOFLAGS=-mod=mod adds the test-only requirements (ginkgo, gomega, ...)
# to its go.mod and go.sum, which the checked-in module must not carry.
# `go test -c` builds a package outside the main module: its _test.go
# files are compiled too. About 5 minutes on 2 idle cores once
# hack/build-kube.sh's packages are in the build cache (6m12s on this
# loaded machine). The progress lines give the time only: go test -c
# names no package as it compiles.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=cluster/lib.sh
source "$here/cluster/lib.sh"

e2e_dir=$cache/e2e-$KUBE_VERSION
out=$e2e_dir/e2e.test

want=$(sed -n 's/^require k8s.io\/kubernetes \(v[^ ]*\)$/\1/p' "$here/kube-apiserver/go.mod")
[[ $want == "$KUBE_VERSION" ]] || die "hack/kube-apiserver/go.mod pins k8s.io/kubernetes $want, not $KUBE_VERSION: update it first"

if [[ -x $out ]]; then
	log "e2e.test $KUBE_VERSION: $out (cached)"
	exit 0
fi

minor=${KUBE_VERSION#v1.}
minor=${minor%%.*}
ldflags="-s -w"
for kv in "gitVersion=$KUBE_VERSION" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean"; do
	ldflags+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
done

mkdir -p "$e2e_dir"
mod=$e2e_dir/mod.tmp.$$
trap 'rm -rf "$mod"' EXIT
rm -rf "$mod" && mkdir -p "$mod"
cp "$here/kube-apiserver/go.mod" "$here/kube-apiserver/go.sum" "$here/kube-apiserver/tools.go" "$mod/"
log "building e2e.test $KUBE_VERSION into $out (about 5 minutes, more the first time)"
start=$SECONDS
(
	cd "$mod"
	export CGO_ENABLED=0 GOFLAGS=-mod=mod
	with_progress "building e2e.test $KUBE_VERSION" "$e2e_dir/build.log" \
		go test -c -trimpath -ldflags="$ldflags" -o "$out.tmp" k8s.io/kubernetes/test/e2e
)
mv -f "$out.tmp" "$out"
rm -f "$e2e_dir/build.log"
log "e2e.test $KUBE_VERSION: $out ($(elapsed $((SECONDS - start))))"
