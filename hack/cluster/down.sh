#!/usr/bin/env bash
# Stops the local cluster (make cluster-down) and undoes what it changed on
# the host, whatever state hack/cluster/up.sh left it in:
#
#   processes   the kubelets, the pods' processes (by the kubepods cgroups),
#               containerd and its shims, kube-proxy, the control plane:
#               only processes up.sh started (pid files checked against
#               their binary) or their pods
#   mounts      everything mounted under $state and the kubelet's directory
#   network     cni0 and its veths, the unreachable routes, kube-proxy's
#               nftables tables, the kubelet's KUBE-* and CNI-* iptables
#               chains, the cluster's conntrack entries, the rules that
#               accept cni0's traffic on a host whose FORWARD policy is
#               drop (comment volplane-cluster); with several nodes
#               (hack/cluster/nodes.sh) their network namespaces (and with
#               them all that was in them), their switch $switch_netns and
#               the host's link to it, $node_bridge
#   cgroups     the kubepods hierarchy in every cgroup controller (and the
#               nodes' $node_cgroup_parent)
#   sysctls     restored to the values recorded at start
#   files       $state, the kubelet's directory, and the host paths the
#               parts created (recorded at start)
#
# It checks at the end that nothing is left and fails if something is.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=nodes.sh
source "$(dirname "$0")/nodes.sh"
need_root
start_time=$SECONDS
problems=()

# stop NAME [SECONDS]: SIGTERM, then SIGKILL after SECONDS (10), the process
# of $run/NAME.pid if it still runs the binary it was started as.
stop() {
	local f=$run/$1.pid pid bin i
	[[ -r $f ]] || return 0
	read -r pid bin <"$f"
	if [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$bin" ]]; then
		kill -TERM "$pid" 2>/dev/null || true
		for i in $(seq $((${2:-10} * 10))); do
			[[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$bin" ]] || break
			sleep 0.1
		done
		if [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$bin" ]]; then
			log "    $1 ($pid) did not stop on SIGTERM: SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$f"
}

# kubepods: the cgroup directories of the pods, deepest first.
kubepods() {
	local h
	for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/"$node_cgroup_parent"; do
		[[ -d $h ]] && find "$h" -depth -type d
	done
	return 0
}

kill_pods() {
	local d pid round
	for round in 1 2 3 4 5 6 7 8 9 10; do
		local found=0
		while read -r d; do
			# The directory may go between the test and the read (the
			# kubelet removes a pod's cgroup as its last process ends):
			# a cgroup that is gone has no process left to kill.
			[[ -r $d/cgroup.procs ]] || continue
			while read -r pid; do
				found=1
				kill -KILL "$pid" 2>/dev/null || true
			done < <(cat "$d/cgroup.procs" 2>/dev/null || true)
		done < <(kubepods)
		((found)) || return 0
		sleep 0.5
	done
	problems+=("processes left in the kubepods cgroups")
}

# shims: the containerd shims of this cluster (they outlive containerd):
# our shim binary, serving a containerd socket below $state (the host's or
# a node's).
shims() {
	local p exe
	for p in /proc/[0-9]*; do
		exe=$(readlink "$p/exe" 2>/dev/null) || continue
		[[ $exe == "$containerd_dir/containerd-shim-runc-v2" ]] || continue
		tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "-address $state/" && echo "${p#/proc/}"
	done
	return 0
}

# stop_all PREFIX: stop every process whose pid file is PREFIX.pid or
# PREFIX-NODE.pid (a node's).
stop_all() {
	local f
	for f in "$run/$1.pid" "$run/$1"-*.pid; do
		[[ -e $f ]] && stop "$(basename "$f" .pid)"
	done
	rm -f "$run/$1"-*.node
}

processes() {
	stop_all kubelet
	kill_pods
	stop_all containerd
	local pid
	for pid in $(shims); do kill -KILL "$pid" 2>/dev/null || true; done
	stop_all kube-proxy
	stop kube-scheduler
	stop kube-controller-manager # a host process before it became a static pod
	stop kube-apiserver
	stop etcd
}
step "stop processes" processes

# ours PATH: a path below the cluster's directories.
ours() { [[ $1 == "$state"/* || $1 == "$kubelet_dir"/* || $1 == "$kubelet_dir" || $1 == /run/containerd/* ]]; }

mounts() {
	local m i
	for i in 1 2 3; do
		local left=0
		# Deepest first; mountinfo's fifth field is the mount point.
		while read -r m; do
			m=$(printf '%b' "${m//\\0/\\00}")
			ours "$m" || continue
			left=1
			umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
		done < <(awk '{print $5}' /proc/self/mountinfo | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-)
		((left)) || break
	done
	# Loop devices backed by a file of the cluster (a CSI driver's volumes).
	local dev file
	while read -r dev file; do
		[[ -n $dev ]] && ours "$file" && losetup -d "$dev" 2>/dev/null || true
	done < <(losetup -n -O NAME,BACK-FILE 2>/dev/null)
}
step "unmount" mounts

network() {
	local l
	for l in $(ip -o link show master "$bridge" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
		ip link del "$l" 2>/dev/null || true
	done
	ip link del "$bridge" 2>/dev/null || true
	nodes_network_down
	ip route del unreachable "$service_cidr" 2>/dev/null || true
	ip route del unreachable "$cluster_cidr" 2>/dev/null || true
	local fam
	for fam in ip ip6; do
		nft delete table "$fam" kube-proxy 2>/dev/null || true
	done
	local ipt t rule c
	for ipt in iptables ip6tables; do
		command -v "$ipt" >/dev/null || continue
		for t in filter nat mangle; do
			# Jumps into the cluster's chains, then the chains themselves.
			while read -r rule; do
				eval "$ipt -t $t $rule" 2>/dev/null || true
			done < <("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-A" && / -j (KUBE|CNI)-/ {sub(/^-A/, "-D"); print}')
			for c in $("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ {print $2}'); do
				"$ipt" -t "$t" -F "$c" 2>/dev/null || true
			done
			for c in $("$ipt" -t "$t" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ {print $2}'); do
				"$ipt" -t "$t" -X "$c" 2>/dev/null || true
			done
		done
	done
	# up.sh's accept rules for cni0 on a host whose FORWARD policy is drop.
	for c in FORWARD DOCKER-USER; do
		while read -r rule; do
			eval "iptables -t filter $rule" 2>/dev/null || true
		done < <(iptables -t filter -S "$c" 2>/dev/null | awk '$1 == "-A" && /--comment "?volplane-cluster"? / {sub(/^-A/, "-D"); print}')
	done
	# The iptables tables the kubelet created, when they are empty again.
	if [[ -r $state/host/nft-tables ]]; then
		local table
		while read -r table; do
			grep -qxF "$table" "$state/host/nft-tables" && continue
			# "table ip filter" with only built-in, empty chains.
			if ! nft list $table 2>/dev/null | grep -vE '^\s*(table|chain|type|policy|\}|$)' | grep -q .; then
				# shellcheck disable=SC2086 # "table ip filter" is three words
				nft delete $table 2>/dev/null || true
			fi
		done < <(nft list tables 2>/dev/null)
	fi
	if command -v conntrack >/dev/null; then
		local cidr
		for cidr in "$cluster_cidr" "$service_cidr"; do
			conntrack -D -s "$cidr" >/dev/null 2>&1 || true
			conntrack -D -d "$cidr" >/dev/null 2>&1 || true
		done
	fi
}
step "network" network

cgroups() {
	local d
	while read -r d; do rmdir "$d" 2>/dev/null || true; done < <(kubepods)
}
step "cgroups" cgroups

sysctls() {
	[[ -r $state/host/sysctl ]] || return 0
	local kv
	while read -r kv; do
		[[ $(sysctl -n "${kv%%=*}" 2>/dev/null) == "${kv#*=}" ]] || sysctl -qw "$kv" || problems+=("sysctl $kv not restored")
	done <"$state/host/sysctl"
}
step "sysctls" sysctls

files() {
	local p
	for p in $host_paths; do
		[[ -e $p ]] || continue
		if [[ -r $state/host/existed ]] && ! grep -qxF "$p" "$state/host/existed"; then
			rm -rf "$p"
		elif [[ ! -r $state/host/existed ]]; then
			log "    leaving $p: no record of whether it existed before the cluster"
		fi
	done
	rm -rf "$kubelet_dir" "$state" || problems+=("could not remove $state or $kubelet_dir")
}
step "files" files

# What must be gone now.
check() {
	local m
	[[ -z $(kubepods) ]] || problems+=("cgroups left: $(kubepods | head -3 | tr '\n' ' ')")
	while read -r m; do ours "$m" && problems+=("mount left: $m"); done < <(awk '{print $5}' /proc/self/mountinfo)
	ip link show "$bridge" >/dev/null 2>&1 && problems+=("$bridge still exists")
	ip link show "$node_bridge" >/dev/null 2>&1 && problems+=("$node_bridge still exists")
	[[ -n $(our_netns) ]] && problems+=("network namespaces left: $(our_netns | tr '\n' ' ')")
	nft list table ip kube-proxy >/dev/null 2>&1 && problems+=("nftables table ip kube-proxy still exists")
	iptables -t filter -S 2>/dev/null | grep -q -- '--comment "\?volplane-cluster' && problems+=("iptables rules of the cluster left")
	[[ -n $(shims) ]] && problems+=("containerd shims still run: $(shims | tr '\n' ' ')")
	[[ -e $state || -e $kubelet_dir ]] && problems+=("$state or $kubelet_dir still exists")
	return 0
}
check
if ((${#problems[@]})); then
	printf '  %s\n' "${problems[@]}" >&2
	die "the cluster is stopped but the host is not clean"
fi
log "cluster down and host clean in $(elapsed $((SECONDS - start_time)))"
