#!/usr/bin/env bash
# Installs the Debian packages the local cluster (make cluster) runs, when
# missing: runc (containerd's runtime), containernetworking-plugins (the CNI
# bridge, host-local and loopback plugins), nftables (kube-proxy's nftables
# mode), iptables (the kubelet's canary chains), conntrack (clearing the
# cluster's connection-tracking entries at teardown), openssl (the PKI) and
# curl (health checks).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
need_root

# package:file-it-installs
wanted=(
	runc:/usr/sbin/runc
	containernetworking-plugins:/usr/lib/cni/bridge
	nftables:/usr/sbin/nft
	iptables:/usr/sbin/iptables
	conntrack:/usr/sbin/conntrack
	openssl:/usr/bin/openssl
	curl:/usr/bin/curl
	ca-certificates:/etc/ssl/certs/ca-certificates.crt
)
missing=()
for w in "${wanted[@]}"; do
	[[ -e ${w#*:} ]] || missing+=("${w%%:*}")
done
((${#missing[@]})) || exit 0
log "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for w in "${wanted[@]}"; do
	[[ -e ${w#*:} ]] || die "package ${w%%:*} installed no ${w#*:}"
done
