#!/usr/bin/env bash
# Builds the services of a previous release (watcher, binder, provisioner,
# reclaimer, gateway) from this clone's git history into OUT, once: the
# skew matrix (make test-skew, test/e2e/skew) runs them beside HEAD's.
#
#   hack/build-prev.sh 468427a ~/.cache/volplane/prev-468427a
#
# The commit's tree is taken with `git archive` (no worktree is added to
# the clone) into a temporary directory and built there with the module
# and build caches HEAD uses, so a warm machine rebuilds little. OUT is
# complete or absent: the binaries are built into OUT.tmp.PID and moved in
# place, with OUT/commit naming the full commit they were built from.
#
# Exit status 3 (and nothing built) when the clone lacks the commit, as a
# shallow clone does: fetch the history, e.g. `git fetch --unshallow`.
set -euo pipefail
commit=${1:?usage: $0 COMMIT OUT}
out=${2:?usage: $0 COMMIT OUT}
services=(watcher binder provisioner reclaimer gateway)
pkgs=(./services/watcher/cmd/watcher ./services/binder/cmd/binder ./services/provisioner/cmd/provisioner
	./services/reclaimer/cmd/reclaimer ./gateway/cmd/gateway)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)

full=$(git -C "$root" rev-parse --verify --quiet "$commit^{commit}" || true)
if [[ -z "$full" ]]; then
	echo "hack/build-prev.sh: commit $commit (the previous release) is not in this clone's history;" \
		"fetch it (git fetch --unshallow, or git fetch origin $commit)" >&2
	exit 3
fi
if [[ -f "$out/commit" && "$(cat "$out/commit")" == "$full" ]]; then
	missing=0
	for s in "${services[@]}"; do [[ -x "$out/$s" ]] || missing=1; done
	if [[ $missing == 0 ]]; then
		echo "previous release ${full:0:12}: cached in $out"
		exit 0
	fi
fi

tmp="$out.tmp.$$"
src=$(mktemp -d)
trap 'rm -rf "$tmp" "$src"' EXIT
mkdir -p "$tmp"
git -C "$root" archive "$full" | tar -x -C "$src"
echo "building the previous release ${full:0:12} (${services[*]}) into $out"
start=$(date +%s)
(
	cd "$src"
	# The same -X flags as that commit's Makefile: --version names it.
	go build -ldflags "-X github.com/volplane/volplane/pkg/version.Version=v0.1.0-prev \
		-X github.com/volplane/volplane/pkg/version.Commit=${full:0:12}" -o "$tmp/" "${pkgs[@]}"
)
echo "$full" >"$tmp/commit"
rm -rf "$out"
mkdir -p "$(dirname "$out")"
mv "$tmp" "$out"
echo "previous release ${full:0:12}: built in $(($(date +%s) - start))s into $out"
