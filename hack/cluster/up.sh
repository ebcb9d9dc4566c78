#!/usr/bin/env bash
# Starts the local single-node cluster (make cluster): etcd, kube-apiserver,
# kube-scheduler, containerd with runc and the CNI bridge, the kubelet,
# kube-proxy (nftables mode) as host processes under $state;
# kube-controller-manager as a static pod of the kubelet, as kubeadm runs
# it (--controllers=$KCM_CONTROLLERS, by default every default controller
# but the PV binder); then CoreDNS as a Deployment; and prints how to
# reach it. hack/cluster/down.sh (make
# cluster-down) stops it and undoes what it changed on the host.
#
# Every part is pinned and built by hack/cluster/build.sh; the Debian
# packages are installed by hack/cluster/deps.sh when missing. With
# VOLPLANE_CSI_SIDECARS=1 (make test-cluster) the upstream CSI
# sidecars are built too (hack/build-csi-sidecars.sh) and their images
# imported beside volplane's, for deploy/drivers/volplane-csi.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=nodes.sh
source "$(dirname "$0")/nodes.sh"
need_root
here=$root/hack/cluster
total_start=$SECONDS

step "Debian packages" "$here/deps.sh"
build_parts=(kube containerd etcd coredns images)
[[ ${VOLPLANE_CSI_SIDECARS:-} == 1 ]] && build_parts+=(sidecars)
# The previous release's image, for TestCluster/upgrade (make test-cluster).
[[ -n ${VOLPLANE_PREV_IMAGE:-} ]] && build_parts+=(prev)
step "build" "$here/build.sh" "${build_parts[@]}"

# alive NAME: the process of $run/NAME.pid runs, and runs the binary it was
# started as (a recycled PID is not ours).
alive() {
	local f=$run/$1.pid pid bin
	[[ -r $f ]] || return 1
	read -r pid bin <"$f"
	[[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$bin" ]]
}
for f in "$run"/*.pid; do
	[[ -e $f ]] || continue
	if alive "$(basename "$f" .pid)"; then
		die "the cluster is already running ($f): make cluster-down first"
	fi
done
if [[ -e $state || -e $kubelet_dir ]]; then
	log "removing the state a previous cluster left"
	"$here/down.sh"
fi

# The kubelets evict every pod below 5% of free space (evictionHard below),
# and refuse new ones: a test would only time out waiting for them. Ask
# for that, plus the room a run takes (images, volumes, logs: about 6 GiB).
mkdir -p "$(dirname "$state")"
read -r free_kib size_kib < <(df -Pk "$(dirname "$state")" | awk 'NR == 2 {print $4, $2}')
need_kib=$((size_kib / 20 + 6 * 1024 * 1024))
if ((free_kib < need_kib)); then
	die "$((free_kib / 1024 / 1024)) GiB free on the file system of $state, $((need_kib / 1024 / 1024)) GiB needed: the kubelets evict pods below 5% free (DiskPressure). Free some (go clean -cache, old clones in /tmp)"
fi

if multi_node; then
	# The API server's address for the nodes: the host's, on their bridge.
	node_ip=$node_gateway
else
	node_ip=$(ip -4 -o addr show dev "$(ip -4 route show default | awk '{print $5; exit}')" | awk '{split($4, a, "/"); print a[1]; exit}')
	[[ -n $node_ip ]] || die "no IPv4 address on the default route's interface: the kubelet would have no node IP"
fi

mkdir -p "$state"/{host,etcd,cni/net.d,cni/ipam,containerd,pod-logs} "$logs" "$run"
chmod 700 "$state"
on_exit() {
	local rc=$?
	((rc == 0)) || log "make cluster failed: the logs are in $logs; make cluster-down removes what was started"
}
trap on_exit EXIT

# What down.sh restores: the sysctls the cluster changes, and which of the
# host paths the parts create outside $state existed before.
record_host() {
	local k
	for k in net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops \
		kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.bridge.bridge-nf-call-iptables \
		net.bridge.bridge-nf-call-ip6tables; do
		if [[ -e /proc/sys/${k//.//} ]]; then echo "$k=$(sysctl -n "$k")"; fi
	done >"$state/host/sysctl"
	local p
	for p in $host_paths; do
		if [[ -e $p ]]; then echo "$p"; fi
	done >"$state/host/existed"
	nft list tables >"$state/host/nft-tables"
}
step "record the host's settings" record_host

# cni_conflist FILE SUBNET GATEWAY IPAM_DIR: the bridge plugin's
# configuration, pods in SUBNET on $bridge with GATEWAY, no masquerade.
cni_conflist() {
	cat >"$1" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "volplane-cluster",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$2", "gateway": "$3"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$4"
      }
    }
  ]
}
EOF
}
network() {
	# Pod traffic is routed through the host and Service addresses are
	# translated by kube-proxy in nftables.
	sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
	# A packet to a Service or pod address that nothing translated or
	# delivered is refused on this host, never sent to the default gateway.
	ip route replace unreachable "$service_cidr"
	ip route replace unreachable "$cluster_cidr"
	forward_accept
	cni_conflist "$state/cni/net.d/10-volplane.conflist" "$node_pod_cidr" "$node_pod_gateway" "$state/cni/ipam"
}
# forward_accept: with net.bridge.bridge-nf-call-iptables=1 the frames
# $bridge bridges between two pods pass the host's FORWARD hook; on a host
# whose FORWARD policy is drop (a host running Docker: its `table ip
# filter`) pods could not reach each other, nor a Service's pods. So then
# $bridge's traffic is accepted first, in DOCKER-USER (the chain Docker
# keeps for its users' rules, which it never rewrites) or else FORWARD,
# by rules with the comment volplane-cluster that down.sh deletes.
forward_accept() {
	iptables -t filter -S FORWARD 2>/dev/null | grep -qx -- '-P FORWARD ACCEPT' && return 0
	local chain=FORWARD
	iptables -t filter -S DOCKER-USER >/dev/null 2>&1 && chain=DOCKER-USER
	iptables -t filter -I "$chain" -o "$bridge" -m comment --comment volplane-cluster -j ACCEPT
	iptables -t filter -I "$chain" -i "$bridge" -m comment --comment volplane-cluster -j ACCEPT
	log "    the host's FORWARD policy is drop: $bridge's traffic accepted first in $chain"
}
if multi_node; then
	step "the nodes' namespaces and network ($nodes nodes, switch $switch_netns)" nodes_network
else
	step "host network" network
fi

# kubeconfig NAME USER [SERVER]: $state/NAME.kubeconfig with the client
# certificate $pki/USER.{crt,key}, for the API server at SERVER
# (https://127.0.0.1:$api_port).
kubeconfig() {
	cat >"$state/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: volplane-cluster
    cluster: {server: "${3:-https://127.0.0.1:$api_port}", certificate-authority: "$pki/ca.crt"}
users:
  - name: $2
    user: {client-certificate: "$pki/$2.crt", client-key: "$pki/$2.key"}
contexts:
  - name: volplane-cluster
    context: {cluster: volplane-cluster, user: $2}
current-context: volplane-cluster
EOF
	chmod 600 "$state/$1.kubeconfig"
}
credentials() {
	"$here/pki.sh" "$pki" "$node_name" "$node_ip"
	kubeconfig admin admin
	kubeconfig kube-scheduler kube-scheduler
	if multi_node; then
		# What runs on the nodes reaches the API server on their bridge.
		kubeconfig kube-controller-manager kube-controller-manager "https://$node_gateway:$api_port"
		kubeconfig kube-proxy kube-proxy "https://$node_gateway:$api_port"
		nodes_credentials
	else
		kubeconfig kube-controller-manager kube-controller-manager
		kubeconfig kube-proxy kube-proxy
		kubeconfig kubelet kubelet
	fi
}
step "PKI and kubeconfigs" credentials

# start NAME BINARY ARGS...: BINARY in a session of its own (a Ctrl-C of
# make does not stop the cluster), its output in $logs/NAME.log.
start() {
	local name=$1 bin=$2
	shift 2
	setsid "$bin" "$@" >>"$logs/$name.log" 2>&1 </dev/null &
	echo "$! $bin" >"$run/$name.pid"
}

# wait_for WHAT SECONDS LOG COMMAND...: polls COMMAND every second.
wait_for() {
	local what=$1 timeout=$2 logf=$3 deadline=$((SECONDS + $2))
	shift 3
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS >= deadline)); then
			[[ -z $logf ]] || tail -n 30 "$logf" >&2
			die "$what: not after ${timeout}s"
		fi
		sleep 1
	done
}

api_ok() { curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "https://127.0.0.1:$api_port$1"; }

control_plane() {
	start etcd "$etcd_bin" --name=cluster --data-dir="$state/etcd" \
		--listen-client-urls="https://127.0.0.1:$etcd_client_port" --advertise-client-urls="https://127.0.0.1:$etcd_client_port" \
		--listen-peer-urls="https://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls="https://127.0.0.1:$etcd_peer_port" \
		--initial-cluster="cluster=https://127.0.0.1:$etcd_peer_port" \
		--listen-metrics-urls="http://127.0.0.1:$etcd_metrics_port" \
		--cert-file="$pki/etcd-server.crt" --key-file="$pki/etcd-server.key" --trusted-ca-file="$pki/ca.crt" --client-cert-auth \
		--peer-cert-file="$pki/etcd-server.crt" --peer-key-file="$pki/etcd-server.key" --peer-trusted-ca-file="$pki/ca.crt" --peer-client-cert-auth
	wait_for "etcd" 60 "$logs/etcd.log" curl -sf "http://127.0.0.1:$etcd_metrics_port/health"

	start kube-apiserver "$kube_dir/kube-apiserver" \
		--advertise-address="$node_ip" --secure-port="$api_port" \
		--etcd-servers="https://127.0.0.1:$etcd_client_port" \
		--etcd-cafile="$pki/ca.crt" --etcd-certfile="$pki/apiserver-etcd-client.crt" --etcd-keyfile="$pki/apiserver-etcd-client.key" \
		--client-ca-file="$pki/ca.crt" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
		--kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority="$pki/ca.crt" --kubelet-preferred-address-types=InternalIP,Hostname \
		--service-account-issuer="https://kubernetes.default.svc.$cluster_domain" \
		--service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
		--service-cluster-ip-range="$service_cidr" \
		--authorization-mode=Node,RBAC \
		--enable-admission-plugins=NodeRestriction,StorageObjectInUseProtection \
		--enable-aggregator-routing=true \
		--allow-privileged=true \
		--v=1
	wait_for "kube-apiserver /readyz" 180 "$logs/kube-apiserver.log" api_ok /readyz

	# One scheduler, so no leader election: an elected kube-scheduler exits
	# when it cannot renew its lease for 10 seconds (kube-apiserver
	# restarted by a fault test or make chaos-cluster takes longer), and
	# here, unlike kubeadm's static pod, nothing would start it again.
	start kube-scheduler "$kube_dir/kube-scheduler" \
		--kubeconfig="$state/kube-scheduler.kubeconfig" \
		--authentication-kubeconfig="$state/kube-scheduler.kubeconfig" \
		--authorization-kubeconfig="$state/kube-scheduler.kubeconfig" \
		--leader-elect=false --bind-address=127.0.0.1 --v=1
	wait_for "kube-scheduler /healthz" 120 "$logs/kube-scheduler.log" curl -skf https://127.0.0.1:10259/healthz
}
step "control plane" control_plane

# import_image TAR REF: the image into containerd's k8s.io namespace,
# pinned: no registry could give it back, so the kubelet's image garbage
# collection must never remove it.
import_image() {
	"$ctr" --address "$containerd_sock" -n k8s.io images import "$1" >>"$logs/ctr.log" 2>&1
	"$ctr" --address "$containerd_sock" -n k8s.io images label "$2" io.cri-containerd.pinned=pinned >>"$logs/ctr.log" 2>&1
}

# import_pulled_image TAR REF: import_image, and the image named by its
# digest too (REPO@sha256:...), as a pull from a registry names it, so that
# a pod may name it either way (the upstream sidecars: a chart pins them
# by tag or by digest, and test/cluster's TestCluster swaps one).
import_pulled_image() {
	local digest
	import_image "$1" "$2"
	digest=$("$ctr" --address "$containerd_sock" -n k8s.io images ls "name==$2" | awk 'NR == 2 {print $3}')
	[[ $digest == sha256:* ]] || die "no digest for the image $2 in containerd"
	"$ctr" --address "$containerd_sock" -n k8s.io images tag --local --force "$2" "${2%:*}@$digest" >>"$logs/ctr.log" 2>&1
	"$ctr" --address "$containerd_sock" -n k8s.io images label "${2%:*}@$digest" io.cri-containerd.pinned=pinned >>"$logs/ctr.log" 2>&1
}

# containerd_config DIR SOCKET CNI_CONF_DIR: DIR/config.toml, containerd's
# root, state and runc root below DIR, serving SOCKET, its pods' network
# from CNI_CONF_DIR.
containerd_config() {
	mkdir -p "$1"
	# restrict_oom_score_adj: this host lacks CAP_SYS_RESOURCE, so runc may
	# not lower a container's oom_score_adj (every sandbox fails with
	# "oom_score_adj: Permission denied" otherwise). NRI and the opt plugin
	# are off: they would create /var/run/nri and /opt/containerd.
	cat >"$1/config.toml" <<EOF
version = 3
root = "$1/root"
state = "$1/state"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"]

[grpc]
  address = "$2"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$pause_image"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  netns_mounts_under_state_dir = true
  enable_cdi = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = "$1/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$3"
    max_conf_num = 1
EOF
}

# import_images SOCKET: the cluster's images into the containerd at SOCKET.
import_images() {
	local img tar ref sock=$1
	for img in pause:$pause_image volplane:$volplane_image etcd:$etcd_image coredns:$coredns_image workload:$workload_image volplane-csi-sidecar:$sidecar_image; do
		containerd_sock=$sock import_image "$images_dir/${img%%:*}.tar" "${img#*:}"
	done
	if [[ ${VOLPLANE_CSI_SIDECARS:-} == 1 ]]; then
		while read -r tar ref; do containerd_sock=$sock import_pulled_image "$tar" "$ref"; done <"$images_dir/csi-sidecars/images.txt"
	fi
	# The previous release, when asked and the clone has it (build.sh prev).
	if [[ -n ${VOLPLANE_PREV_IMAGE:-} && -f $images_dir/volplane-prev.tar ]]; then
		containerd_sock=$sock import_image "$images_dir/volplane-prev.tar" "$prev_image"
	fi
}

runtime() {
	containerd_config "$state/containerd" "$containerd_sock" "$state/cni/net.d"
	# containerd starts the shim it finds first on PATH: the cached one.
	PATH=$containerd_dir:$PATH start containerd "$containerd_dir/containerd" --config "$state/containerd/config.toml"
	wait_for "containerd" 60 "$logs/containerd.log" "$ctr" --address "$containerd_sock" version
	# Pinned: no registry could give them back, so the kubelet's image
	# garbage collection must never remove them.
	import_images "$containerd_sock"
	"$ctr" --address "$containerd_sock" -n k8s.io images ls -q 2>>"$logs/ctr.log" | grep -v '^sha256:' | sed 's/^/    /' >&2
}
if ! multi_node; then
	step "containerd and the images" runtime
fi

# kubelet_config FILE SOCKET CERT KEY POD_LOGS [YAML]: the kubelet's
# configuration: the runtime at SOCKET, serving with CERT and KEY, the
# pods' logs in POD_LOGS, and the lines YAML at the end (a node's own).
kubelet_config() {
	cat >"$1" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host is cgroup v1 (hybrid), has no swap limit support and no systemd
# cgroup manager for us.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$2
# As a kubeadm node: client certificates signed by the cluster CA, anything
# else asks the API server (webhook); a serving certificate the API server
# verifies (--kubelet-certificate-authority).
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$pki/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$3"
tlsPrivateKeyFile: "$4"
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
clusterDNS: [$dns_ip]
clusterDomain: $cluster_domain
resolvConf: /etc/resolv.conf
podLogsDir: "$5"
# No CAP_SYS_RESOURCE: the kubelet may not lower its own oom_score_adj.
oomScoreAdj: 0
# A shared development machine: evict only when really short.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 5%
  nodefs.inodesFree: 5%
  imagefs.available: 5%
${6:-}
EOF
}

# kube_proxy_config FILE NODE_NAME: kube-proxy's configuration.
kube_proxy_config() {
	cat >"$1" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
# nftables: kube-proxy keeps every rule in tables of its own ("ip
# kube-proxy", "ip6 kube-proxy") that down.sh deletes whole, and, unlike the
# iptables mode, never sets route_localnet nor serves NodePorts on
# 127.0.0.1, so loopback traffic of other processes is never translated.
mode: nftables
clientConnection: {kubeconfig: "$state/kube-proxy.kubeconfig"}
hostnameOverride: $2
clusterCIDR: $cluster_cidr
detectLocalMode: ClusterCIDR
nodePortAddresses: [primary]
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# 0: leave the host's conntrack sysctls as they are.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
oomScoreAdj: 0
EOF
}

node() {
	mkdir -p "$state/kubelet"
	# kube-controller-manager's static pod, as kubeadm's /etc/kubernetes/manifests.
	kubelet_config "$state/kubelet/config.yaml" "$containerd_sock" "$pki/kubelet-serving.crt" "$pki/kubelet-serving.key" \
		"$state/pod-logs" "staticPodPath: \"$kcm_manifest_dir\""
	kcm_manifest
	start kubelet "$kube_dir/kubelet" --config="$state/kubelet/config.yaml" \
		--kubeconfig="$state/kubelet.kubeconfig" --root-dir="$kubelet_dir" --v=1
	wait_for "the kubelet's node registration" 120 "$logs/kubelet.log" kctl get node "$node_name"

	kube_proxy_config "$state/kube-proxy.yaml" "$node_name"
	start kube-proxy "$kube_dir/kube-proxy" --config="$state/kube-proxy.yaml" --v=1
	wait_for "kube-proxy /healthz" 120 "$logs/kube-proxy.log" curl -sf http://127.0.0.1:10256/healthz
	wait_for "node $node_name Ready" 180 "$logs/kubelet.log" \
		kctl wait --for=condition=Ready "node/$node_name" --timeout=5s
}
# kcm_manifest: kube-controller-manager's static pod manifest, laid out as
# kubeadm's (/etc/kubernetes/manifests/kube-controller-manager.yaml: one
# flag a line, `- --controllers=...` among them), so that docs/install.md's
# cutover edits it with the same command as on a kubeadm node and the
# kubelet restarts it. The container runs the cached binary, mounted from
# the host, in the pause image (nothing else of an image is needed: the
# binary is static); host network, the PKI and kubeconfig from the host.
kcm_manifest() {
	mkdir -p "$kcm_manifest_dir"
	cat >"$kcm_manifest_dir/kube-controller-manager.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: kube-controller-manager
  namespace: kube-system
  labels: {component: kube-controller-manager, tier: control-plane}
spec:
  hostNetwork: true
  priorityClassName: system-node-critical
  # root, as kubeadm's (the pause image's user is not): it reads the
  # cluster's PKI and kubeconfig, which only root may.
  securityContext: {runAsUser: 0, runAsGroup: 0, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: kube-controller-manager
    image: $pause_image
    imagePullPolicy: Never
    command:
    - /usr/local/bin/kube-controller-manager
    - --kubeconfig=$state/kube-controller-manager.kubeconfig
    - --authentication-kubeconfig=$state/kube-controller-manager.kubeconfig
    - --authorization-kubeconfig=$state/kube-controller-manager.kubeconfig
    - --bind-address=127.0.0.1
    - --controllers=$kcm_controllers
    - --service-account-private-key-file=$pki/sa.key
    - --root-ca-file=$pki/ca.crt
    - --cluster-signing-cert-file=$pki/ca.crt
    - --cluster-signing-key-file=$pki/ca.key
    - --use-service-account-credentials=true
    - --service-cluster-ip-range=$service_cidr
    - --v=1
    livenessProbe:
      httpGet: {host: 127.0.0.1, path: /healthz, port: 10257, scheme: HTTPS}
      initialDelaySeconds: 10
      periodSeconds: 10
      timeoutSeconds: 15
      failureThreshold: 8
    resources: {requests: {cpu: 100m}}
    volumeMounts:
    - {name: binary, mountPath: /usr/local/bin/kube-controller-manager, readOnly: true}
    - {name: pki, mountPath: $pki, readOnly: true}
    - {name: kubeconfig, mountPath: $state/kube-controller-manager.kubeconfig, readOnly: true}
  volumes:
  - {name: binary, hostPath: {path: $kube_dir/kube-controller-manager, type: File}}
  - {name: pki, hostPath: {path: $pki, type: Directory}}
  - {name: kubeconfig, hostPath: {path: $state/kube-controller-manager.kubeconfig, type: File}}
EOF
}
ready_start=$SECONDS
if multi_node; then
	step "the nodes: containerd, the images, the kubelet and kube-proxy on each" nodes_up
else
	step "kubelet and kube-proxy" node
fi
ready_time=$((SECONDS - ready_start))
kcm() {
	if multi_node; then
		wait_for "kube-controller-manager /healthz (its static pod on $(node_name_of 1))" 180 "$logs/kubelet-$(node_name_of 1).log" \
			in_node "$(node_name_of 1)" curl -skf https://127.0.0.1:10257/healthz
	else
		wait_for "kube-controller-manager /healthz (its static pod)" 180 "$logs/kubelet.log" curl -skf https://127.0.0.1:10257/healthz
	fi
}
step "kube-controller-manager" kcm

dns() {
	sed -e "s|@DNS_IP@|$dns_ip|g" -e "s|@COREDNS_IMAGE@|$coredns_image|g" -e "s|@CLUSTER_DOMAIN@|$cluster_domain|g" \
		"$here/manifests/coredns.yaml" | kctl apply -f - >/dev/null
	kctl -n kube-system rollout status deployment/coredns --timeout=180s >/dev/null
}
step "CoreDNS" dns

kctl get nodes -L topology.kubernetes.io/zone -o wide >&2
kctl get pods -A -o wide >&2
kcm_node=$node_name
if multi_node; then
	kcm_node=$(node_name_of 1)
	cat >&2 <<EOF

$nodes nodes, each in network, mount and UTS namespaces of its own (hack/cluster/nodes.sh), on a bridge in the network namespace $switch_netns ($node_net; the host, and the API server, at $node_gateway:$api_port on $node_bridge)
  a shell on a node: nsenter --net=/run/netns/NAME --mount=$state/nodes/NAME/ns/mnt --uts=$state/nodes/NAME/ns/uts
  each node's own directories (a hostPath below them is the node's): $node_private_dirs
EOF
fi
cat >&2 <<EOF

The cluster is up in $(elapsed $((SECONDS - total_start))) ($(if multi_node; then echo "every node was Ready $(elapsed "$ready_time") after the first node's containerd started"; else echo "the node was Ready $(elapsed "$ready_time") after the kubelet started"; fi)).
  export KUBECONFIG=$admin_kubeconfig
  kubectl (the cluster's version): $kubectl
  images: $pause_image (sandbox), $volplane_image, $etcd_image, $coredns_image, $workload_image, $sidecar_image$(
	[[ ${VOLPLANE_CSI_SIDECARS:-} == 1 ]] && printf ', %s' $(cut -d' ' -f2 "$images_dir/csi-sidecars/images.txt"))
  logs: $logs
  kube-controller-manager: static pod kube-system/kube-controller-manager-$kcm_node, manifest $kcm_manifest_dir/kube-controller-manager.yaml (--controllers=$kcm_controllers)
make cluster-down stops it and removes its state.
EOF
