#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kubectl, etcd, helm and Prometheus from the Go
# module proxy into a cache directory outside the repository, each component keyed by its
# version, and prints (last line) a directory holding all of them. A second run with the
# binaries present is a no-op.
#
#   tools/k8s/build.sh            # prints the bin directory on its last line
#   BP_CACHE=/some/dir tools/k8s/build.sh
#
# Components (each a wrapper Go module with a committed go.sum):
#   tools/k8s/go.mod             k8s.io/kubernetes + go.etcd.io/etcd/server/v3
#   tools/k8s/helm/go.mod        helm.sh/helm/v3 (Debian has no helm)
#   tools/k8s/prometheus/go.mod  github.com/prometheus/prometheus (Debian's lacks kubernetes_sd)
#   tools/k8s/keda/go.mod        github.com/kedacore/keda/v2 (operator + metrics adapter + CRDs)
#   tools/k8s/redis-exporter/go.mod  github.com/oliver006/redis_exporter (the Redis Streams
#                                queue preset's integration test; about 10 s cold)
#
# The real test node's binaries (kubelet, kube-scheduler, kube-proxy from the same k8s.io/kubernetes
# module, and the pod sandbox: tools/k8s/pause as a static binary and as an OCI archive of an
# image FROM scratch, made with podman) are built only with BP_NODE=1 (or `build.sh node`): about
# 35 s once the control plane is built (its Go cache is shared).
#
# KEDA's binaries are built only with BP_KEDA=1 (or `tools/k8s/build.sh keda`): the lab and the
# tests that compare against it ask for it; the other tests do not pay its ~15 CPU-minutes cold.
# KEDA's CRDs (`keda-crds/`, a module download of seconds) are always there: the Guard-mode tests
# apply the real ScaledObject CRD without running KEDA.
#
# Prometheus is built with only the service discoveries the project uses (file and http, which
# upstream always includes, and kubernetes_sd): upstream's build tags `remove_all_sd` and
# `enable_kubernetes_sd` leave out the cloud SDKs (about a third of its cold build).
#
# Each component is built under a lock file in the cache: a second build.sh started meanwhile
# (`make test` builds KEDA in the background while tests run) waits and then finds it built.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version_of() { # module go.mod -> version
  sed -n "s|^[[:space:]]*\(require \)\{0,1\}$1 v\([^ ]*\).*|\2|p" "$2" | head -n1
}
k8s_version=$(version_of k8s.io/kubernetes "$here/go.mod")
etcd_version=$(version_of go.etcd.io/etcd/server/v3 "$here/go.mod")
helm_version=$(version_of helm.sh/helm/v3 "$here/helm/go.mod")
prom_version=$(version_of github.com/prometheus/prometheus "$here/prometheus/go.mod")
keda_version=$(version_of github.com/kedacore/keda/v2 "$here/keda/go.mod")
rexp_version=$(version_of github.com/oliver006/redis_exporter "$here/redis-exporter/go.mod")
cache=${BP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/backpressure-operator}

k8s_key="k8s-${k8s_version}_etcd-${etcd_version}_helm-${helm_version}"
prom_tags=remove_all_sd,enable_kubernetes_sd
prom_key="prometheus-${prom_version}-sd-kubernetes"
k8s_out="$cache/$k8s_key/bin"
prom_out="$cache/$prom_key/bin"
keda_key="keda-${keda_version}"
keda_out="$cache/$keda_key/bin"
rexp_key="redis_exporter-${rexp_version}"
rexp_out="$cache/$rexp_key/bin"
want_keda=${BP_KEDA:-0}
want_node=${BP_NODE:-0}
for arg in "$@"; do
  case $arg in
    keda) want_keda=1 ;;
    node) want_node=1 ;;
    *) echo "k8s-bins: unknown component $arg (keda, node)" >&2; exit 2 ;;
  esac
done
node_key="node-k8s-${k8s_version}"
node_out="$cache/$node_key/bin"
all_out="$cache/bin-${k8s_key}_${prom_key}"

export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0

have() { # dir bins...
  local dir=$1; shift
  for b in "$@"; do [ -x "$dir/$b" ] || return 1; done
}

need_go() {
  command -v go >/dev/null || { echo "k8s-bins: Go is required (https://go.dev/dl) to build $1" >&2; exit 1; }
}

# The version the Kubernetes binaries report (as a release build stamps it).
k8s_ldflags() {
  local minor vp
  minor=${k8s_version#*.}; minor=${minor%%.*}
  vp=k8s.io/component-base/version
  echo "-s -w -X $vp.gitVersion=v$k8s_version -X $vp.gitMajor=1 -X $vp.gitMinor=$minor \
-X $vp.gitTreeState=clean -X $vp.buildDate=1970-01-01T00:00:00Z \
-X $vp.gitCommit=0000000000000000000000000000000000000000"
}

build_k8s() {
  have "$k8s_out" kube-apiserver kube-controller-manager kubectl etcd helm && return 0
  need_go "the control plane"
  local tmp="$cache/$k8s_key/tmp.$$" start ldflags
  mkdir -p "$tmp"
  start=$(date +%s)
  echo "k8s-bins: building $k8s_key (cold: about 7-15 min on 2 cores)" >&2
  ldflags=$(k8s_ldflags)
  (
    cd "$here"
    go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kubectl
    go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
  )
  (
    cd "$here/helm"
    local hv=helm.sh/helm/v3/internal/version
    go build -trimpath -ldflags "-s -w -X $hv.version=v$helm_version -X $hv.gitTreeState=clean" \
      -o "$tmp/helm" helm.sh/helm/v3/cmd/helm
  )
  mkdir -p "$k8s_out"
  for b in kube-apiserver kube-controller-manager kubectl etcd helm; do mv "$tmp/$b" "$k8s_out/$b"; done
  rm -rf "$tmp"
  echo "k8s-bins: $k8s_key built in $(( $(date +%s) - start ))s" >&2
}

build_prometheus() {
  have "$prom_out" prometheus && return 0
  need_go "Prometheus"
  local tmp="$cache/$prom_key/tmp.$$" start pv
  mkdir -p "$tmp"
  start=$(date +%s)
  echo "k8s-bins: building $prom_key (cold: about 5-10 min on 2 cores)" >&2
  pv=github.com/prometheus/common/version
  (
    cd "$here/prometheus"
    go build -trimpath -tags "$prom_tags" \
      -ldflags "-s -w -X $pv.Version=module-v$prom_version -X $pv.Branch=go-module-proxy -X $pv.Revision=v$prom_version" \
      -o "$tmp/prometheus" github.com/prometheus/prometheus/cmd/prometheus
  )
  mkdir -p "$prom_out"
  mv "$tmp/prometheus" "$prom_out/prometheus"
  rm -rf "$tmp"
  echo "k8s-bins: $prom_key built in $(( $(date +%s) - start ))s" >&2
}

build_keda() {
  have "$keda_out" keda-operator keda-adapter && return 0
  need_go "KEDA"
  local tmp="$cache/$keda_key/tmp.$$" start kv mod
  mkdir -p "$tmp"
  start=$(date +%s)
  echo "k8s-bins: building $keda_key (cold: about 15 CPU-minutes, ~6 GB of Go caches)" >&2
  kv=github.com/kedacore/keda/v2/version
  (
    cd "$here/keda"
    go build -trimpath -ldflags "-s -w -X $kv.Version=$keda_version -X $kv.GitCommit=v$keda_version" \
      -o "$tmp/" github.com/kedacore/keda/v2/cmd/operator github.com/kedacore/keda/v2/cmd/adapter
  )
  mv "$tmp/operator" "$tmp/keda-operator"
  mv "$tmp/adapter" "$tmp/keda-adapter"
  mkdir -p "$keda_out"
  mv "$tmp/keda-operator" "$tmp/keda-adapter" "$keda_out/"
  rm -rf "$tmp"
  echo "k8s-bins: $keda_key built in $(( $(date +%s) - start ))s" >&2
}

build_node() {
  have "$node_out" kubelet kube-scheduler kube-proxy pause && [ -f "$node_out/pause.oci.tar" ] && return 0
  need_go "the test node"
  command -v podman >/dev/null || { echo "k8s-bins: podman is needed for the pause image (apt-get install podman runc)" >&2; exit 1; }
  local tmp="$cache/$node_key/tmp.$$" start ldflags
  mkdir -p "$tmp/image"
  start=$(date +%s)
  echo "k8s-bins: building $node_key (about 35 s after the control plane)" >&2
  ldflags=$(k8s_ldflags)
  (
    cd "$here"
    go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
      k8s.io/kubernetes/cmd/kubelet \
      k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kube-proxy
    go build -trimpath -ldflags "-s -w" -o "$tmp/pause" ./pause
  )
  cp "$tmp/pause" "$tmp/image/pause"
  printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$tmp/image/Containerfile"
  podman build --pull=never --timestamp 0 -q -t "localhost/backpressure-pause:$node_key" "$tmp/image" >/dev/null
  podman save --format oci-archive -o "$tmp/pause.oci.tar" "localhost/backpressure-pause:$node_key" >/dev/null
  podman rmi "localhost/backpressure-pause:$node_key" >/dev/null 2>&1 || true
  mkdir -p "$node_out"
  for b in kubelet kube-scheduler kube-proxy pause pause.oci.tar; do mv "$tmp/$b" "$node_out/$b"; done
  rm -rf "$tmp"
  echo "k8s-bins: $node_key built in $(( $(date +%s) - start ))s" >&2
}

build_keda_crds() {
  [ -d "$keda_out/crds" ] && return 0
  need_go "KEDA's CRDs"
  local tmp="$cache/$keda_key/tmp.$$" mod
  mod=$(cd "$here/keda" && go mod download -json github.com/kedacore/keda/v2 | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$mod/config/crd/bases" ] || { echo "k8s-bins: no CRDs in KEDA's module ($mod)" >&2; exit 1; }
  mkdir -p "$tmp/crds" "$keda_out"
  cp "$mod"/config/crd/bases/*.yaml "$tmp/crds/"
  chmod -R u+w "$tmp/crds"
  mv "$tmp/crds" "$keda_out/crds"
  rm -rf "$tmp"
}

# Runs a build function holding its component's lock, so that concurrent build.sh runs build a
# component once (the second waits, then finds it built).
locked() { # key function
  local key=$1; shift
  mkdir -p "$cache"
  ( flock 9; "$@" ) 9>"$cache/.$key.lock"
}

build_redis_exporter() {
  have "$rexp_out" redis_exporter && return 0
  need_go "redis_exporter"
  local tmp="$cache/$rexp_key/tmp.$$" start
  mkdir -p "$tmp"
  start=$(date +%s)
  echo "k8s-bins: building $rexp_key" >&2
  (
    cd "$here/redis-exporter"
    go build -trimpath -ldflags "-s -w -X main.BuildVersion=v$rexp_version" \
      -o "$tmp/redis_exporter" github.com/oliver006/redis_exporter
  )
  mkdir -p "$rexp_out"
  mv "$tmp/redis_exporter" "$rexp_out/redis_exporter"
  rm -rf "$tmp"
  echo "k8s-bins: $rexp_key built in $(( $(date +%s) - start ))s" >&2
}

locked "$k8s_key" build_k8s
locked "$prom_key" build_prometheus
locked "$rexp_key" build_redis_exporter
locked "$keda_key-crds" build_keda_crds
[ "$want_keda" = 1 ] && locked "$keda_key" build_keda
[ "$want_node" = 1 ] && locked "$node_key" build_node

# One directory with every binary (symlinks into the keyed component directories).
if ! have "$all_out" kube-apiserver kube-controller-manager kubectl etcd helm prometheus; then
  mkdir -p "$all_out"
  for b in kube-apiserver kube-controller-manager kubectl etcd helm; do ln -sfn "$k8s_out/$b" "$all_out/$b"; done
  ln -sfn "$prom_out/prometheus" "$all_out/prometheus"
fi
have "$all_out" redis_exporter || ln -sfn "$rexp_out/redis_exporter" "$all_out/redis_exporter"
[ -d "$all_out/keda-crds" ] || ln -sfn "$keda_out/crds" "$all_out/keda-crds"
if [ "$want_keda" = 1 ] && ! have "$all_out" keda-operator keda-adapter; then
  ln -sfn "$keda_out/keda-operator" "$all_out/keda-operator"
  ln -sfn "$keda_out/keda-adapter" "$all_out/keda-adapter"
fi
if [ "$want_node" = 1 ]; then
  for b in kubelet kube-scheduler kube-proxy pause pause.oci.tar; do
    [ -e "$all_out/$b" ] || ln -sfn "$node_out/$b" "$all_out/$b"
  done
fi
echo "k8s-bins: up to date ($k8s_key, $prom_key, $rexp_key)" >&2
echo "$all_out"
