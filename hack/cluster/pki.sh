#!/usr/bin/env bash
# Writes the local cluster's PKI into DIR with openssl: one CA that signs
# every serving and client certificate (P-256 keys, valid a year), and the
# service-account signing key pair.
#
#   hack/cluster/pki.sh DIR NODE_NAME NODE_IP
#   hack/cluster/pki.sh node DIR NODE_NAME NODE_IP
#
#   ca                        the cluster CA (kube-apiserver's --client-ca-file, the kubelet's clientCAFile)
#   etcd-server               etcd's serving and peer certificate (127.0.0.1)
#   apiserver                 kube-apiserver's serving certificate (the kubernetes Service's names and IP, the node)
#   apiserver-etcd-client     kube-apiserver to etcd
#   apiserver-kubelet-client  kube-apiserver to the kubelet (logs, exec): system:masters
#   admin                     the admin kubeconfig's user: system:masters
#   kube-controller-manager, kube-scheduler, kube-proxy
#                             system:kube-controller-manager, system:kube-scheduler, system:kube-proxy
#   kubelet                   the kubelet's client: system:node:NODE_NAME in system:nodes
#   kubelet-serving           the kubelet's serving certificate (NODE_NAME, NODE_IP)
#   sa.key, sa.pub            service-account token signing
#
# With "node" it adds, with the CA already in DIR, the certificates of one
# more node of a cluster of several (hack/cluster/nodes.sh):
#
#   kubelet-NODE_NAME         its kubelet's client: system:node:NODE_NAME in system:nodes
#   kubelet-serving-NODE_NAME its kubelet's serving certificate (NODE_NAME, NODE_IP)
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
add_node=
if [[ ${1:-} == node ]]; then
	add_node=1
	shift
fi
dir=${1:?usage: $0 DIR NODE_NAME NODE_IP}
node=${2:?usage: $0 DIR NODE_NAME NODE_IP}
node_ip=${3:?usage: $0 DIR NODE_NAME NODE_IP}
days=365

mkdir -p "$dir"
chmod 700 "$dir"
cd "$dir"

key() {
	openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
	chmod 600 "$1"
}

# issue NAME SUBJECT EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES]
issue() {
	local name=$1 subject=$2 eku=$3 sans=${4:-}
	key "$name.key"
	openssl req -new -key "$name.key" -subj "$subject" -out "$name.csr" 2>/dev/null
	{
		echo "basicConstraints = critical, CA:FALSE"
		echo "keyUsage = critical, digitalSignature"
		echo "extendedKeyUsage = $eku"
		[[ -z $sans ]] || echo "subjectAltName = $sans"
	} >"$name.ext"
	openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
		-days "$days" -extfile "$name.ext" -out "$name.crt" 2>/dev/null
	rm -f "$name.csr" "$name.ext"
}

if [[ -n $add_node ]]; then
	[[ -r ca.key ]] || die "$dir/ca.key: no CA to sign $node's certificates"
	issue "kubelet-$node" "/O=system:nodes/CN=system:node:$node" clientAuth
	issue "kubelet-serving-$node" "/O=system:nodes/CN=system:node:$node" serverAuth "DNS:$node, IP:$node_ip"
	exit 0
fi

key ca.key
openssl req -x509 -new -key ca.key -subj "/CN=volplane-cluster-ca" -days "$days" -out ca.crt \
	-addext "basicConstraints = critical, CA:TRUE" \
	-addext "keyUsage = critical, keyCertSign, cRLSign, digitalSignature" 2>/dev/null

issue etcd-server "/CN=etcd" "serverAuth, clientAuth" "DNS:localhost, IP:127.0.0.1"
issue apiserver-etcd-client "/CN=kube-apiserver-etcd-client" clientAuth
issue apiserver "/CN=kube-apiserver" serverAuth \
	"DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.$cluster_domain, DNS:localhost, DNS:$node, IP:$kubernetes_service_ip, IP:127.0.0.1, IP:$node_ip"
issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
issue admin "/O=system:masters/CN=volplane-cluster-admin" clientAuth
issue kube-controller-manager "/CN=system:kube-controller-manager" clientAuth
issue kube-scheduler "/CN=system:kube-scheduler" clientAuth
issue kube-proxy "/CN=system:kube-proxy" clientAuth
issue kubelet "/O=system:nodes/CN=system:node:$node" clientAuth
issue kubelet-serving "/O=system:nodes/CN=system:node:$node" serverAuth "DNS:$node, IP:$node_ip"

key sa.key
openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
