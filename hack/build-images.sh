#!/usr/bin/env bash
# Builds volplane's images FROM scratch, for several platforms, with no
# registry, no Docker and no Kubernetes build: the binaries are
# cross-compiled (CGO_ENABLED=0, GOARCH per platform) and hack/ociimage
# packs each image, a non-root user (65532), the build host's CA bundle
# and the binaries, as an OCI image layout tar holding one image index of
# every platform. `ctr -n k8s.io images import FILE` loads it into
# containerd (every platform); `docker load -i FILE` loads the build
# host's platform (the tar's manifest.json).
#
#   hack/build-images.sh VERSION
#
# hack/images.txt lists the images (the deploy tests read it too); each is
# ghcr.io/volplane/NAME:VERSION, and VERSION is the Makefile's for every
# image, etcd's included (its entrypoint volplane-etcd-member embeds the
# etcd go.mod pins; docs/configuration.md). PLATFORMS (default
# linux/amd64,linux/arm64) chooses the platforms. The tars are written to
# .cache/images/NAME.tar; when a Docker daemon answers, each is loaded into
# it too (docker-compose.yaml runs them). The last lines printed list each
# image, its platforms and its index digest.
set -euo pipefail
version=${1:?usage: $0 VERSION}
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/.cache/images"
platforms=${PLATFORMS:-linux/amd64,linux/arm64}
registry=ghcr.io/volplane
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

# The list: NAME ENTRYPOINT PACKAGE..., comments and blank lines skipped.
mapfile -t images < <(grep -v '^[[:space:]]*\(#\|$\)' "$root/hack/images.txt")
packages=()
for line in "${images[@]}"; do
	read -r _ _ pkgs <<<"$line"
	for p in $pkgs; do
		[[ " ${packages[*]} " == *" $p "* ]] || packages+=("$p")
	done
done

rm -rf "$out"
mkdir -p "$out/bin"
export CGO_ENABLED=0
# --version and the startup log line say which build runs (pkg/version).
ldflags="-s -w -X github.com/volplane/volplane/pkg/version.Version=v$version -X github.com/volplane/volplane/pkg/version.Commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
(cd "$root" && go build -o "$out/bin/" ./hack/ociimage)
IFS=, read -r -a plats <<<"$platforms"
for plat in "${plats[@]}"; do
	arch=${plat#linux/}
	mods=()
	for p in "${packages[@]}"; do
		if [[ -f "$root/$p/go.mod" ]]; then
			# A module of its own (hack/etcd: etcd's server, at go.mod's version).
			(cd "$root/$p" && GOOS=linux GOARCH=$arch GOFLAGS=-mod=mod go build -trimpath -ldflags='-s -w' -o "$out/bin/$arch/$(basename "$p")" .)
		else
			mods+=("$p")
		fi
	done
	(cd "$root" && GOOS=linux GOARCH=$arch go build -trimpath -ldflags="$ldflags" -o "$out/bin/$arch/" "${mods[@]}")
	echo "built the binaries for $plat" >&2
done

docker=false
docker info >/dev/null 2>&1 && docker=true
summary=()
for line in "${images[@]}"; do
	read -r name entrypoint pkgs <<<"$line"
	args=(-name "$registry/$name:$version" -o "$out/$name.tar" -platforms "$platforms"
		-dir /var/lib/volplane/etcd:65532:65532:0755 -dir /var/lib/volplane/csi:65532:65532:0755
		-dir /var/lib/volplane/csi-socket:65532:65532:0755 -dir /var/lib/etcd:65532:65532:0700)
	[[ $entrypoint == - ]] || args+=(-entrypoint "$entrypoint")
	for p in $pkgs; do
		b=$(basename "$p")
		args+=(-add "/usr/local/bin/$b=$out/bin/{arch}/$b")
	done
	read -r ref digest file plats_built < <("$out/bin/ociimage" "${args[@]}")
	if $docker; then
		docker load -q -i "$file" >/dev/null
	fi
	summary+=("$(printf '%-45s %-26s %s  %s' "$ref" "$plats_built" "${digest:0:19}" "${file#"$root"/}")")
done
printf '%-45s %-26s %s  %s\n' IMAGE PLATFORMS DIGEST FILE
printf '%s\n' "${summary[@]}"
if $docker; then
	echo "loaded into Docker (the build host's platform)"
else
	echo "no Docker daemon answers: not loaded into Docker (make docker-daemon starts one; docker load -i FILE)"
fi
