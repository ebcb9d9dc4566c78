# volplane: the Kubernetes volume control plane as separate services.
# `make help` lists the targets.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

BIN          := $(CURDIR)/bin
GO           ?= go
# The images' tag (make images); deploy/kubernetes/kustomization.yaml pins the same.
VERSION      ?= 0.1.0
# What --version prints and the startup log line says (pkg/version).
COMMIT       ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
VERSION_LDFLAGS := -X github.com/volplane/volplane/pkg/version.Version=v$(VERSION) -X github.com/volplane/volplane/pkg/version.Commit=$(COMMIT)
# Pinned tool versions, installed into ./bin with `go install`.
BUF_VERSION             := v1.75.0
STATICCHECK_VERSION     := v0.8.2
PROTOC_GEN_GO_VERSION   := v1.36.12
PROTOC_GEN_GRPC_VERSION := v1.6.0
GRPC_GATEWAY_VERSION    := v2.33.0
# The Helm that lints and renders the chart (make verify-chart).
HELM_VERSION            := v4.3.2
# The CSI conformance suite run against the dev CSI driver (internal/devcsi).
CSI_SANITY_VERSION      := v5.6.0
# promtool, which checks and unit-tests the alerting rules (make verify-alerts).
PROMETHEUS_VERSION      := v0.316.0
# The kube-apiserver the local environment and the end-to-end tests run.
KUBE_VERSION            := v1.36.3
# Where heavy builds are cached across clones (git-ignored, outside the tree).
VOLPLANE_CACHE          ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/volplane
# One `go build` makes every Kubernetes command into KUBE_DIR (make kube);
# kube-apiserver-VERSION and kube-controller-manager-VERSION link to it.
KUBE_DIR                := $(VOLPLANE_CACHE)/kube-$(KUBE_VERSION)
KUBE_APISERVER          := $(VOLPLANE_CACHE)/kube-apiserver-$(KUBE_VERSION)
# Only for the comparison benchmarks (make bench-kcm, bench-external-provisioner, bench-rate-kcm, bench-scale).
KUBE_CONTROLLER_MANAGER := $(VOLPLANE_CACHE)/kube-controller-manager-$(KUBE_VERSION)
EXTERNAL_PROVISIONER_VERSION := v6.3.0
# The previous release (hack/prev-release, a commit of this clone's
# history): make verify-breaking checks the protos against it, make
# test-skew runs its services beside HEAD's (docs/compatibility.md#version-skew).
PREV_RELEASE := $(shell cat hack/prev-release)
CSI_PROVISIONER         := $(VOLPLANE_CACHE)/csi-provisioner-$(EXTERNAL_PROVISIONER_VERSION)
# What ships: the services, the gateway, the dev CSI driver and the kubectl
# plugin (make verify-deps keeps etcd's server out of them). The etcd
# image's volplane-etcd-member and volplane-etcd-backup embed etcd's
# server by design and are not listed.
PRODUCT_BINARIES = ./services/watcher/cmd/watcher ./services/binder/cmd/binder ./services/provisioner/cmd/provisioner \
	./services/reclaimer/cmd/reclaimer ./gateway/cmd/gateway ./cmd/volplane-csi ./cmd/kubectl-volplane ./cmd/volplane-certs \
	./cmd/volplane-csi-sidecar
export VOLPLANE_KUBE_APISERVER := $(KUBE_APISERVER)
export VOLPLANE_CSI_SANITY := $(BIN)/csi-sanity

BINARIES := watcher binder provisioner reclaimer gateway volplane-csi volplane-csi-sidecar volplane-dev volplane-bench volplane-etcd volplane-chaos kubectl-volplane volplane-conformance volplane-certs \
	volplane-etcd-member volplane-etcd-backup
# Benchmark size: `make bench N=10000`.
N ?= 1000
# kube-controller-manager's client QPS in `make bench-kcm` (its default is 20).
KCM_QPS ?= 1000
# `make bench`: rounds of volplane and of the bare-client ceiling, interleaved A/B.
ROUNDS ?= 2
# `make bench-rate`: arrival rates (claims/s) and how long claims arrive at each.
RATES ?= 25,50,100,150,200
RATE_DURATION ?= 30s
# Volumes that exist before the services start (`make bench-scale`; EXISTING=0 elsewhere unless set).
EXISTING ?= 0
SCALE_EXISTING ?= 100000
# Where the bench's processes run: shared (any CPU) or split (kube-apiserver and etcd on
# the first half of the CPUs; everything else on the others). See docs/benchmarks.md.
PLACEMENT ?= shared
# `make bench-replicas`: the binder replica counts measured.
REPLICAS ?= 1 2 3
# `make bench-compare`: burst sizes, each run static then dynamic.
SIZES ?= 1000,10000
# `make bench-profile`: where the CPU profiles go (one directory per run).
PROFILE_DIR ?= $(BIN)/profiles
# and how long each burst is profiled from its first create: longer than the burst, to cover it all.
PROFILE_SECONDS ?= 30
# More volplane-dev flags for `make up`, e.g. DEV_FLAGS=--driver-fault=CreateVolume=delay:3s.
DEV_FLAGS ?=
# More volplane-bench flags for every bench target, e.g. BENCH_FLAGS=--workers=64.
BENCH_FLAGS ?=
VOLPLANE_BENCH = $(BIN)/volplane-bench --bin-dir $(BIN) --kube-apiserver $(KUBE_APISERVER) --placement $(PLACEMENT) $(BENCH_FLAGS)
KCM_FLAGS = --kube-controller-manager $(KUBE_CONTROLLER_MANAGER) --kcm-qps $(KCM_QPS)

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-24s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Run

.PHONY: up
up: build kube-apiserver ## Start etcd, kube-apiserver, every service and the gateway on loopback (Ctrl-C stops).
	$(BIN)/volplane-dev --bin-dir $(BIN) --kube-apiserver $(KUBE_APISERVER) $(DEV_FLAGS)

# The platforms make images builds (hack/build-images.sh cross-compiles).
PLATFORMS ?= linux/amd64,linux/arm64

.PHONY: images
images: ## Build the images of hack/images.txt FROM scratch (ghcr.io/volplane/NAME:VERSION) for PLATFORMS as OCI image index tars in .cache/images, with no registry, Docker or Kubernetes build; load them into Docker when a daemon answers; list them with their platforms.
	PLATFORMS=$(PLATFORMS) hack/build-images.sh $(VERSION)

.PHONY: docker-daemon
docker-daemon: ## Install Debian's docker.io and docker-compose when missing and start dockerd (as root).
	@command -v dockerd >/dev/null && command -v docker-compose >/dev/null || \
		DEBIAN_FRONTEND=noninteractive apt-get install -y docker.io docker-compose
	@# dockerd outlives make: it keeps none of make's descriptors above 2 (a
	@# caller's flock on the cluster's lock would be held for good).
	@if ! docker info >/dev/null 2>&1; then \
		mkdir -p $(VOLPLANE_CACHE); \
		( for fd in $$(ls /proc/$$BASHPID/fd); do [ "$$fd" -gt 2 ] && eval "exec $$fd>&-"; done; \
		  exec nohup dockerd >$(VOLPLANE_CACHE)/dockerd.log 2>&1 ) & \
		for i in $$(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done; \
	fi
	@docker info >/dev/null 2>&1 && echo "Docker daemon running" || { echo "dockerd did not start: see $(VOLPLANE_CACHE)/dockerd.log" >&2; exit 1; }

.PHONY: build
build: ## Build every binary into ./bin (kubectl-volplane too: put ./bin on the PATH for `kubectl volplane`).
	@mkdir -p $(BIN)
	$(GO) build -ldflags '$(VERSION_LDFLAGS)' -o $(BIN)/ ./services/watcher/cmd/watcher ./services/binder/cmd/binder \
		./services/provisioner/cmd/provisioner ./services/reclaimer/cmd/reclaimer \
		./gateway/cmd/gateway ./cmd/volplane-csi ./test/cmd/volplane-dev ./test/cmd/volplane-bench \
		./test/cmd/volplane-etcd ./test/cmd/volplane-chaos ./cmd/kubectl-volplane ./cmd/volplane-conformance ./cmd/volplane-certs \
		./cmd/volplane-etcd-member ./cmd/volplane-etcd-backup ./cmd/volplane-csi-sidecar
	@# kubectl completes `kubectl volplane ...` by running kubectl_complete-volplane from the PATH.
	ln -sf kubectl-volplane $(BIN)/kubectl_complete-volplane

.PHONY: kube kube-apiserver
kube: ## Build the pinned Kubernetes commands (kube-apiserver, -controller-manager, -scheduler, -proxy, kubelet, kubectl) once into the cache, in one go build (~30 min).
	hack/build-kube.sh $(KUBE_VERSION) $(KUBE_DIR)
kube-apiserver: $(KUBE_APISERVER) ## Build the pinned kube-apiserver (make kube) once into the cache.
$(KUBE_APISERVER):
	hack/build-kube.sh $(KUBE_VERSION) $(KUBE_DIR)

.PHONY: external-provisioner
external-provisioner: $(CSI_PROVISIONER) ## Build the pinned CSI external-provisioner (csi-provisioner) into the cache (for bench-external-provisioner).
$(CSI_PROVISIONER):
	hack/build-external-provisioner.sh $(EXTERNAL_PROVISIONER_VERSION) $@

.PHONY: kube-controller-manager
kube-controller-manager: $(KUBE_CONTROLLER_MANAGER) ## Build the pinned kube-controller-manager (make kube) into the cache (for bench-kcm).
$(KUBE_CONTROLLER_MANAGER):
	hack/build-kube.sh $(KUBE_VERSION) $(KUBE_DIR)

##@ Cluster

# The local single-node cluster (hack/cluster/README.md): its state lives
# in CLUSTER_DIR and the kubelet's directory, its builds in VOLPLANE_CACHE.
CLUSTER_DIR ?= /var/lib/volplane-cluster
# NODES=3: a cluster of three nodes, each in namespaces of its own on a
# bridge the cluster creates, in zones zone-a, zone-b, zone-c
# (hack/cluster/nodes.sh); 1, the default, is the single node on the host.
NODES ?= 1
CLUSTER_ENV  = VERSION=$(VERSION) KUBE_VERSION=$(KUBE_VERSION) VOLPLANE_CACHE=$(VOLPLANE_CACHE) VOLPLANE_CLUSTER_DIR=$(CLUSTER_DIR) VOLPLANE_CLUSTER_NODES=$(NODES)
CLUSTER_TEST_ENV = VOLPLANE_CLUSTER_KUBECONFIG=$(CLUSTER_DIR)/admin.kubeconfig VOLPLANE_KUBECTL=$(KUBE_DIR)/kubectl \
	VOLPLANE_WORKLOAD_IMAGE=ghcr.io/volplane/workload:$(VERSION) VOLPLANE_CLUSTER_DIR=$(CLUSTER_DIR) VOLPLANE_BIN=$(BIN)

.PHONY: cluster cluster-down test-cluster-smoke test-cluster test-cluster-multi
cluster: ## Start a Kubernetes cluster from pinned parts (kubelet, containerd, CoreDNS...; as root), one node or NODES=3, and say how to reach it.
	$(CLUSTER_ENV) hack/cluster/up.sh
cluster-down: ## Stop the cluster and undo what it changed on the host (processes, mounts, network, cgroups, sysctls, state).
	$(CLUSTER_ENV) hack/cluster/down.sh
# The cluster of several nodes (NODES, 3 unless given) and its smoke test:
# the nodes Ready in their zones, pods and Services across nodes, each
# node's own hostPath directories; then volplane spread over the nodes,
# drains, and a node killed as by a power loss (hack/cluster/node.sh)
# while claims bind, then one short storm of make chaos-cluster (seed 1,
# 75s: test/cluster TestMultiNode).
test-cluster-multi: ## make cluster NODES=3 with the upstream CSI sidecars and kube-controller-manager's binder; its smoke test, distributed provisioning (csi-provisioner and volplane-csi-sidecar --node-deployment side by side), volplane spread, drains, a node (an etcd member, a zone) killed while claims bind and brought back, a short seeded chaos storm; then make cluster-down even when it fails.
	@trap 'rc=$$?; $(CLUSTER_ENV) hack/cluster/down.sh || rc=1; exit $$rc' EXIT; \
	start=$$(date +%s); \
	$(GO) build -o $(BIN)/ ./cmd/volplane-certs && \
	$(CLUSTER_ENV) VOLPLANE_CLUSTER_NODES=$(if $(filter 1,$(NODES)),3,$(NODES)) VOLPLANE_CSI_SIDECARS=1 KCM_CONTROLLERS='*,bootstrapsigner,tokencleaner' hack/cluster/up.sh && \
	$(CLUSTER_TEST_ENV) VOLPLANE_CLUSTER_NODES=$(if $(filter 1,$(NODES)),3,$(NODES)) VOLPLANE_SNAPSHOT_CRDS=$(VOLPLANE_CACHE)/csi-sidecars/snapshot-crds \
		$(GO) test -count=1 -v -timeout 40m -run '^TestMultiNode$$' ./test/cluster/ || rc=$$?; \
	echo "make test-cluster-multi: $$(( $$(date +%s) - start ))s, then make cluster-down"; exit $${rc:-0}
# The storm in the cluster of several nodes (docs/chaos.md): the cluster
# of test-cluster-multi, TestMultiNode's subtests that install the
# distributed dev driver and volplane spread over the nodes, then its
# subtest chaos: per seed of SEEDS (SEED unless set), DURATION of faults
# (volplane pods deleted, nodes killed and restarted, etcd members
# deleted, kube-apiserver restarted) while a StatefulSet keeps data and
# claims come and go, and the table of invariants.
SEEDS ?= $(SEED)
.PHONY: chaos-cluster
chaos-cluster: ## make cluster NODES=3 and volplane spread over it as test-cluster-multi does; a seeded storm (SEED or SEEDS="1 2 3", DURATION each) of pod deletions, node kills, etcd member deletions and kube-apiserver restarts with claims in flight; the invariant table, non-zero on a violation; make cluster-down even when it fails.
	@trap 'rc=$$?; $(CLUSTER_ENV) hack/cluster/down.sh || rc=1; exit $$rc' EXIT; \
	start=$$(date +%s); \
	$(GO) build -o $(BIN)/ ./cmd/volplane-certs && \
	$(CLUSTER_ENV) VOLPLANE_CLUSTER_NODES=$(if $(filter 1,$(NODES)),3,$(NODES)) VOLPLANE_CSI_SIDECARS=1 KCM_CONTROLLERS='*,bootstrapsigner,tokencleaner' hack/cluster/up.sh && \
	$(CLUSTER_TEST_ENV) VOLPLANE_CLUSTER_NODES=$(if $(filter 1,$(NODES)),3,$(NODES)) VOLPLANE_SNAPSHOT_CRDS=$(VOLPLANE_CACHE)/csi-sidecars/snapshot-crds \
		VOLPLANE_CHAOS_SEEDS='$(SEEDS)' VOLPLANE_CHAOS_DURATION=$(DURATION) \
		$(GO) test -count=1 -v -timeout 6h -run '^TestMultiNode$$/^(nodes_Ready_in_their_zones|distributed_provisioning|chaos)$$' ./test/cluster/ || rc=$$?; \
	echo "make chaos-cluster: $$(( $$(date +%s) - start ))s, then make cluster-down"; exit $${rc:-0}
test-cluster-smoke: ## make cluster, its smoke test (node, DNS, volumes, token, logs, exec), then make cluster-down even when it fails.
	@trap 'rc=$$?; $(CLUSTER_ENV) hack/cluster/down.sh || rc=1; exit $$rc' EXIT; \
	$(CLUSTER_ENV) hack/cluster/up.sh; \
	$(CLUSTER_TEST_ENV) $(GO) test -count=1 -v -timeout 20m -run '^TestSmoke$$' ./test/cluster/
# The one cluster test, on one fresh cluster started with the upstream CSI
# sidecars (hack/build-csi-sidecars.sh) and kube-controller-manager as
# kubeadm's (its binder on): the dev CSI driver deployed as a vendor's
# chart does (deploy/drivers/volplane-csi) and its workloads; volplane
# installed beside it by docs/install.md's steps (deploy/overlays/one-node)
# and the flip to volplane-csi-sidecar; the checks after the cutover,
# workloads, faults and defects; the rollback and managed mode
# (test/cluster TestCluster).
# Its phase kubernetes-e2e runs Kubernetes' storage e2e tests on volplane
# (run B of make test-e2e-storage: hack/e2e-storage.sh run B).
# PREV_IMAGE, the previous release's image, runs TestCluster's phase
# upgrade (the previous release to HEAD one component at a time and back,
# with claims in flight): up.sh builds it from git history (hack/cluster/
# build.sh prev, cached under $(VOLPLANE_CACHE)/cluster-images) and imports
# it. PREV_IMAGE= leaves it out; a clone without the commit (a shallow one)
# gets no image and the phase says SKIP. Its last step, back to HEAD, is
# helm upgrade --install of deploy/helm/volplane ($(BIN)/helm). CLUSTER_RUN picks the tests or
# phases, e.g. CLUSTER_RUN='TestCluster/(before|install|upgrade)$'.
PREV_IMAGE ?= ghcr.io/volplane/volplane:$(VERSION)-prev
CLUSTER_RUN ?= ^(TestInstallDocSteps|TestCluster)$$
test-cluster: e2e-test e2e-images $(BIN)/helm ## make cluster with the upstream CSI sidecars; the dev driver as a vendor ships it, volplane installed and cut over by docs/install.md, Kubernetes' storage e2e tests on it, workloads, faults, defects, the upgrade from the previous release and back (its last step a Helm install), the etcd restore drill, rollback, managed mode (test/cluster TestCluster); make cluster-down even when it fails.
	@trap 'rc=$$?; $(CLUSTER_ENV) hack/cluster/down.sh || rc=1; exit $$rc' EXIT; \
	start=$$(date +%s); \
	$(GO) build -o $(BIN)/ ./cmd/volplane-certs ./cmd/kubectl-volplane ./test/cmd/volplane-e2e-report && \
	$(CLUSTER_ENV) VOLPLANE_CSI_SIDECARS=1 VOLPLANE_PREV_IMAGE=$(PREV_IMAGE) KCM_CONTROLLERS='*,bootstrapsigner,tokencleaner' hack/cluster/up.sh && \
	prev=$$(test -f $(VOLPLANE_CACHE)/cluster-images/volplane-prev.tar && echo '$(PREV_IMAGE)' || true) && \
	$(CLUSTER_ENV) $(CLUSTER_TEST_ENV) VOLPLANE_SNAPSHOT_CRDS=$(VOLPLANE_CACHE)/csi-sidecars/snapshot-crds VOLPLANE_E2E_STORAGE=1 \
		VOLPLANE_PREV_IMAGE=$$prev VOLPLANE_HELM=$(BIN)/helm $(GO) test -count=1 -v -timeout 90m -run '$(CLUSTER_RUN)' ./test/cluster/; \
	rc=$$?; echo "make test-cluster: $$(( $$(date +%s) - start ))s, then make cluster-down"; exit $$rc

# The vendor driver's cutover, rollback and managed mode are phases of
# make test-cluster since one bring-up serves every cluster test.
.PHONY: test-cluster-driver
test-cluster-driver: test-cluster ## The old name of make test-cluster (its phases before, install, after, rollback, managed).

# Kubernetes' own storage tests (e2e.test's External Storage suites,
# built from the pinned k8s.io/kubernetes) against the dev driver deployed
# as a vendor's chart deploys it: run A with kube-controller-manager's
# binder and csi-provisioner v6.3.0, the cutover, run B with volplane
# through volplane-csi-sidecar, and the two side by side
# (hack/e2e-storage.sh, docs/testing.md). E2E_FOCUS and E2E_SKIP choose
# the specs.
.PHONY: e2e-test e2e-images test-e2e-storage
e2e-test: ## Build Kubernetes' e2e.test (KUBE_VERSION) once into the cache (hack/build-e2e.sh, ~5 min on idle cores).
	KUBE_VERSION=$(KUBE_VERSION) VOLPLANE_CACHE=$(VOLPLANE_CACHE) hack/build-e2e.sh
e2e-images: ## Build the images the storage e2e tests start (busybox, agnhost) FROM scratch under their upstream names.
	KUBE_VERSION=$(KUBE_VERSION) VOLPLANE_CACHE=$(VOLPLANE_CACHE) hack/build-e2e-images.sh
test-e2e-storage: e2e-test e2e-images ## make cluster with the vendor-deployed dev driver, Kubernetes' storage e2e tests on kcm + csi-provisioner (A) then on volplane (B), the A/B table, make cluster-down (as root).
	@trap 'rc=$$?; $(CLUSTER_ENV) hack/cluster/down.sh || rc=1; exit $$rc' EXIT; \
	start=$$(date +%s); rc=0; \
	$(GO) build -o $(BIN)/ ./cmd/volplane-certs ./cmd/kubectl-volplane ./test/cmd/volplane-e2e-report && \
	$(CLUSTER_ENV) VOLPLANE_CSI_SIDECARS=1 KCM_CONTROLLERS='*,bootstrapsigner,tokencleaner' hack/cluster/up.sh && \
	$(CLUSTER_ENV) VOLPLANE_BIN=$(BIN) hack/e2e-storage.sh ab || rc=$$?; \
	echo "make test-e2e-storage: $$(( $$(date +%s) - start ))s, then make cluster-down"; exit $$rc

# Kubernetes' performance suites (volumeperf.go's volume-lifecycle-performance,
# pvcdeletionperf.go's pvc-deletion-performance) as a benchmark: on A, the
# cutover, on B, the suites' own figures side by side (hack/e2e-storage.sh
# perf, docs/benchmarks.md). Not in make test. E2E_PERF_COUNT (claims a
# suite, default the driver file's 80) and E2E_PERF_ROUNDS (runs a side).
.PHONY: bench-e2e-perf
bench-e2e-perf: e2e-test e2e-images ## make cluster, Kubernetes' storage performance suites on kcm + csi-provisioner (A) then on volplane (B), their figures side by side, make cluster-down (as root; not in make test).
	@trap 'rc=$$?; $(CLUSTER_ENV) hack/cluster/down.sh || rc=1; exit $$rc' EXIT; \
	start=$$(date +%s); rc=0; \
	$(GO) build -o $(BIN)/ ./cmd/volplane-certs ./cmd/kubectl-volplane ./test/cmd/volplane-e2e-report && \
	$(CLUSTER_ENV) VOLPLANE_CSI_SIDECARS=1 KCM_CONTROLLERS='*,bootstrapsigner,tokencleaner' hack/cluster/up.sh && \
	$(CLUSTER_ENV) VOLPLANE_BIN=$(BIN) E2E_REPORTS=$${E2E_REPORTS:-$(BIN)/e2e-perf} hack/e2e-storage.sh perf || rc=$$?; \
	echo "make bench-e2e-perf: $$(( $$(date +%s) - start ))s, then make cluster-down"; exit $$rc

##@ Test

.PHONY: test
# internal/csisidecar compares its flags with the pinned csi-provisioner's --help;
# test/e2e/nodedeploy runs it with --node-deployment beside volplane's sidecars.
test: export VOLPLANE_CSI_PROVISIONER := $(CSI_PROVISIONER)
# test/e2e/standalone runs beside the pinned kube-controller-manager (the same build as kube-apiserver).
test: export VOLPLANE_KUBE_CONTROLLER_MANAGER := $(KUBE_CONTROLLER_MANAGER)
test: verify kube-apiserver kube-controller-manager external-provisioner $(BIN)/csi-sanity ## Run every check and test (the CI command): the Go tests, then make test-cluster (as root), then make test-compose (starting dockerd where Docker is installed).
	$(GO) test -count=1 -timeout 25m ./...
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory test-cluster; \
	else echo "test-cluster: SKIPPED, it runs a kubelet and needs root"; fi
	@$(MAKE) --no-print-directory test-compose-auto

# make test's compose step. Docker installed (dockerd on the PATH) but not
# running: start it, as test-cluster starts its own runtime; SKIPPED only
# without Docker.
.PHONY: test-compose-auto
test-compose-auto: ## make test's compose step: start dockerd where Docker is installed but not running (as root), then make test-compose and its time; SKIPPED only where Docker is absent.
	@if ! docker info >/dev/null 2>&1 && command -v dockerd >/dev/null && [ "$$(id -u)" = 0 ]; then \
		$(MAKE) --no-print-directory docker-daemon; fi
	@if docker info >/dev/null 2>&1; then start=$$(date +%s); \
		$(MAKE) --no-print-directory test-compose; echo "make test-compose: $$(( $$(date +%s) - start ))s"; \
	elif command -v dockerd >/dev/null; then echo "test-compose: SKIPPED, dockerd is installed but not running, and starting it needs root"; \
	else echo "test-compose: SKIPPED, Docker is not installed (make docker-daemon installs Debian's docker.io and starts it)"; fi

.PHONY: test-compose compose-images
compose-images: kube-apiserver images ## make images (loaded into Docker), and the cached kube-apiserver as the harness image localhost/volplane-kube-apiserver:KUBE_VERSION that docker-compose.yaml runs.
	hack/build-compose-image.sh $(KUBE_APISERVER) $(KUBE_VERSION)
test-compose: build compose-images ## Bring docker-compose.yaml up in containers, bind, provision and reclaim through it, check them through the gateway, tear it down.
	VOLPLANE_COMPOSE=1 VOLPLANE_BIN=$(BIN) $(GO) test -count=1 -timeout 15m -v -run TestComposeStack ./test/compose/

# How long `make fuzz` runs each Go fuzz target (their seed corpora run in `make test`).
FUZZTIME ?= 30s
FUZZ_TARGETS := ./gateway:FuzzRequest ./gateway:FuzzValidateParams \
	./services/provisioner:FuzzValidateProvision ./services/provisioner:FuzzValidateDeleteVolume \
	./services/reclaimer:FuzzValidateReclaim ./services/reclaimer:FuzzAllowedPath ./services/reclaimer:FuzzBelow \
	./pkg/kube:FuzzDecode ./pkg/guard:FuzzCheckName

.PHONY: fuzz
fuzz: ## Fuzz every request decoder and validator for FUZZTIME each (30s).
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "== $$fn ($$pkg)"; $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg; done

.PHONY: compare-kcm
compare-kcm: kube-apiserver kube-controller-manager ## Run the fidelity checks (test/harness/e2e: in-tree classes, WaitForPodScheduled) on kube-controller-manager itself; make test runs them only when it is cached.
	VOLPLANE_KUBE_CONTROLLER_MANAGER=$(KUBE_CONTROLLER_MANAGER) $(GO) test -count=1 -v ./test/e2e/kcm/

.PHONY: test-standalone
test-standalone: kube-apiserver kube-controller-manager ## Run standalone mode (managed clusters) end to end beside kube-controller-manager's binder (test/e2e/standalone, about 5 minutes), with the parity checks against csi-provisioner when make external-provisioner cached it; make test runs it only when kube-controller-manager is cached.
	VOLPLANE_KUBE_CONTROLLER_MANAGER=$(KUBE_CONTROLLER_MANAGER) VOLPLANE_CSI_PROVISIONER=$(CSI_PROVISIONER) $(GO) test -count=1 -v -timeout 20m ./test/e2e/standalone/

# The version skew matrix (test/e2e/skew, docs/compatibility.md#version-skew):
# each service at the previous release with the others at HEAD, and each at
# HEAD with the others at the previous release. make test runs it within
# go test ./...; this prints the matrix.
.PHONY: test-skew
test-skew: kube-apiserver ## Each service at the previous release (PREV_RELEASE, built from git history once into the cache) beside the others at HEAD and the reverse: bind, provision, reclaim, the gateway; prints the matrix.
	VOLPLANE_CACHE=$(VOLPLANE_CACHE) $(GO) test -count=1 -v -timeout 20m -run '^TestSkewMatrix$$' ./test/e2e/skew/

.PHONY: test-unit
test-unit: ## Run the tests that need no kube-apiserver.
	$(GO) test -count=1 -short ./...

# The chaos run (docs/chaos.md): `make chaos SEED=7 DURATION=10m`;
# CHAOS_FLAGS adds volplane-chaos flags (e.g. --static=200 --kill-every=3s).
SEED        ?= 1
DURATION    ?= 5m
CHAOS_FLAGS ?=

.PHONY: chaos
chaos: build kube-apiserver ## Storm every service as killable processes (SEED, DURATION, CHAOS_FLAGS), then print the invariant table; non-zero on a violation.
	$(BIN)/volplane-chaos --bin-dir $(BIN) --kube-apiserver $(KUBE_APISERVER) --seed $(SEED) --duration $(DURATION) $(CHAOS_FLAGS)

.PHONY: chaos-etcd-cluster
chaos-etcd-cluster: build kube-apiserver ## make chaos with etcd as a 3-member cluster whose members are killed one at a time.
	$(BIN)/volplane-chaos --bin-dir $(BIN) --kube-apiserver $(KUBE_APISERVER) --seed $(SEED) --duration $(DURATION) --etcd-members 3 $(CHAOS_FLAGS)

.PHONY: bench
bench: build kube-apiserver ## Static binds/s, then dynamically provisioned volumes/s, each against the bare-client ceiling: ROUNDS A/B pairs on fresh apiservers, and the ratio (N=1000).
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) --vs-ceiling $(ROUNDS)
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) --vs-ceiling $(ROUNDS) --dynamic

.PHONY: bench-ceiling
bench-ceiling: build kube-apiserver ## Only the ceiling: a bare client making exactly the API writes (and Events, CreateVolume) of N static binds, then of N dynamic ones.
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) --ceiling
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) --ceiling --dynamic

.PHONY: bench-rate
bench-rate: build kube-apiserver ## Open-loop claims at each of RATES/s for RATE_DURATION (static, then dynamic): create-to-Bound p50/p90/p99/max per rate.
	$(VOLPLANE_BENCH) --existing $(EXISTING) --rate $(RATES) --duration $(RATE_DURATION)
	$(VOLPLANE_BENCH) --existing $(EXISTING) --rate $(RATES) --duration $(RATE_DURATION) --dynamic

.PHONY: bench-rate-kcm
bench-rate-kcm: build kube-apiserver kube-controller-manager external-provisioner ## make bench-rate with kube-controller-manager (static) and it plus external-provisioner (dynamic), KCM_QPS.
	$(VOLPLANE_BENCH) --existing $(EXISTING) --rate $(RATES) --duration $(RATE_DURATION) $(KCM_FLAGS)
	$(VOLPLANE_BENCH) --existing $(EXISTING) --rate $(RATES) --duration $(RATE_DURATION) --dynamic $(KCM_FLAGS) --external-provisioner $(CSI_PROVISIONER)

.PHONY: bench-scale
bench-scale: build kube-apiserver kube-controller-manager ## N static binds on a cluster of SCALE_EXISTING volumes (100000, mostly Bound): volplane, then kube-controller-manager (KCM_QPS).
	$(VOLPLANE_BENCH) -n $(N) --existing $(SCALE_EXISTING)
	$(VOLPLANE_BENCH) -n $(N) --existing $(SCALE_EXISTING) $(KCM_FLAGS)

.PHONY: bench-replicas
bench-replicas: build kube-apiserver ## Static bursts of N with each of REPLICAS binder replicas (1 2 3), interleaved ROUNDS times (the check of docs/scaling.md's model).
	for r in $$(seq $(ROUNDS)); do for b in $(REPLICAS); do $(VOLPLANE_BENCH) -n $(N) --binders $$b || exit 1; done; done

.PHONY: bench-compare
bench-compare: build kube-apiserver kube-controller-manager external-provisioner ## volplane and kube-controller-manager (+ external-provisioner, dynamic) interleaved ROUNDS times at each of SIZES, static then dynamic: one table with their ratios.
	$(VOLPLANE_BENCH) --compare $(ROUNDS) --sizes $(SIZES) --existing $(EXISTING) $(KCM_FLAGS) --external-provisioner $(CSI_PROVISIONER)

.PHONY: bench-external-provisioner
bench-external-provisioner: build kube-apiserver kube-controller-manager external-provisioner ## Dynamic provisioning with kube-controller-manager's PV binder and the upstream external-provisioner, same dev CSI driver (KCM_QPS for both).
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) --dynamic $(KCM_FLAGS) --external-provisioner $(CSI_PROVISIONER)

.PHONY: bench-delete
bench-delete: build kube-apiserver kube-controller-manager external-provisioner ## Deletion burst: N provisioned volumes' claims deleted at once, until every PV and backing volume is gone; volplane, then kube-controller-manager + external-provisioner.
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) --dynamic --delete
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) --dynamic --delete $(KCM_FLAGS) --external-provisioner $(CSI_PROVISIONER)

.PHONY: bench-hop
bench-hop: build kube-apiserver ## The sidecar's hop: dynamic provisioning of N claims with the dev CSI driver on the provisioner's socket and through volplane-csi-sidecar (mTLS), ROUNDS A/B pairs, and the ratio.
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) --hop $(ROUNDS)

.PHONY: bench-dynamic
bench-dynamic: build kube-apiserver ## Measure dynamic provisioning only (volumes/s through the dev CSI driver), one burst of N.
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) --dynamic

.PHONY: bench-profile
bench-profile: build kube-apiserver kube-controller-manager external-provisioner ## Where the CPU goes: one burst of N each, static then dynamic, volplane then kube-controller-manager (+ external-provisioner), profiled into PROFILE_DIR; each process's CPU per claim by cause (GC, scheduling, TLS, encode, decode, etcd, API requests, ...).
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) --profile-seconds $(PROFILE_SECONDS) --profile-dir $(PROFILE_DIR)/static-volplane
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) $(KCM_FLAGS) --profile-seconds $(PROFILE_SECONDS) --profile-dir $(PROFILE_DIR)/static-kcm
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) --dynamic --profile-seconds $(PROFILE_SECONDS) --profile-dir $(PROFILE_DIR)/dynamic-volplane
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) --dynamic $(KCM_FLAGS) --external-provisioner $(CSI_PROVISIONER) --profile-seconds $(PROFILE_SECONDS) --profile-dir $(PROFILE_DIR)/dynamic-kcm

.PHONY: bench-kcm
bench-kcm: build kube-apiserver kube-controller-manager ## The static burst with kube-controller-manager's PV binder (KCM_QPS=1000).
	$(VOLPLANE_BENCH) -n $(N) --existing $(EXISTING) $(KCM_FLAGS)

##@ Verify / fix

.PHONY: verify
verify: verify-fmt verify-vet verify-staticcheck verify-deps verify-layout verify-funclen verify-docs verify-lint verify-breaking verify-generate verify-chart verify-alerts ## Run every verify-* target.

.PHONY: verify-fmt fix-fmt
verify-fmt: ## Fail when gofmt would change a file.
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\(\.gw\)\?\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt needed (make fix-fmt):"; echo "$$out"; exit 1; fi
fix-fmt: ## Format every Go file.
	gofmt -w $$(git ls-files '*.go' | grep -v '\.pb\(\.gw\)\?\.go$$')

.PHONY: verify-vet
verify-vet: ## go vet every package.
	$(GO) vet ./...

.PHONY: verify-staticcheck
verify-staticcheck: $(BIN)/staticcheck ## staticcheck every package (pinned, installed into ./bin).
	$(BIN)/staticcheck ./...
$(BIN)/staticcheck:
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: verify-deps
verify-deps: ## Fail when a product binary links etcd's server (only the dev environment and tests embed etcd).
	@for b in $(PRODUCT_BINARIES); do \
		if $(GO) list -deps $$b | grep -q '^go.etcd.io/etcd/server/'; then echo "$$b links go.etcd.io/etcd/server"; exit 1; fi; done

.PHONY: verify-layout
verify-layout: ## Fail when a product package imports a test or bench harness, or a package is outside the layout (docs/layout.md).
	$(GO) run ./hack/layoutcheck

.PHONY: verify-funclen
verify-funclen: ## List product functions over 60 lines; fail on one over 80 (hack/funclen).
	$(GO) run ./hack/funclen

.PHONY: verify-docs
verify-docs: ## Fail when docs and READMEs state a flag, default, duration, count or Go name the code does not have (deploy/doc*_test.go).
	$(GO) test -count=1 ./deploy -run 'TestDocs|TestDocFigures|TestFigure|TestFlag|TestEveryFlagIsDocumented|TestReadmeIsShort'
	$(GO) test -count=1 ./internal/csisidecar -run 'TestDocTableIsTheFlagList|TestProvisionerHelpListsNoFlagTheTableLacks'

.PHONY: verify-lint
verify-lint: tools ## buf lint the protos.
	$(BIN)/buf lint

.PHONY: verify-alerts fix-alerts
ALERTS_DIR := deploy/kubernetes/monitoring/promtool
verify-alerts: $(BIN)/promtool ## promtool checks the alerting rules and runs their unit tests; fails when their plain form is stale (make fix-alerts).
	$(GO) run ./hack/promrules -check
	$(BIN)/promtool check rules $(ALERTS_DIR)/volplane.rules.yaml
	$(BIN)/promtool test rules $(ALERTS_DIR)/volplane_test.yaml
fix-alerts: ## Write the plain rule file promtool reads from deploy/kubernetes/monitoring/prometheusrule.yaml.
	$(GO) run ./hack/promrules
# Not in go.mod: a tool, installed at its own pinned version.
$(BIN)/promtool:
	GOBIN=$(BIN) $(GO) install github.com/prometheus/prometheus/cmd/promtool@$(PROMETHEUS_VERSION)
.PHONY: verify-breaking
verify-breaking: tools ## buf breaking: the protos against the previous release's (PREV_RELEASE, read from git history).
	@git rev-parse --verify --quiet '$(PREV_RELEASE)^{commit}' >/dev/null || { \
		echo "verify-breaking: commit $(PREV_RELEASE) (the previous release, hack/prev-release) is not in this clone's history;" \
			"fetch it: git fetch --unshallow (or git fetch origin $(PREV_RELEASE))" >&2; exit 1; }
	@rm -rf .cache/prev-proto && mkdir -p .cache/prev-proto && git archive '$(PREV_RELEASE)' buf.yaml proto | tar -x -C .cache/prev-proto
	$(BIN)/buf breaking --against .cache/prev-proto
	@echo "buf breaking: no breaking change since $(PREV_RELEASE) (docs/compatibility.md#version-skew)"

.PHONY: generate verify-generate
generate: tools ## Regenerate Go, grpc-gateway and OpenAPI code from proto/.
	$(BIN)/buf generate
verify-generate: generate ## Fail when generated code differs from the protos.
	@if [ -n "$$(git status --porcelain -- proto gateway/openapi)" ]; then \
		echo "generated code is stale (make generate, then commit):"; git status --porcelain -- proto gateway/openapi; exit 1; fi

# The Helm chart is generated from the kustomize base (hack/genchart,
# docs/helm.md): after a change of deploy/kubernetes, make chart.
.PHONY: chart verify-chart
chart: ## Regenerate the Helm chart deploy/helm/volplane from the kustomize base (hack/genchart; chart version VERSION).
	$(GO) run ./hack/genchart -version $(VERSION)
verify-chart: $(BIN)/helm ## Fail when the chart is not what make chart writes; helm lint and helm template it; check it renders the kustomize base (deploy/chart_test.go).
	$(GO) run ./hack/genchart -version $(VERSION) -check
	$(BIN)/helm lint --strict deploy/helm/volplane
	$(BIN)/helm lint --strict deploy/helm/volplane --set createNamespace=true,certificates.source=cert-manager,monitoring.enabled=true,provisioner.devDriver.enabled=false
	$(BIN)/helm template volplane deploy/helm/volplane --namespace volplane-system >/dev/null
	VOLPLANE_HELM=$(BIN)/helm $(GO) test -count=1 -run '^TestChart' ./deploy/ ./hack/genchart/
$(BIN)/helm:
	GOBIN=$(BIN) $(GO) install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)

.PHONY: tools
tools: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-grpc-gateway $(BIN)/protoc-gen-openapiv2 ## Install the pinned code generators into ./bin.
$(BIN)/buf:
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
$(BIN)/protoc-gen-go:
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(BIN)/protoc-gen-go-grpc:
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GRPC_VERSION)
$(BIN)/protoc-gen-grpc-gateway:
	GOBIN=$(BIN) $(GO) install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway@$(GRPC_GATEWAY_VERSION)
$(BIN)/protoc-gen-openapiv2:
	GOBIN=$(BIN) $(GO) install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2@$(GRPC_GATEWAY_VERSION)
# Not in go.mod: a tool, installed at its own pinned version.
$(BIN)/csi-sanity:
	GOBIN=$(BIN) $(GO) install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$(CSI_SANITY_VERSION)

.PHONY: clean
clean: ## Remove ./bin (the kube-apiserver cache stays).
	rm -rf $(BIN)
