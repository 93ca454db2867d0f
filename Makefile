# backpressure-operator: the two commands are `make demo` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
# Where tools/k8s/build.sh caches the Go-built binaries (outside the repository).
export BP_CACHE ?= $(HOME)/.cache/backpressure-operator
# The directory of the Go-built binaries, computed on first use and at most once per make run
# (tools/k8s/build.sh is a no-op when the cache is warm). Its progress and errors go to the
# terminal; a failure stops make with the script's status. `make unit` never evaluates it.
K8S_BIN = $(eval K8S_BIN := $$(shell tools/k8s/build.sh keda node | tail -n1))$(if $(filter 0,$(.SHELLSTATUS)),,$(error tools/k8s/build.sh failed (exit $(.SHELLSTATUS)): see its output above))$(if $(K8S_BIN),,$(error tools/k8s/build.sh printed no bin directory))$(K8S_BIN)
# containerd, the CNI plugins and iptables: the real test node (crates/envtest/src/node.rs).
APT_PACKAGES := prometheus redis-server lua5.1 rabbitmq-server podman runc containerd containernetworking-plugins iptables
CHART := charts/backpressure-operator
# The lab and the operator are built in one cargo invocation (the whole workspace for the e2e
# tests, as `make test` builds it): built apart, each selection unifies the shared
# dependencies' features differently and every run rebuilds the other.
# Absolute: test binaries run with their crate's directory as the working directory.
TARGET_DIR := $(abspath $(or $(CARGO_TARGET_DIR),target))
# The container images (images/*/Containerfile, `make image`): <registry>/<name>:<version>, the
# version being the workspace's. The chart (image.repository) and config/manager (images:) default
# to the operator image this builds with the default registry; tools/image/test.sh checks it.
IMAGE_DEFAULT_REGISTRY := ghcr.io/backpressure-dev
REGISTRY ?= $(IMAGE_DEFAULT_REGISTRY)
# release (the default) or debug: the binaries `make test` already built (CI), tagged <version>-debug.
PROFILE ?= release
VERSION := $(shell sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$$/\1/p' Cargo.toml)
IMAGE_TAG = $(VERSION)$(if $(filter debug,$(PROFILE)),-debug)
# What builds the binaries the images take: the release build `make demo` makes, or the
# workspace's test build (which builds every binary) that tools/test.sh makes, so that CI's images
# reuse it instead of building the binaries again with other features.
IMAGE_BINS_release = $(CARGO) build --release --locked -p backpressure-lab -p backpressure-operator --bins
IMAGE_BINS_debug = $(CARGO) test --workspace --locked --no-run

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

.PHONY: deps
deps: ## Install system packages (Prometheus, Redis, RabbitMQ, podman, containerd) if missing, and moto (SQS) into its cached venv
	@missing=""; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v lua5.1 >/dev/null || missing="$$missing lua5.1"; \
	command -v rabbitmq-server >/dev/null || test -x /usr/lib/rabbitmq/bin/rabbitmq-server || missing="$$missing rabbitmq-server"; \
	command -v podman >/dev/null || missing="$$missing podman"; \
	command -v runc >/dev/null || missing="$$missing runc"; \
	command -v containerd >/dev/null || missing="$$missing containerd"; \
	test -x /usr/lib/cni/bridge || missing="$$missing containernetworking-plugins"; \
	command -v iptables >/dev/null || test -x /usr/sbin/iptables || missing="$$missing iptables"; \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing $(APT_PACKAGES)"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(APT_PACKAGES) >/dev/null; \
	fi
	@command -v go >/dev/null || { echo "deps: Go is required to build the Kubernetes binaries (tools/k8s)"; exit 1; }
	@command -v python3 >/dev/null || { echo "deps: Python 3 is required for moto, the SQS-compatible test server (tools/sqs/moto.sh)"; exit 1; }
	@tools/sqs/moto.sh >/dev/null
	@command -v $(CARGO) >/dev/null || { echo "deps: Rust (cargo) is required"; exit 1; }

.PHONY: k8s-bins
k8s-bins: ## Build kube-apiserver, kube-controller-manager, kubectl, etcd, helm, Prometheus, KEDA, the real node's kubelet/kube-scheduler/kube-proxy, kstatus (cached by version)
	@echo "k8s-bins: $(K8S_BIN)"
	@tools/kstatus/build.sh >/dev/null

.PHONY: crds
crds: ## Regenerate crds/ and the chart's CRDs from crates/api
	$(CARGO) run -q -p backpressure-api --bin crdgen -- crds $(CHART)/files/crds

.PHONY: wire
wire: ## Regenerate the wire contract's JSON Schemas (docs/wire-contract/) and hash vectors (conformance/vectors/hash.json) from crates/api
	$(CARGO) run -q -p backpressure-api --bin wiregen -- schemas docs/wire-contract
	$(CARGO) run -q -p backpressure-api --bin wiregen -- hash-vectors conformance/vectors/hash.json

.PHONY: fmt
fmt: ## Format the code
	$(CARGO) fmt --all

.PHONY: lint
lint: ## cargo fmt --check, clippy -D warnings, no import cycle in src/, every document a comment cites exists
	tools/check-doc-refs.sh
	tools/import-graph.sh >/dev/null
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

.PHONY: manifests
manifests: k8s-bins ## Render and lint the kustomize tree and the Helm chart
	$(K8S_BIN)/kubectl kustomize config/default >/dev/null
	$(K8S_BIN)/kubectl kustomize config/samples >/dev/null
	$(K8S_BIN)/helm lint --strict $(CHART)
	$(K8S_BIN)/helm template bp $(CHART) --namespace backpressure-system >/dev/null
	$(K8S_BIN)/helm template bp $(CHART) --namespace backpressure-system --set serviceMonitor.enabled=true >/dev/null
	$(K8S_BIN)/helm template bp $(CHART) --namespace backpressure-system --set prometheusRule.enabled=true >/dev/null
	@echo "manifests: kustomize and helm render"

# Tests that start no server (no kube-apiserver, Prometheus, Redis or kstatus): the pure core, the
# API, the simulator, the worker library's in-process tests, and the operator's unit tests.
UNIT_TESTS := \
  -p backpressure-core -p backpressure-api -p backpressure-sim --all-targets ::: \
  -p backpressure-conformance --all-targets ::: \
  -p backpressure-worker --features sqs,rabbitmq --lib --bins --test hostile_config --test no_alloc ::: \
  -p backpressure-operator --lib --bins ::: \
  -p backpressure-lab --lib --bins -- --skip real_redis_semantics

.PHONY: unit
unit: lint ## The fast loop: fmt, clippy and every test that needs no server (no apt, no Go)
	@set -- $(UNIT_TESTS); args=(); \
	run() { echo "$(CARGO) test --locked $${args[*]}"; $(CARGO) test --locked -q "$${args[@]}"; }; \
	for a in "$$@"; do if [ "$$a" = ":::" ]; then run; args=(); else args+=("$$a"); fi; done; run

# The lab's Go worker (the polyglot run of outage-and-recovery: crates/lab/workers/go on the Go
# SDK), built by tools/lab-worker-go/build.sh into $(BP_CACHE) (a no-op when cached); `make demo`
# and `make e2e` pass it to the lab as BP_LAB_GO_WORKER.
.PHONY: lab-worker-go
lab-worker-go: ## Build the lab's Go worker (cached by Go version and source)
	@tools/lab-worker-go/build.sh

.PHONY: lab-worker-go-test
lab-worker-go-test: ## go vet and go test of the lab's Go worker (its pure logic; the lab runs it for real)
	cd crates/lab/workers/go && GOWORK=off go vet ./... && GOWORK=off go test ./...

# The lab's scenarios, asserting their recorded checks (after the workspace's test build and its
# images, `make image PROFILE=debug`: on a real node as root, BP_LAB_NODE=0 for the stand-in): $(1) are the
# test-harness arguments after `--ignored`. partial_failure (the load-independent failure of
# issue 13) is in `make e2e` since session 22; `make e2e-partial-failure` runs it alone.
define run_e2e
	$(MAKE) --no-print-directory PROFILE=debug image
	BP_K8S_BIN=$(K8S_BIN) BP_PROMETHEUS=$(K8S_BIN)/prometheus \
	  BP_OPERATOR_BIN=$(TARGET_DIR)/debug/backpressure-operator \
	  BP_LAB_IMAGE_TAG=$(VERSION)-debug \
	  BP_LAB_GO_WORKER=$$(tools/lab-worker-go/build.sh | tail -n1) \
	  $(CARGO) test --workspace --locked --test e2e -- --ignored --test-threads=1 $(1)
endef

.PHONY: test
# tools/test.sh: the same steps as `make k8s-bins lint manifests sdk-test lab-worker-go-test`, the
# workspace's tests and `make e2e`, with KEDA's build beside the tests that do not need it (cold
# CI: see its header), and the SDKs' tests against the real API server (BP_K8S_BIN).
test: deps ## Install what is needed, lint, and run every test against real components (incl. e2e)
	MAKE="$(MAKE)" CARGO="$(CARGO)" tools/test.sh

# The SDKs in other languages (sdk/<language>/): each has a test.sh that installs its ecosystem's
# dependencies (Go modules, a Python venv, npm packages) and runs its own test runner, the golden
# vectors of conformance/vectors included.
SDKS := go python typescript

.PHONY: sdk-test
sdk-test: ## The Go, Python and TypeScript SDKs' own test runners (go test, pytest, node --test)
	@for s in $(SDKS); do echo "sdk-test: sdk/$$s"; sdk/$$s/test.sh; done

.PHONY: demo
demo: deps k8s-bins ## Run the lab's default scenario with real processes (on a real node as root)
	$(MAKE) --no-print-directory PROFILE=release image
	BP_K8S_BIN=$(K8S_BIN) BP_PROMETHEUS=$(K8S_BIN)/prometheus \
	  BP_OPERATOR_BIN=$(TARGET_DIR)/release/backpressure-operator \
	  BP_LAB_IMAGE_TAG=$(VERSION) \
	  BP_LAB_GO_WORKER=$$(tools/lab-worker-go/build.sh | tail -n1) \
	  $(TARGET_DIR)/release/backpressure-lab demo

.PHONY: e2e
e2e: deps k8s-bins ## The lab's scenarios, asserting the recorded checks
	$(call run_e2e,)

.PHONY: e2e-partial-failure
e2e-partial-failure: deps k8s-bins ## The lab's load-independent-failure scenario alone (issue 13)
	$(call run_e2e,--exact partial_failure)

.PHONY: bench
bench: ## Simulator policy report (docs/sim/report.md) and seed sweep (docs/sim/sweep.md)
	$(CARGO) run --release --locked -p backpressure-sim -- report
	$(CARGO) run --release --locked -p backpressure-sim -- sweep

.PHONY: bench-worker
bench-worker: ## Worker library micro-benchmarks (criterion): outcome and permit paths vs a tokio Semaphore
	$(CARGO) bench --locked -p backpressure-worker

.PHONY: bench-scale
bench-scale: deps k8s-bins ## The operator at fleet scale: 10,000 objects on a real API server and Prometheus
	BP_K8S_BIN=$(K8S_BIN) $(CARGO) bench --locked -p backpressure-operator --bench scale

.PHONY: image-deps
image-deps: ## Install podman and runc if missing (what `make image` builds with: no daemon)
	@command -v podman >/dev/null && command -v runc >/dev/null || { \
	  echo "image-deps: installing podman runc"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends podman runc >/dev/null; \
	}

# The Go lab worker's image takes the static binary tools/lab-worker-go/build.sh prints (cached); a
# failed Go build stops here instead of leaving that image out.
.PHONY: image
image: image-deps ## Build the operator, lab-worker and Go lab-worker images with podman, no daemon, no pull (REGISTRY=, PROFILE=debug)
	$(if $(IMAGE_BINS_$(PROFILE)),,$(error PROFILE must be release or debug, not $(PROFILE)))
	$(IMAGE_BINS_$(PROFILE))
	go_bin=$$(tools/lab-worker-go/build.sh | tail -n1); \
	  BIN_DIR=$(TARGET_DIR)/$(PROFILE) VERSION=$(VERSION) TAG=$(IMAGE_TAG) REGISTRY=$(REGISTRY) \
	  GO_WORKER_BIN=$$go_bin tools/image/build.sh

.PHONY: image-test
image-test: image ## Build the images, then run each with podman (--help, labels, user, a real start)
	VERSION=$(VERSION) TAG=$(IMAGE_TAG) REGISTRY=$(REGISTRY) DEFAULT_REGISTRY=$(IMAGE_DEFAULT_REGISTRY) \
	  tools/image/test.sh

.PHONY: clean
clean: ## Remove build output (not the binary cache)
	$(CARGO) clean
