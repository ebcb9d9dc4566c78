#!/usr/bin/env bash
# Runs Kubernetes' own storage e2e tests (e2e.test's External Storage
# suites, hack/build-e2e.sh) against the dev CSI driver deployed as a
# vendor's chart deploys it (deploy/drivers/volplane-csi), on the running
# local cluster (hack/cluster/up.sh with VOLPLANE_CSI_SIDECARS=1 and
# kube-controller-manager's binder on), the way csi-driver-host-path's
# release-tools/prow.sh runs them for a CSI driver: e2e.test with
# -storage.testdriver (test/e2e-storage/volplane-csi.yaml), a focus and a
# skip, a JUnit report in a report directory, serially (e2e.test alone,
# not `ginkgo -p`: one node, and the two runs must be comparable).
#
#   hack/e2e-storage.sh ab                # everything below, in order: make test-e2e-storage
#   hack/e2e-storage.sh b                 # images, install, cutover, run B alone: for make test
#   hack/e2e-storage.sh images            # import hack/build-e2e-images.sh's images into the node's containerd
#   hack/e2e-storage.sh install           # the snapshot CRDs and deploy/drivers/volplane-csi, rolled out
#   hack/e2e-storage.sh classes           # the classes the driver file names (its VolumeAttributesClass)
#   hack/e2e-storage.sh run LABEL         # e2e.test -> $E2E_REPORTS/LABEL/junit_01.xml, one line per spec
#   hack/e2e-storage.sh cutover           # to volplane: the sidecar-drivers overlay, csi-provisioner's
#                                         # image swapped to volplane-csi-sidecar, kcm's binder off
#   hack/e2e-storage.sh table A B         # the two runs side by side, spec by spec
#   hack/e2e-storage.sh perf              # the performance suites on A, the cutover, on B,
#                                         # their figures side by side: make bench-e2e-perf
#
# ab runs the focus as A (kube-controller-manager's binder and
# csi-provisioner v6.3.0 in front of the driver), makes the cutover, runs
# it again as B (volplane's binder and provisioner, through
# volplane-csi-sidecar in csi-provisioner's place), and prints the table;
# it fails when a spec fails on B (A's failures are upstream's and the dev
# driver's: printed, not fatal). The cutover is docs/install.md's steps
# (the same blocks test/cluster runs) and driver_cutover_test.go's swap.
#
# Settings (environment):
#   E2E_FOCUS    ginkgo focus (default: External Storage's provisioning, volumes,
#                volumeMode, volume-expand, volume-modify, read-write-once-pod,
#                snapshottable, ephemeral and topology suites on dynamically
#                provisioned volumes, snapshots and generic ephemeral volumes,
#                and test/e2e/storage's PV Protection and PersistentVolumes CSI
#                Conformance (a PV and a claim bound, released, deleted): what
#                goes through a binder and a provisioner; not subPath,
#                fsgroupchangepolicy or volumeIO, which are the kubelet's)
#   E2E_SKIP     ginkgo skip (default: [Slow], [Serial], [Disruptive] as prow.sh's
#                default run, and Windows; [Feature:VolumeSnapshotDataSource] runs,
#                as prow.sh runs it for a driver with snapshots)
#   E2E_DEFAULT_CLASS 1: install makes test/e2e-storage/default-class.yaml the
#                cluster's default StorageClass (PVC Protection needs one; not
#                for make test, whose later phases bind claims without a class)
#   E2E_REPORTS  where the runs' reports go (default bin/e2e-storage)
#   E2E_TIMEOUT  e2e.test's -ginkgo.timeout per run (default 40m)
#   KUBECONFIG   the cluster (default the local cluster's admin.kubeconfig)
#   VOLPLANE_BIN volplane-certs, kubectl-volplane and volplane-e2e-report (default bin/)
#   E2E_FOCUS and E2E_SKIP, when set, replace perf's own too (the two
#                performance suites; only Windows skipped).
#   E2E_PERF_COUNT  perf: the claims each performance suite makes (default the
#                driver file's Count, 80)
#   E2E_PERF_ROUNDS perf: the runs on each side (default 1): A1..An, the cutover, B1..Bn
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=cluster/lib.sh
source "$here/cluster/lib.sh"

e2e_test=$cache/e2e-$KUBE_VERSION/e2e.test
driver_file=$root/test/e2e-storage/volplane-csi.yaml
focus=${E2E_FOCUS:-'External.Storage.*\[Testpattern: (Dynamic PV|Dynamic Snapshot|Generic Ephemeral-volume)[^]]*\] (provisioning|volumes|volumeMode|volume-expand|volume-modify|read-write-once-pod|snapshottable|ephemeral|topology) |\[sig-storage\] (PV Protection|PersistentVolumes CSI Conformance) '}
skip=${E2E_SKIP:-'\[Slow\]|\[Serial\]|\[Disruptive\]|\[Feature:Windows\]'}
reports=${E2E_REPORTS:-$root/bin/e2e-storage}
timeout=${E2E_TIMEOUT:-40m}
bin=${VOLPLANE_BIN:-$root/bin}
export KUBECONFIG=${KUBECONFIG:-$admin_kubeconfig}
export PATH=$kube_dir:$bin:$PATH
snapshot_crds=$cache/csi-sidecars/snapshot-crds
driver_ns=volplane-csi
driver_deployment=volplane-csi-controller
driver_name=hostpath.csi.volplane.io

# import_images: the e2e images into the node's containerd, pinned (as
# up.sh's: no registry could give them back).
import_images() {
	local list=$images_dir/e2e/images.txt tar ref
	[[ -f $list ]] || die "$list is missing: run hack/build-e2e-images.sh"
	while read -r tar ref; do
		"$ctr" --address "$containerd_sock" -n k8s.io images import "$tar" >/dev/null
		"$ctr" --address "$containerd_sock" -n k8s.io images label "$ref" io.cri-containerd.pinned=pinned >/dev/null
		log "imported $ref"
	done <"$list"
}

# classes: the VolumeAttributesClass test/e2e-storage/volplane-csi.yaml
# names, and with E2E_DEFAULT_CLASS=1 a default StorageClass of the driver.
classes() {
	kubectl apply -f "$root/test/e2e-storage/volplane-csi-vac.yaml"
	if [[ ${E2E_DEFAULT_CLASS:-} == 1 ]]; then
		kubectl apply -f "$root/test/e2e-storage/default-class.yaml"
	fi
}

# install_driver: the snapshot CRDs, then the driver's kustomization, as
# test/cluster's installVendorDriver, until the kubelet lists the driver.
install_driver() {
	kubectl apply -f "$(readlink -f "$snapshot_crds")"
	kubectl wait --for=condition=Established --timeout=60s crd/volumesnapshots.snapshot.storage.k8s.io \
		crd/volumesnapshotcontents.snapshot.storage.k8s.io crd/volumesnapshotclasses.snapshot.storage.k8s.io
	kubectl apply -k "$root/deploy/drivers/volplane-csi"
	classes
	kubectl -n "$driver_ns" rollout status --timeout=3m "deployment/$driver_deployment"
	kubectl -n "$driver_ns" rollout status --timeout=3m daemonset/volplane-csi-node
	kubectl -n kube-system rollout status --timeout=3m deployment/snapshot-controller
	local i
	for i in $(seq 60); do
		kubectl get csinodes -o jsonpath='{.items[*].spec.drivers[*].name}' | grep -qw "$driver_name" && return 0
		sleep 2
	done
	die "no CSINode lists $driver_name"
}

# run_e2e LABEL: e2e.test with the focus and the skip, its log and JUnit
# report in $reports/LABEL, then one line per spec, and who provisioned:
# the run's provisioning Events counted by reason and source
# (csi-provisioner's and kube-controller-manager's on A, volplane's on B).
run_e2e() {
	local label=$1 dir=$reports/$1 rc=0 start=$SECONDS events
	[[ -x $e2e_test ]] || die "$e2e_test is missing: run hack/build-e2e.sh"
	rm -rf "$dir" && mkdir -p "$dir"
	kubectl get events -A --watch-only --no-headers \
		-o 'custom-columns=REASON:.reason,SOURCE:.source.component,REPORTER:.reportingComponent' >"$dir/events.txt" 2>&1 &
	events=$!
	log "e2e.test run $label: focus $focus, skip $skip (log: $dir/e2e.log)"
	(cd "$dir" && "$e2e_test" -kubeconfig "$KUBECONFIG" -provider local -kubectl-path "$kube_dir/kubectl" \
		-storage.testdriver "$driver_file" -report-dir "$dir" \
		-ginkgo.focus "$focus" -ginkgo.skip "$skip" -ginkgo.timeout "$timeout" -ginkgo.v \
		-ginkgo.no-color >"$dir/e2e.log" 2>&1) || rc=$?
	log "e2e.test run $label: exit $rc after $(elapsed $((SECONDS - start)))"
	kill "$events" 2>/dev/null && wait "$events" 2>/dev/null || true
	log "run $label's provisioning Events (count, reason, source: csi-provisioner's and volplane's name their pod):"
	grep -E '^(ExternalProvisioning|Provisioning|ProvisioningSucceeded|ProvisioningFailed) ' "$dir/events.txt" |
		awk '{print $1, $2}' | sed -E 's/_([^_ ]+)_[^ ]+$/_\1/' | sort | uniq -c | sed 's/^/    /' >&2 || true
	[[ -f $dir/junit_01.xml ]] || die "run $label wrote no JUnit report; the end of $dir/e2e.log:$(tail -n 30 "$dir/e2e.log")"
	echo "$((SECONDS - start))" >"$dir/seconds"
	"$bin/volplane-e2e-report" summary "$dir/junit_01.xml" || true
	return "$rc"
}

# step_of NAME: docs/install.md's block after <!-- step: NAME -->.
step_of() {
	awk -v m="<!-- step: $1 -->" '$0 == m { getline; on = 1; next } on && /^```$/ { exit } on' "$root/docs/install.md"
}

# install_step NAME: runs docs/install.md's step NAME after its settings,
# as test/cluster's Install.Run does.
install_step() {
	local script
	script="set -euo pipefail
$(step_of settings)
set -x
$(step_of "$1")"
	mkdir -p "$reports/install"
	(cd "$reports/install" && OVERLAY="$root/deploy/overlays/one-node" SIDECAR_IMAGE="$sidecar_image" \
		VOLPLANE_CA_DIR="$state/volplane-ca" CLUSTER_CA="$pki/ca.crt" \
		KCM_MANIFEST="$kcm_manifest_dir/kube-controller-manager.yaml" bash -c "$script")
}

# provisioner_image: the image of the driver's csi-provisioner container.
provisioner_image() {
	kubectl -n "$driver_ns" get "deployment/$driver_deployment" \
		-o jsonpath='{.spec.template.spec.containers[?(@.name=="csi-provisioner")].image}'
}

# wait_discovered: every volplane provisioner logged that it uses the
# driver's sidecar (as test/cluster's waitDiscovered).
wait_discovered() {
	local i p pods ok
	for i in $(seq 60); do
		pods=$(kubectl -n volplane-system get pods -l app=volplane-provisioner -o name)
		ok=1
		for p in $pods; do
			kubectl -n volplane-system logs "$p" | grep 'volplane-csi-sidecar registered' | grep -q "driver=$driver_name" || ok=0
		done
		[[ -n $pods && $ok == 1 ]] && return 0
		sleep 3
	done
	die "volplane's provisioners did not find the sidecar of $driver_name"
}

# cutover: docs/install.md's own steps, in its order: volplane installed
# beside the driver (its binder at 0), the grant that lets the driver's
# ServiceAccount serve it, every part rolled out; the flip (csi-provisioner's
# image swapped to volplane-csi-sidecar, kube-controller-manager's binder
# off, volplane's on); then the provisioners use the sidecar. No claim
# exists between the runs, so the window without a binder does not matter
# here (test/cluster measures it). The steps run in the state directory,
# where swap-sidecars keeps the driver's own image.
cutover() {
	local start=$SECONDS step
	for step in apply grant-sidecars rollout swap-sidecars kcm-binder-off kcm-wait binder-on; do
		install_step "$step"
	done
	wait_discovered
	log "cutover: kube-controller-manager's binder off, csi-provisioner is $(provisioner_image), volplane serves $driver_name ($(elapsed $((SECONDS - start))))"
}

# perf_focus: Kubernetes' two performance suites (volumeperf.go and
# pvcdeletionperf.go), which are [Slow] and [Serial]: only Windows is
# skipped.
perf_focus='External.Storage.*\] (volume-lifecycle-performance|pvc-deletion-performance) '

# perf_driver_file: the driver file, or with E2E_PERF_COUNT a copy of it
# in the reports whose PerformanceTestOptions ask for that many claims.
perf_driver_file() {
	local count=${E2E_PERF_COUNT:-}
	[[ -n $count ]] || return 0
	[[ $count =~ ^[1-9][0-9]*$ ]] || die "E2E_PERF_COUNT=$count is not a count"
	mkdir -p "$reports"
	sed -E "s/^( +Count:) [0-9]+$/\1 $count/" "$driver_file" >"$reports/volplane-csi-perf.yaml"
	grep -q "^ *Count: $count$" "$reports/volplane-csi-perf.yaml" || die "no Count in $driver_file"
	driver_file=$reports/volplane-csi-perf.yaml
}

# dump_state: the cluster's pods and volplane's latest Events, on the
# standard error, when perf fails (the cluster is taken down after it).
dump_state() {
	log "perf failed; the cluster's state:"
	kubectl get nodes -o wide || true
	kubectl get pods -A -o wide || true
	kubectl -n volplane-system get events --sort-by=.lastTimestamp | tail -n 40 || true
	kubectl -n volplane-system describe pods | grep -A25 '^Events:' | tail -n 80 || true
}

# perf: the performance suites E2E_PERF_ROUNDS times on A, the cutover,
# as many times on B, then their figures side by side (the suites'
# own: volumeperf's average latency and throughput, pvcdeletionperf's
# deletion times), and each spec's result. Fails when a run logged no
# figures or a spec failed on B (volumeperf fails below upstream's
# baseline); A's failures are printed, not fatal.
perf() {
	local rounds=${E2E_PERF_ROUNDS:-1} t0=$SECONDS t r rc=0 parts=() runs=() junits=()
	[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "E2E_PERF_ROUNDS=$rounds is not a count"
	trap 'rc=$?; ((rc == 0)) || dump_state >&2; exit $rc' EXIT
	focus=${E2E_FOCUS:-$perf_focus} skip=${E2E_SKIP:-'\[Feature:Windows\]'}
	perf_driver_file
	step "import the e2e images" import_images
	step "install the driver (deploy/drivers/volplane-csi)" install_driver
	parts+=("setup $(elapsed $((SECONDS - t0)))")
	for r in $(seq "$rounds"); do
		t=$SECONDS
		log "==> A$r: kube-controller-manager's binder + csi-provisioner"
		run_e2e "A$r" || log "run A$r failed (upstream's baseline or the dev driver: see its log)"
		parts+=("A$r $(elapsed $((SECONDS - t)))") runs+=("A$r=$reports/A$r/e2e.log") junits+=("A$r=$reports/A$r/junit_01.xml")
	done
	t=$SECONDS
	step "cutover to volplane" cutover
	parts+=("cutover $(elapsed $((SECONDS - t)))")
	for r in $(seq "$rounds"); do
		t=$SECONDS
		log "==> B$r: volplane through volplane-csi-sidecar"
		run_e2e "B$r" || rc=$?
		parts+=("B$r $(elapsed $((SECONDS - t)))") runs+=("B$r=$reports/B$r/e2e.log") junits+=("B$r=$reports/B$r/junit_01.xml")
	done
	"$bin/volplane-e2e-report" table "${junits[@]}" || true
	"$bin/volplane-e2e-report" perf "${runs[@]}" || rc=1
	"$bin/volplane-e2e-report" perf -markdown "${runs[@]}" >"$reports/perf.md" || true
	log "the figures in Markdown: $reports/perf.md"
	log "times: ${parts[*]}"
	return "$rc"
}

table() {
	local args=() l
	for l in "$@"; do args+=("$l=$reports/$l/junit_01.xml"); done
	"$bin/volplane-e2e-report" table "${args[@]}"
	"$bin/volplane-e2e-report" table -markdown "${args[@]}" >"$reports/table.md"
	log "the table in Markdown: $reports/table.md"
}

# ab: A, the cutover, B, the table; the times of each part.
ab() {
	local t0=$SECONDS t rc=0 parts=()
	step "import the e2e images" import_images
	step "install the driver (deploy/drivers/volplane-csi)" install_driver
	parts+=("setup $(elapsed $((SECONDS - t0)))")
	t=$SECONDS
	log "==> A: kube-controller-manager's binder + csi-provisioner"
	run_e2e A || log "run A failed (upstream or the dev driver: see the table)"
	parts+=("A $(elapsed $((SECONDS - t)))")
	t=$SECONDS
	step "cutover to volplane" cutover
	parts+=("cutover $(elapsed $((SECONDS - t)))")
	t=$SECONDS
	log "==> B: volplane through volplane-csi-sidecar"
	run_e2e B || rc=$?
	parts+=("B $(elapsed $((SECONDS - t)))")
	table A B || rc=1
	log "times: ${parts[*]}"
	return "$rc"
}

# b: the driver, the cutover and run B alone, for make test: fails when a
# spec fails on B. The one spec this host cannot pass on either side
# (docs/testing.md: no process may enter PID 1's mount namespace) is
# skipped.
b() {
	step "import the e2e images" import_images
	step "install the driver (deploy/drivers/volplane-csi)" install_driver
	step "cutover to volplane" cutover
	skip="$skip|volumeMode should not mount / map unused volumes in a pod"
	run_e2e B
}

case ${1:-} in
ab) ab ;;
b) b ;;
images) import_images ;;
install) install_driver ;;
classes) classes ;;
run) run_e2e "${2:?usage: $0 run LABEL}" ;;
cutover) cutover ;;
table) shift && table "$@" ;;
perf) perf ;;
*) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2 && exit 2 ;;
esac
