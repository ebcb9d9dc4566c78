#!/usr/bin/env bash
# restart.sh NAME: restarts one host process of the running cluster (the
# kubelet, containerd, kube-proxy, kube-scheduler, kube-apiserver or etcd)
# as up.sh started it: the same command line and environment, in a session
# of its own, its output appended to $logs/NAME.log, its pid file renewed.
# In a cluster of several nodes a node's are kubelet-NODE, containerd-NODE
# and kube-proxy-NODE (kubelet-volplane-node-2), started again in that
# node's namespaces (hack/cluster/nodes.sh).
# The fault tests of test/cluster restart the kubelet and the runtime this
# way; pods keep running through both (containerd's shims outlive it).
#
# kube-controller-manager is a static pod (up.sh): change its manifest,
# $state/manifests/kube-controller-manager.yaml, as docs/install.md does,
# and the kubelet restarts it.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=nodes.sh
source "$(dirname "$0")/nodes.sh"
need_root
name=${1:?usage: restart.sh kubelet|containerd|kube-proxy|kube-scheduler|kube-apiserver|etcd, or kubelet|containerd|kube-proxy-NODE}
# The node whose namespaces it runs in (none: the host's).
node=
[[ -r $run/$name.node ]] && read -r node <"$run/$name.node"
sock=$containerd_sock
[[ -z $node ]] || sock=$(node_dir "$node")/containerd/containerd.sock
# on_node COMMAND...: COMMAND where the process runs.
on_node() {
	if [[ -n $node ]]; then in_node "$node" "$@"; else "$@"; fi
}
f=$run/$name.pid
[[ -r $f ]] || die "$name: no pid file $f (is the cluster up? kube-controller-manager is a static pod)"
read -r pid bin <"$f"
[[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$bin" ]] || die "$name: process $pid is not $bin"

# What it was started with, NUL-separated, read before it stops.
mapfile -d '' -t argv <"/proc/$pid/cmdline"
mapfile -d '' -t environ <"/proc/$pid/environ"
cwd=$(readlink "/proc/$pid/cwd")

start=$SECONDS
kill -TERM "$pid"
for _ in $(seq 300); do
	[[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$bin" ]] || break
	sleep 0.1
done
if [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$bin" ]]; then
	log "$name ($pid) did not stop in 30s on SIGTERM: SIGKILL"
	kill -KILL "$pid"
	while [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$bin" ]]; do sleep 0.1; done
fi
log "$name ($pid) stopped in $(elapsed $((SECONDS - start)))"

cd "$cwd"
if [[ -n $node ]]; then
	env -i "${environ[@]}" setsid nsenter --net="/run/netns/$node" --mount="$(node_dir "$node")/ns/mnt" \
		--uts="$(node_dir "$node")/ns/uts" -- "${argv[@]}" >>"$logs/$name.log" 2>&1 </dev/null &
else
	env -i "${environ[@]}" setsid "${argv[@]}" >>"$logs/$name.log" 2>&1 </dev/null &
fi
echo "$! $bin" >"$f"
log "$name started again: pid $!"

# Wait until it serves again.
ready() {
	case ${name%-"$node"} in
	kubelet) on_node curl -sf http://127.0.0.1:10248/healthz ;;
	containerd) "$ctr" --address "$sock" version ;;
	kube-proxy) on_node curl -sf http://127.0.0.1:10256/healthz ;;
	kube-scheduler) curl -skf https://127.0.0.1:10259/healthz ;;
	kube-apiserver) kctl get --raw /readyz ;;
	*) true ;;
	esac
}
for _ in $(seq 120); do
	if ready >/dev/null 2>&1; then
		log "$name serves again after $(elapsed $((SECONDS - start)))"
		exit 0
	fi
	sleep 1
done
die "$name does not serve 120s after its restart (log: $logs/$name.log)"
