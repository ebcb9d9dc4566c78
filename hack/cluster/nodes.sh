# Sourced by hack/cluster/up.sh, down.sh and restart.sh: the nodes of a
# cluster of several (make cluster NODES=3). Each node is, on this host:
#
#   network   a network namespace (ip netns NAME) whose eth0, at
#             10.250.0.(10+I), is a veth on the bridge br0 of the switch,
#             a network namespace $switch_netns the cluster creates, which
#             the host joins by the veth $node_bridge (10.250.0.1: the API
#             server); its pods on its own cni0 in 10.244.I.0/24, and a
#             route to every other node's pod range via that node; the
#             host routes each pod range to its node. No default route:
#             a node or pod reaches the nodes, the pods, the Services and
#             the host on the bridge, nothing else.
#   mounts    a mount namespace (pinned at $state/nodes/NAME/ns/mnt) where
#             each of $node_private_dirs is $state/nodes/NAME/root/DIR,
#             and / is rshared (the kubelet's mount propagation); the rest
#             of the file system is the host's
#   hostname  a UTS namespace (ns/uts) whose host name is NAME
#   processes containerd, the kubelet and kube-proxy of its own (pid files
#             and logs containerd-NAME, kubelet-NAME, kube-proxy-NAME in
#             $run and $logs; restart.sh restarts them there), runc's and
#             containerd's state below $state/nodes/NAME
#   cgroups   its pods under $node_cgroup_parent/NAME/kubepods in every
#             hierarchy (the kubelet's cgroupRoot)
#   label     topology.kubernetes.io/zone=zone-a, zone-b, zone-c, ...
#
# Node 1 also runs kube-controller-manager's static pod, as a control-plane
# node of kubeadm's. etcd, kube-apiserver and kube-scheduler stay host
# processes, as in the single-node cluster.
# shellcheck shell=bash

# node_dir NAME: the node's state.
node_dir() { echo "$state/nodes/$1"; }

# in_node NAME COMMAND...: COMMAND in node NAME's network, mount and UTS
# namespaces (nsenter execs it: the pid is COMMAND's).
in_node() {
	local name=$1 d
	d=$(node_dir "$1")
	shift
	nsenter --net="/run/netns/$name" --mount="$d/ns/mnt" --uts="$d/ns/uts" -- "$@"
}

# nodes_network: the switch (a network namespace holding the bridge, and
# the host's link to it), then each node's namespaces and links.
nodes_network() {
	local i
	# ip netns's /run/netns: down.sh removes it when it was not there before.
	[[ -e /run/netns ]] && touch "$state/host/run-netns-existed"
	# The nodes' bridge lives in a network namespace of its own, not on the
	# host: with net.bridge.bridge-nf-call-iptables=1 on the host (as the
	# single-node cluster needs, and as a Docker host has it) frames bridged
	# on the host between two nodes pass the host's FORWARD hook, whose
	# policy may be drop (this host's is: Docker's `table ip filter`); in
	# the switch's namespace there is no rule at all. The host reaches it
	# by the veth $node_bridge.
	ip netns add "$switch_netns"
	ip -n "$switch_netns" link set lo up
	ip -n "$switch_netns" link add br0 type bridge
	ip -n "$switch_netns" link set br0 up
	ip link add "$node_bridge" type veth peer name uplink netns "$switch_netns"
	ip -n "$switch_netns" link set uplink master br0 up
	ip addr add "$node_gateway/${node_net#*/}" dev "$node_bridge"
	ip link set "$node_bridge" up
	# As on a single node: a Service or pod address nothing translated or
	# delivered is refused on this host, never sent to its default gateway.
	ip route replace unreachable "$service_cidr"
	ip route replace unreachable "$cluster_cidr"
	for i in $(seq "$nodes"); do
		node_namespaces "$i"
		node_links "$i"
	done
}

# node_namespaces I: node I's network, mount and UTS namespaces, its
# directories, its cgroups.
node_namespaces() {
	local name d p h
	name=$(node_name_of "$1")
	d=$(node_dir "$name")
	mkdir -p "$d/ns" "$d/containerd" "$d/cni/net.d" "$d/cni/ipam" "$d/pod-logs" "$d/kubelet"
	ip netns add "$name"
	# The namespace files are pinned on a private mount, as ip netns does
	# for /run/netns (a namespace cannot be pinned on a shared mount).
	touch "$d/ns/mnt" "$d/ns/uts"
	mount --bind "$d/ns" "$d/ns"
	mount --make-private "$d/ns"
	for p in $node_private_dirs; do
		mkdir -p "$d/root$p" "$p"
	done
	chmod 1777 "$d/root/tmp"
	unshare --mount="$d/ns/mnt" --uts="$d/ns/uts" --propagation private \
		bash -c 'set -e; hostname "$1"; mount --make-rshared /; r=$2; shift 2
			for p; do mount --bind "$r$p" "$p"; done' _ "$name" "$d/root" $node_private_dirs
	for h in /sys/fs/cgroup/*/; do
		[[ -e $h/cgroup.procs ]] || continue
		mkdir -p "$h$node_cgroup_parent/$name"
		if [[ -e $h/cpuset.cpus ]]; then
			cat "$h/cpuset.cpus" >"$h$node_cgroup_parent/cpuset.cpus"
			cat "$h/cpuset.mems" >"$h$node_cgroup_parent/cpuset.mems"
			cat "$h/cpuset.cpus" >"$h$node_cgroup_parent/$name/cpuset.cpus"
			cat "$h/cpuset.mems" >"$h$node_cgroup_parent/$name/cpuset.mems"
		fi
	done
}

# node_links I: node I's eth0 on the switch, its routes, its sysctls, and
# the host's route to its pods.
node_links() {
	local i=$1 name ip j
	name=$(node_name_of "$i")
	ip=$(node_ip_of "$i")
	ip -n "$switch_netns" link add "node$i" type veth peer name eth0 netns "$name"
	ip -n "$switch_netns" link set "node$i" master br0 up
	ip -n "$name" link set lo up
	ip -n "$name" addr add "$ip/${node_net#*/}" dev eth0
	ip -n "$name" link set eth0 up
	# The node routes its pods' traffic; bridged pod traffic passes its
	# nftables (kube-proxy's Services). Both sysctls are the namespace's own.
	ip netns exec "$name" sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
	for j in $(seq "$nodes"); do
		((j == i)) || ip -n "$name" route add "$(node_pod_cidr_of "$j")" via "$(node_ip_of "$j")"
	done
	ip route replace "$(node_pod_cidr_of "$i")" via "$ip" dev "$node_bridge"
}

# nodes_credentials: each node's kubelet certificates (client and serving)
# and kubeconfig.
nodes_credentials() {
	local i name
	for i in $(seq "$nodes"); do
		name=$(node_name_of "$i")
		"$here/pki.sh" node "$pki" "$name" "$(node_ip_of "$i")"
		kubeconfig "kubelet-$name" "kubelet-$name" "https://$node_gateway:$api_port"
	done
}

# start_in_node NAME PROCESS BINARY ARGS...: start's PROCESS-NAME in node
# NAME's namespaces; restart.sh finds them in $run/PROCESS-NAME.node.
start_in_node() {
	local name=$1 proc=$2-$1 bin=$3 d
	d=$(node_dir "$name")
	shift 3
	echo "$name" >"$run/$proc.node"
	setsid nsenter --net="/run/netns/$name" --mount="$d/ns/mnt" --uts="$d/ns/uts" -- \
		"$bin" "$@" >>"$logs/$proc.log" 2>&1 </dev/null &
	echo "$! $bin" >"$run/$proc.pid"
}

# nodes_up: every node's containerd (the images imported), kubelet and
# kube-proxy, then every node Ready.
nodes_up() {
	local i name
	for i in $(seq "$nodes"); do
		node_runtime "$i"
	done
	kcm_manifest
	for i in $(seq "$nodes"); do
		node_kubelet "$i"
	done
	for i in $(seq "$nodes"); do
		name=$(node_name_of "$i")
		wait_for "node $name Ready" 180 "$logs/kubelet-$name.log" kctl wait --for=condition=Ready "node/$name" --timeout=5s
	done
}

# node_runtime I: node I's pod network configuration and containerd, with
# the cluster's images.
node_runtime() {
	local name d sock
	name=$(node_name_of "$1")
	d=$(node_dir "$name")
	sock=$d/containerd/containerd.sock
	cni_conflist "$d/cni/net.d/10-volplane.conflist" "$(node_pod_cidr_of "$1")" "$(node_pod_gateway_of "$1")" "$d/cni/ipam"
	containerd_config "$d/containerd" "$sock" "$d/cni/net.d"
	PATH=$containerd_dir:$PATH start_in_node "$name" containerd "$containerd_dir/containerd" --config "$d/containerd/config.toml"
	wait_for "containerd of $name" 60 "$logs/containerd-$name.log" "$ctr" --address "$sock" version
	import_images "$sock"
	log "    $name: containerd up, images imported"
}

# node_pod_gateway_of I: the node's address on its pods' bridge.
node_pod_gateway_of() { echo "10.244.$1.1"; }

# node_kubelet I: node I's kubelet (its zone label, its cgroupRoot; node 1
# with kube-controller-manager's static pod) and kube-proxy.
node_kubelet() {
	local i=$1 name d extra
	name=$(node_name_of "$i")
	d=$(node_dir "$name")
	extra="cgroupRoot: /$node_cgroup_parent/$name"
	if ((i == 1)); then
		# kube-controller-manager's static pod, as on kubeadm's first node.
		extra+=$'\n'"staticPodPath: \"$kcm_manifest_dir\""
	fi
	kubelet_config "$d/kubelet/config.yaml" "$d/containerd/containerd.sock" "$pki/kubelet-serving-$name.crt" \
		"$pki/kubelet-serving-$name.key" "$d/pod-logs" "$extra"
	start_in_node "$name" kubelet "$kube_dir/kubelet" --config="$d/kubelet/config.yaml" \
		--kubeconfig="$state/kubelet-$name.kubeconfig" --root-dir="$kubelet_dir" \
		--hostname-override="$name" --node-ip="$(node_ip_of "$i")" \
		--node-labels="topology.kubernetes.io/zone=$(node_zone_of "$i"),topology.kubernetes.io/region=volplane" --v=1
	wait_for "the registration of $name" 120 "$logs/kubelet-$name.log" kctl get node "$name"
	kube_proxy_config "$d/kube-proxy.yaml" "$name"
	start_in_node "$name" kube-proxy "$kube_dir/kube-proxy" --config="$d/kube-proxy.yaml" --v=1
	wait_for "kube-proxy of $name /healthz" 120 "$logs/kube-proxy-$name.log" in_node "$name" curl -sf http://127.0.0.1:10256/healthz
	log "    $name: kubelet and kube-proxy up ($(node_zone_of "$i"), pods $(node_pod_cidr_of "$i"))"
}

# our_netns: the network namespaces of the nodes and of their switch that
# exist.
our_netns() {
	ip netns list 2>/dev/null | awk -v sw="$switch_netns" '$1 ~ /^volplane-node-[0-9]+$/ || $1 == sw {print $1}'
}

# nodes_network_down: the nodes' and the switch's network namespaces
# (their veths, cni0s, kube-proxy tables, conntrack entries and pods'
# namespaces go with them once their processes are gone and their mount
# namespaces unpinned), the host's link to the switch (and the host's
# routes through it), and /run/netns when ip netns created it.
nodes_network_down() {
	local n
	for n in $(our_netns); do
		ip netns del "$n" 2>/dev/null || true
	done
	ip link del "$node_bridge" 2>/dev/null || true
	if [[ -d $state/nodes && ! -e $state/host/run-netns-existed && -d /run/netns ]] &&
		[[ -z $(ls -A /run/netns) ]]; then
		umount /run/netns 2>/dev/null || true
		rmdir /run/netns 2>/dev/null || true
	fi
}
