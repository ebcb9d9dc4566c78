# Sourced by hack/cluster/*.sh: the pinned versions, the cache and state
# paths, the cluster's addresses, and the helpers every script uses.
# shellcheck shell=bash

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# Pinned parts. KUBE_VERSION must match the Makefile's (it passes it).
KUBE_VERSION=${KUBE_VERSION:-v1.36.3}
CONTAINERD_VERSION=v2.2.9
COREDNS_VERSION=$(sed -n 's/^require github.com\/coredns\/coredns \(v[^ ]*\)$/\1/p' "$root/hack/coredns/go.mod")
ETCD_VERSION=$(sed -n 's/^require go.etcd.io\/etcd\/server\/v3 \(v[^ ]*\)$/\1/p' "$root/hack/etcd/go.mod")
# The tag of volplane's own images (the Makefile's VERSION).
VERSION=${VERSION:-0.1.0}

# Where builds are cached across clones (as the Makefile's VOLPLANE_CACHE).
cache=${VOLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/volplane}
kube_dir=$cache/kube-$KUBE_VERSION
containerd_dir=$cache/containerd-$CONTAINERD_VERSION
etcd_bin=$cache/etcd-$ETCD_VERSION
coredns_bin=$cache/coredns-$COREDNS_VERSION
images_dir=$cache/cluster-images

# The images the cluster runs, all built FROM scratch and imported into
# containerd (no registry is reachable).
image_registry=ghcr.io/volplane
pause_image=$image_registry/pause:$VERSION
volplane_image=$image_registry/volplane:$VERSION
etcd_image=$image_registry/etcd:$VERSION
coredns_image=$image_registry/coredns:$COREDNS_VERSION
workload_image=$image_registry/workload:$VERSION
# The driver sidecar, in a CSI driver's pod in csi-provisioner's place
# (docs/sidecar.md): its entrypoint is the sidecar, as hack/build-images.sh's.
sidecar_image=$image_registry/volplane-csi-sidecar:$VERSION
# The previous release's services (hack/prev-release, built from git
# history by hack/build-prev.sh), packed as volplane's image is, for the
# upgrade from it to the working tree (TestCluster/upgrade).
prev_commit=$(tr -d '[:space:]' <"$root/hack/prev-release")
prev_image=$image_registry/volplane:$VERSION-prev

# The cluster's state: every file a running cluster writes, except the
# kubelet's directory, which stays where CSI drivers' manifests expect it.
# `make cluster-down` removes both.
state=${VOLPLANE_CLUSTER_DIR:-/var/lib/volplane-cluster}
kubelet_dir=/var/lib/kubelet
pki=$state/pki
logs=$state/logs
run=$state/run
admin_kubeconfig=$state/admin.kubeconfig
# The kubelet's static pods (as kubeadm's /etc/kubernetes/manifests):
# kube-controller-manager.yaml.
kcm_manifest_dir=$state/manifests
# Host paths outside $state that the parts (or what runs in the cluster:
# the dev CSI driver of deploy/drivers/volplane-csi keeps its volumes in
# /var/lib/volplane-csi on the node) may create; up.sh records which
# existed before, down.sh removes the others.
host_paths="/run/containerd /var/lib/cni /var/log/containers /var/log/pods /var/lib/volplane-csi /var/lib/volplane-node"
# kube-controller-manager's --controllers at start. The default leaves the
# PV binder off, for volplane; `make test-cluster` starts with kubeadm's
# default (the binder on) and turns it off by docs/install.md's flip.
kcm_controllers=${KCM_CONTROLLERS:-*,-persistentvolume-binder-controller}
containerd_sock=$state/containerd/containerd.sock

# Addresses. The Service and pod ranges are reached only on this host: up.sh
# adds "unreachable" routes for both, so a packet kube-proxy did not
# translate is refused here instead of following the default route out.
service_cidr=10.96.0.0/16
kubernetes_service_ip=10.96.0.1
dns_ip=10.96.0.10
cluster_cidr=10.244.0.0/16
node_pod_cidr=10.244.0.0/24
node_pod_gateway=10.244.0.1
cluster_domain=cluster.local
bridge=cni0
# Fixed ports, all outside the kernel's ephemeral range (32768-60999) so
# that the loopback servers tests start on port 0 never take them.
api_port=6443
etcd_client_port=12379
etcd_peer_port=12380
etcd_metrics_port=12381
node_name=$(hostname | tr '[:upper:]' '[:lower:]')

# Several nodes (make cluster NODES=3, hack/cluster/nodes.sh): each node a
# network namespace, a mount namespace and a UTS namespace of its own on
# this host, with its own containerd, kubelet and kube-proxy; the nodes and
# the host meet on a bridge in the network namespace $switch_netns, which
# the cluster creates (the host by the veth $node_bridge). With 1 (the
# default) the cluster is the single node on the host's network.
nodes=${VOLPLANE_CLUSTER_NODES:-1}
[[ $nodes =~ ^[1-9][0-9]?$ ]] || {
	echo "NODES=$nodes: want a number from 1 to 99" >&2
	exit 1
}
node_bridge=volplane0
switch_netns=volplane-switch
node_net=10.250.0.0/24
# The host's address on the bridge: where the nodes reach the API server.
node_gateway=10.250.0.1
# The nodes' directories that are each node's own: bind-mounted in its
# mount namespace from $state/nodes/NAME/root, so that a hostPath below one
# of them on one node is not another node's. Elsewhere a node sees the
# host's files.
node_private_dirs="/var/lib/kubelet /var/lib/volplane-csi /var/lib/volplane-node /var/lib/cni /var/log/pods /var/log/containers /run/containerd /tmp"
# The cgroup (in every hierarchy) under which each node's pods live
# (the kubelets' cgroupRoot: $node_cgroup_parent/NAME).
node_cgroup_parent=volplane-cluster
# multi_node: the cluster has several nodes.
multi_node() { ((nodes > 1)); }
# node_name_of I, node_ip_of I, node_zone_of I, node_pod_cidr_of I: node I
# (1..$nodes): volplane-node-I at 10.250.0.(10+I), in zone-a, zone-b,
# zone-c, zone-a..., its pods in 10.244.I.0/24.
node_name_of() { echo "volplane-node-$1"; }
node_ip_of() { echo "10.250.0.$((10 + $1))"; }
node_zone_of() {
	local z=(a b c)
	echo "zone-${z[$((($1 - 1) % 3))]}"
}
node_pod_cidr_of() { echo "10.244.$1.0/24"; }

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

# elapsed SECONDS: 1h02m03s, 4m05s or 6s.
elapsed() {
	local s=$1
	if ((s >= 3600)); then
		printf '%dh%02dm%02ds' $((s / 3600)) $((s % 3600 / 60)) $((s % 60))
	elif ((s >= 60)); then
		printf '%dm%02ds' $((s / 60)) $((s % 60))
	else
		printf '%ds' "$s"
	fi
}

# step NAME COMMAND...: runs COMMAND and logs how long it took.
step() {
	local name=$1 start=$SECONDS
	shift
	log "==> $name"
	"$@"
	log "<== $name: $(elapsed $((SECONDS - start)))"
}

# child_cpu: sets child_cpu_ticks to the CPU time (user and system, in
# clock ticks) of the children this shell has waited for, the compilers of
# a `go build` included. Not in a $(...): that would read a subshell's.
child_cpu() {
	local s
	read -r s <"/proc/$BASHPID/stat"
	s=${s##*) }
	# shellcheck disable=SC2086
	set -- $s
	child_cpu_ticks=$((${14} + ${15}))
}

# with_progress LABEL LOGFILE COMMAND...: runs COMMAND with its output in
# LOGFILE and, every VOLPLANE_PROGRESS_EVERY seconds (30), logs LABEL and
# the time spent, with, for `go build -v` or `go install -v`, how many
# packages were compiled so far and the last (or, before the first, how
# many modules were downloaded); at the end, the wall and CPU time it took.
# On failure it prints the last 40 lines of LOGFILE and returns COMMAND's
# exit status.
with_progress() {
	local label=$1 out=$2 start=$SECONDS every=${VOLPLANE_PROGRESS_EVERY:-30} cpu pid rc=0 i n last dl
	child_cpu
	cpu=$child_cpu_ticks
	shift 2
	"$@" >"$out" 2>&1 &
	pid=$!
	while kill -0 "$pid" 2>/dev/null; do
		for ((i = 0; i < every; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 1
		done
		if kill -0 "$pid" 2>/dev/null; then
			n=$(grep -cv '^go: ' "$out" || true)
			if ((n == 0)); then
				dl=$(grep -c '^go: downloading ' "$out" || true)
				log "    $label: $(elapsed $((SECONDS - start))) elapsed, $dl modules downloaded, no package compiled yet"
			else
				last=$(grep -v '^go: ' "$out" | tail -n 1 || true)
				log "    $label: $(elapsed $((SECONDS - start))) elapsed, $n packages compiled, last $last"
			fi
		fi
	done
	wait "$pid" || rc=$?
	if ((rc != 0)); then
		tail -n 40 "$out" >&2
		log "$label failed (exit $rc) after $(elapsed $((SECONDS - start))); full output in $out"
		return "$rc"
	fi
	child_cpu
	log "    $label: done in $(elapsed $((SECONDS - start))), $(((child_cpu_ticks - cpu) / $(getconf CLK_TCK))) CPU-seconds"
}

# need_root: the cluster changes the host's network, mounts and cgroups.
need_root() {
	[[ $(id -u) == 0 ]] || die "run as root: the kubelet, containerd and kube-proxy change the host's mounts, cgroups and network"
}

# The binaries the scripts run.
kubectl=$kube_dir/kubectl
ctr=$containerd_dir/ctr
kctl() { "$kubectl" --kubeconfig "$admin_kubeconfig" --cache-dir "$state/kubectl-cache" "$@"; }
