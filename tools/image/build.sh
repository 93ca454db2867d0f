#!/usr/bin/env bash
# `make image`: builds the operator and lab-worker images (images/*/Containerfile) from binaries
# already built on this machine, with podman, without a container daemon and without pulling
# anything; with GO_WORKER_BIN also the lab's Go worker image (images/lab-worker-go, the static
# binary tools/lab-worker-go/build.sh prints, and the Lua scripts of crates/lab/lua):
#
#   - a base is assembled from scratch (images/base/Containerfile) with what the binaries need
#     at run time, taken from this host: the glibc and libgcc libraries ldd lists, the dynamic
#     loader, the CA certificates, /etc/passwd and /etc/group with user nonroot (65532), /tmp;
#   - each Containerfile's `build` stage (a cargo build in a Rust image, for users) is replaced
#     by a directory holding the host-built binaries where that stage leaves them
#     (`--build-context build=<dir>`), and BASE by the local base (the Go worker is static and
#     adds no library to it);
#   - `--pull=never` makes any attempt to pull fail the build.
#
# The images are tagged <registry>/<name>:<version>, reproducibly (every file and the image's
# creation time carry the commit's time: --timestamp), and saved as OCI archives into
# out/images/<name>_<tag>.oci.tar for `ctr images import` or `podman load`.
#
#   BIN_DIR=target/release VERSION=0.1.0 REGISTRY=ghcr.io/backpressure-dev tools/image/build.sh
#   GO_WORKER_BIN=$(tools/lab-worker-go/build.sh | tail -n1) BIN_DIR=... tools/image/build.sh
#
# Measured on the shared 2-core machine with the binaries built: 5 s for the release images
# (operator 45 MB, lab worker 33 MB; archives 16 and 12 MB), 11 s for the debug ones (133 and 83
# MB); podman and runc from Debian take 12 s to install. A rebuild of the same commit gives the
# same image IDs, with the overlay or the vfs storage driver.
#
# Environment: BIN_DIR (the binaries, required), VERSION (required), TAG (default VERSION),
# REGISTRY (default ghcr.io/backpressure-dev), PODMAN (default podman), OUT (default
# out/images), GO_WORKER_BIN (the Go worker's static binary: unset, no Go worker image). Prints
# the image references on its last lines, one per image.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
: "${BIN_DIR:?BIN_DIR: the directory of the built binaries (e.g. target/release)}"
: "${VERSION:?VERSION: the version the images are tagged with}"
TAG=${TAG:-$VERSION}
REGISTRY=${REGISTRY:-ghcr.io/backpressure-dev}
REGISTRY=${REGISTRY%/}
OUT=${OUT:-$root/out/images}
read -r -a podman <<<"${PODMAN:-podman}"
command -v "${podman[0]}" >/dev/null ||
  { echo "image: podman is required (apt-get install podman runc; \`make image\` installs them)" >&2; exit 1; }

# name of the image, its binaries (the first is the entrypoint's).
declare -A binaries=(
  [backpressure-operator]="backpressure-operator kubectl-wbp"
  [backpressure-lab-worker]="backpressure-lab"
)
declare -A containerfile=(
  [backpressure-operator]=images/operator/Containerfile
  [backpressure-lab-worker]=images/lab-worker/Containerfile
)
names=(backpressure-operator backpressure-lab-worker)
# where each binary is taken from.
declare -A bin_src=()
for name in "${names[@]}"; do
  for b in ${binaries[$name]}; do bin_src[$b]=$BIN_DIR/$b; done
done

all_bins=()
for name in "${names[@]}"; do
  for b in ${binaries[$name]}; do
    [ -x "${bin_src[$b]}" ] || { echo "image: ${bin_src[$b]} is missing: build the binaries first" >&2; exit 1; }
    all_bins+=("${bin_src[$b]}")
  done
done

# The Go worker: static (CGO_ENABLED=0), so it is not among all_bins (ldd's libraries of the
# base); its image also holds the Lua scripts, which its Containerfile copies from the context.
declare -A context_dirs=()
if [ -n "${GO_WORKER_BIN:-}" ]; then
  [ -x "$GO_WORKER_BIN" ] ||
    { echo "image: GO_WORKER_BIN=$GO_WORKER_BIN is missing (tools/lab-worker-go/build.sh prints it)" >&2; exit 1; }
  interp=$(readelf -l "$GO_WORKER_BIN" 2>/dev/null | grep INTERP || true)
  [ -z "$interp" ] ||
    { echo "image: $GO_WORKER_BIN is not static (build it with CGO_ENABLED=0: tools/lab-worker-go/build.sh)" >&2; exit 1; }
  binaries[backpressure-lab-worker-go]=lab-worker-go
  containerfile[backpressure-lab-worker-go]=images/lab-worker-go/Containerfile
  context_dirs[backpressure-lab-worker-go]=crates/lab/lua
  bin_src[lab-worker-go]=$GO_WORKER_BIN
  names+=(backpressure-lab-worker-go)
fi

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[ "$revision" = unknown ] || git diff --quiet HEAD -- 2>/dev/null || revision="$revision-dirty"
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
source_url=https://github.com/backpressure-dev/backpressure-operator

# Work directories of this run (the archives of other tags stay).
rm -rf "$OUT/base" "${names[@]/#/$OUT/}"
mkdir -p "$OUT"

# --- the base ---------------------------------------------------------------------------------
base_ctx="$OUT/base"
rootfs="$base_ctx/rootfs"
mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/tmp" "$base_ctx/home/nonroot" "$rootfs/usr/local/bin"
chmod 1777 "$rootfs/tmp"
# Every shared library the binaries load, at the path the loader finds it (ldd's), and the
# loader itself at the path the binaries name (PT_INTERP).
libs=""
for b in "${all_bins[@]}"; do
  deps=$(ldd "$b") || { echo "image: ldd $b failed" >&2; exit 1; }
  if grep -q 'not found' <<<"$deps"; then
    echo "image: $b needs a library this host lacks:" >&2
    grep 'not found' <<<"$deps" >&2
    exit 1
  fi
  libs+=$(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(/ { print $1 }' <<<"$deps")
  libs+=$'\n'
done
libs=$(sort -u <<<"$libs" | sed '/^$/d')
[ -n "$libs" ] || { echo "image: ldd found no libraries in ${all_bins[*]}" >&2; exit 1; }
for lib in $libs; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
# glibc's and libgcc's licences travel with them.
for pkg in libc6 libgcc-s1; do
  if [ -f "/usr/share/doc/$pkg/copyright" ]; then
    mkdir -p "$rootfs/usr/share/doc/$pkg"
    cp "/usr/share/doc/$pkg/copyright" "$rootfs/usr/share/doc/$pkg/"
  fi
done
ca=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca" ] || { echo "image: $ca is missing (apt-get install ca-certificates)" >&2; exit 1; }
cp "$ca" "$rootfs/etc/ssl/certs/"
cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
echo 'hosts: files dns' >"$rootfs/etc/nsswitch.conf"
cat /etc/os-release >"$rootfs/etc/os-release" 2>/dev/null || true
# Reproducible: every file of the base with the commit's time.
find "$base_ctx" -exec touch -h -d "@$epoch" {} +
cp images/base/Containerfile "$base_ctx/Containerfile"

# image_id REF: the ID of the image REF names now, or nothing.
image_id() { "${podman[@]}" image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }
# drop_replaced OLD_ID REF: removes the image REF named before this build when the build gave
# REF another image and no other name is left on it (a rebuild leaves no untagged image behind;
# an image another tag names, or a container uses, stays).
drop_replaced() {
  [ -n "$1" ] && [ "$1" != "$(image_id "$2")" ] || return 0
  [ "$("${podman[@]}" image inspect -f '{{len .RepoTags}}' "$1" 2>/dev/null)" = 0 ] || return 0
  "${podman[@]}" rmi "$1" >/dev/null 2>&1 || true
}

base=localhost/backpressure-base:$TAG
common=(--pull=never --timestamp "$epoch" --layers=false)
echo "image: base $base ($(echo "$libs" | wc -w) libraries from the host)" >&2
old=$(image_id "$base")
"${podman[@]}" build "${common[@]}" -q -t "$base" -f "$base_ctx/Containerfile" "$base_ctx" >/dev/null

# --- the images -------------------------------------------------------------------------------
refs=()
for name in "${names[@]}"; do
  ctx="$OUT/$name/build"
  mkdir -p "$ctx/out/bin"
  from=()
  for b in ${binaries[$name]}; do
    cp "${bin_src[$b]}" "$ctx/out/bin/$b"
    from+=("$(dirname "${bin_src[$b]}")")
  done
  find "$ctx" -exec touch -h -d "@$epoch" {} +
  ref="$REGISTRY/$name:$TAG"
  echo "image: $ref (${containerfile[$name]}, binaries from $(printf '%s\n' "${from[@]}" | sort -u | paste -sd ' '))" >&2
  # The context (the repository) is not read but for the directories a COPY names besides the
  # `build` stage's output (the Go worker's Lua scripts): a directory with just those keeps
  # podman from scanning the repository.
  mkdir -p "$OUT/$name/context"
  for d in ${context_dirs[$name]:-}; do
    mkdir -p "$OUT/$name/context/$(dirname "$d")"
    cp -r "$d" "$OUT/$name/context/$d"
  done
  find "$OUT/$name/context" -exec touch -h -d "@$epoch" {} +
  old_image=$(image_id "$ref")
  "${podman[@]}" build "${common[@]}" -q \
    -f "${containerfile[$name]}" \
    --build-context "build=$ctx" \
    --build-arg "BASE=$base" \
    --build-arg "VERSION=$TAG" \
    --build-arg "REVISION=$revision" \
    --build-arg "CREATED=$created" \
    --build-arg "SOURCE=$source_url" \
    -t "$ref" "$OUT/$name/context" >/dev/null
  drop_replaced "$old_image" "$ref"
  archive="$OUT/${name}_$TAG.oci.tar"
  "${podman[@]}" save -q --format oci-archive -o "$archive" "$ref"
  echo "image: saved $archive ($(du -h "$archive" | cut -f1))" >&2
  rm -rf "${OUT:?}/$name"
  refs+=("$ref")
done
# The base last: the images above were built on it.
drop_replaced "$old" "$base"
rm -rf "$base_ctx"
printf '%s\n' "${refs[@]}"
