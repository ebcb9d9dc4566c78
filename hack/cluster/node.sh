#!/usr/bin/env bash
# node.sh stop|start NODE: a power loss of one node of a cluster of
# several (hack/cluster/nodes.sh), and the power back.
#
#   stop    the node's link to the switch down first (nothing it sends
#           afterwards, not even the FIN of a dying socket, reaches anyone),
#           then SIGKILL, without a grace period, its kubelet, kube-proxy
#           and containerd, the containerd shims serving its socket, and
#           every process in its pods' cgroups ($node_cgroup_parent/NODE),
#           as down.sh's kill_pods does for the whole cluster. The command
#           lines, environments and working directories of the three host
#           processes are kept in $run/NAME.argv, .env and .cwd for start.
#           What a powered-off node keeps is kept: its directories, its
#           namespaces, its containerd state (dead tasks), the pods' mounts.
#   start   the link up, then containerd, the kubelet and kube-proxy again
#           from what stop kept, as up.sh started them (restart.sh's way),
#           each waited for until it serves. The kubelet then finds its pods
#           dead and, with the API server, does what it does after a reboot.
#
# test/cluster TestMultiNode's subtest "kill a node" runs both.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=nodes.sh
source "$(dirname "$0")/nodes.sh"
need_root
usage="usage: node.sh stop|start NODE (volplane-node-I)"
action=${1:?$usage}
node=${2:?$usage}
[[ $node =~ ^volplane-node-([0-9]+)$ ]] || die "$usage"
# The switch's end of the node's eth0 (nodes.sh's node_links).
port=node${BASH_REMATCH[1]}
[[ -d $(node_dir "$node") ]] || die "$node: no node directory $(node_dir "$node") (is the cluster of several nodes up?)"
procs=(kubelet-"$node" kube-proxy-"$node" containerd-"$node")

# alive NAME: the pid of $run/NAME.pid if it still runs its binary.
alive() {
	local f=$run/$1.pid pid bin
	[[ -r $f ]] || return 1
	read -r pid bin <"$f"
	[[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$bin" ]] && echo "$pid"
}

# node_shims: the pids of the containerd shims serving the node's socket.
node_shims() {
	local p exe
	for p in /proc/[0-9]*; do
		exe=$(readlink "$p/exe" 2>/dev/null) || continue
		[[ ${exe##*/} == containerd-shim-runc-v2 ]] || continue
		tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "-address $(node_dir "$node")/containerd/" && echo "${p#/proc/}"
	done
	return 0
}

# kill_node_pods: SIGKILL every process in the node's pods' cgroups until
# none is left.
kill_node_pods() {
	local d pid round found
	for round in $(seq 20); do
		found=0
		while read -r d; do
			[[ -r $d/cgroup.procs ]] || continue
			while read -r pid; do
				found=1
				kill -KILL "$pid" 2>/dev/null || true
			done < <(cat "$d/cgroup.procs" 2>/dev/null || true)
		done < <(for h in /sys/fs/cgroup/*/"$node_cgroup_parent/$node" /sys/fs/cgroup/"$node_cgroup_parent/$node"; do
			[[ -d $h ]] && find "$h" -depth -type d
		done)
		((found)) || return 0
		sleep 0.2
	done
	die "$node: processes left in its pods' cgroups after $round rounds of SIGKILL"
}

stop_node() {
	local name pid
	for name in "${procs[@]}"; do
		pid=$(alive "$name") || die "$name is not running (is $node already stopped?)"
		cp "/proc/$pid/cmdline" "$run/$name.argv"
		cp "/proc/$pid/environ" "$run/$name.env"
		readlink "/proc/$pid/cwd" >"$run/$name.cwd"
	done
	ip -n "$switch_netns" link set "$port" down
	for name in "${procs[@]}"; do
		if pid=$(alive "$name"); then kill -KILL "$pid" 2>/dev/null || true; fi
	done
	for pid in $(node_shims); do kill -KILL "$pid" 2>/dev/null || true; done
	kill_node_pods
	for name in "${procs[@]}"; do
		while alive "$name" >/dev/null; do sleep 0.1; done
	done
	while [[ -n $(node_shims) ]]; do sleep 0.1; done
	log "$node: powered off (link down; kubelet, kube-proxy, containerd, $node's shims and pods SIGKILLed)"
}

# start_saved NAME: NAME again as stop found it, in the node's namespaces.
start_saved() {
	local name=$1 bin argv environ
	[[ -r $run/$name.argv ]] || die "$name: no $run/$name.argv (was $node stopped by node.sh stop?)"
	alive "$name" >/dev/null && die "$name is running already"
	read -r _ bin <"$run/$name.pid"
	mapfile -d '' -t argv <"$run/$name.argv"
	mapfile -d '' -t environ <"$run/$name.env"
	(
		cd "$(cat "$run/$name.cwd")"
		env -i "${environ[@]}" setsid nsenter --net="/run/netns/$node" --mount="$(node_dir "$node")/ns/mnt" \
			--uts="$(node_dir "$node")/ns/uts" -- "${argv[@]}" >>"$logs/$name.log" 2>&1 </dev/null &
		echo "$! $bin" >"$run/$name.pid"
	)
	rm -f "$run/$name.argv" "$run/$name.env" "$run/$name.cwd"
}

# serves WHAT LOG COMMAND...: waits up to 120s for COMMAND to succeed.
serves() {
	local what=$1 logf=$2 i
	shift 2
	for i in $(seq 120); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 1
	done
	tail -n 30 "$logf" >&2
	die "$what does not serve after ${i}s (log: $logf)"
}

start_node() {
	local start=$SECONDS
	ip -n "$switch_netns" link set "$port" up
	start_saved "containerd-$node"
	local bin
	read -r _ bin <"$run/containerd-$node.pid"
	serves "containerd of $node" "$logs/containerd-$node.log" "$(dirname "$bin")/ctr" --address "$(node_dir "$node")/containerd/containerd.sock" version
	start_saved "kubelet-$node"
	serves "the kubelet of $node" "$logs/kubelet-$node.log" in_node "$node" curl -sf http://127.0.0.1:10248/healthz
	start_saved "kube-proxy-$node"
	serves "kube-proxy of $node" "$logs/kube-proxy-$node.log" in_node "$node" curl -sf http://127.0.0.1:10256/healthz
	log "$node: powered on (link up; containerd, kubelet, kube-proxy serve) in $(elapsed $((SECONDS - start)))"
}

case $action in
stop) stop_node ;;
start) start_node ;;
*) die "$usage" ;;
esac
