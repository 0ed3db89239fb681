#!/usr/bin/env bash
# Builds the two images (packaging/Dockerfile.server, packaging/Dockerfile.client)
# with podman and runs them together, as their comments say: the server
# container serves the CPU device on a socket in a host folder mounted at
# /run/cumux; client containers with the same folder mounted run an
# unmodified nvcc-built program (tests/cuda/corpus/vector_add.cu) through it,
# by LD_LIBRARY_PATH alone and under `cumux run`, and `cumux status` sees its
# sessions; `podman stop` (SIGTERM) then drains the server, which exits 0.
#
#   packaging/tests/images.sh          # from any directory; root, podman 4+
#
# Where the base images (debian:bookworm-slim, rust:1.95-bookworm) cannot be
# pulled, it makes them locally under the names the Dockerfiles use: a
# debootstrap minbase root filesystem of bookworm, and that plus gcc, the
# host's Rust 1.95 toolchain (rustup's, copied in) and the host's CA bundle.
# Slow (a release build of the workspace in the build stage): not part of
# .ci/run.
#
# Environment: PODMAN (podman); CUMUX_IMAGES_FLAGS ("GLOBAL|RUN": podman's
# global flags, then its run and build flags, e.g. "--runtime runc|--ulimit
# nproc=4096:4096"; default: the first set that runs a container here);
# CUMUX_CUDA_HOME (else scripts/setup-nvcc); CUMUX_DEBIAN_MIRROR;
# CUMUX_RUST_SYSROOT; CUMUX_IMAGES_CA (the PEM bundle the build image trusts
# besides Debian's; the host's); CUMUX_IMAGES_NICE (10); CUMUX_IMAGES_KEEP=1
# keeps the work folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
podman="${PODMAN:-podman}"
mirror="${CUMUX_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
nice_level="${CUMUX_IMAGES_NICE:-10}"
server_name="cumux-images-server-$$"
work="$(mktemp -d /tmp/cumux-images.XXXXXX)"

fail() { echo "images.sh: FAIL: $*" >&2; exit 1; }
step() { echo; echo "== $*"; }
cleanup() {
  pm rm -f "$server_name" >/dev/null 2>&1 || true
  pm rm -f "cumux-images-hold-$$" >/dev/null 2>&1 || true
  if [ "${CUMUX_IMAGES_KEEP:-0}" = 1 ]; then echo "work folder kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

command -v "$podman" >/dev/null || fail "no $podman on PATH"
[ "$(id -u)" = 0 ] || fail "run as root (rootful podman; debootstrap for the base image)"
echo "images.sh: $("$podman" --version), repo $root at $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"

have_image() { "$podman" image exists "$1"; }
gflags=""
pm() {  # podman with the global flags the probe chose
  # shellcheck disable=SC2086
  "$podman" $gflags "$@"
}

# --- base images -------------------------------------------------------------

make_debian_slim() {
  step "making debian:bookworm-slim (debootstrap --variant=minbase bookworm, $mirror)"
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null \
    || fail "no debootstrap (apt-get install debootstrap)"
  local fs="$work/rootfs"
  nice -n "$nice_level" debootstrap --variant=minbase bookworm "$fs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; fail "debootstrap failed"; }
  # What the official slim image does: no docs, manuals or translations, no
  # apt caches, and the security and updates suites in the sources.
  cat >"$fs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  find "$fs/usr/share/doc" -mindepth 2 -not -name copyright -not -type d -delete
  rm -rf "$fs/usr/share/man/"* "$fs/usr/share/info/"*
  find "$fs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  rm -rf "$fs/var/cache/apt/archives/"*.deb "$fs/var/cache/apt/"*.bin "$fs/var/lib/apt/lists/"* "$fs/var/log/"*.log
  rm -f "$fs/etc/apt/sources.list"
  cat >"$fs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  tar --numeric-owner -C "$fs" -c . \
    | "$podman" import -q --change 'CMD ["bash"]' - docker.io/library/debian:bookworm-slim >/dev/null \
    || fail "podman import of the root filesystem failed"
  rm -rf "$fs"
}

# What podman needs to run a container here: nothing where it is set up as
# usual; in a VM without CAP_SYS_RESOURCE and with hybrid cgroups (v1 and v2
# mounted), runc (crun 1.8 refuses hybrid cgroups) and rlimits no higher
# than the shell's. Each candidate: global flags | run and build flags.
probe_flags() {
  local nofile candidates c g f
  nofile="$(ulimit -Hn)"; [ "$nofile" = unlimited ] && nofile=1048576
  candidates=("|"
    "--runtime runc|"
    "|--ulimit nofile=$nofile:$nofile --ulimit nproc=32768:32768"
    "--runtime runc|--ulimit nofile=$nofile:$nofile --ulimit nproc=32768:32768"
    "--runtime runc|--ulimit nofile=4096:4096 --ulimit nproc=4096:4096")
  for c in "${candidates[@]}"; do
    g="${c%%|*}"; f="${c#*|}"
    # shellcheck disable=SC2086
    if "$podman" $g run --rm $f debian:bookworm-slim true >"$work/probe.log" 2>&1; then
      echo "$c"; return 0
    fi
    echo "  podman $g run $f: $(tail -1 "$work/probe.log")" >&2
  done
  return 1
}

make_rust() {
  local sysroot="${CUMUX_RUST_SYSROOT:-}"
  if [ -z "$sysroot" ]; then
    sysroot="$(rustc +1.95.0 --print sysroot 2>/dev/null || rustc --print sysroot 2>/dev/null || true)"
  fi
  [ -x "$sysroot/bin/rustc" ] && [ -x "$sysroot/bin/cargo" ] \
    || fail "no Rust 1.95 toolchain to copy (set CUMUX_RUST_SYSROOT to one with bin/rustc and bin/cargo)"
  sysroot="$(readlink -f "$sysroot")"
  local version; version="$("$sysroot/bin/rustc" --version)"
  case "$version" in "rustc 1.95."*) ;; *) fail "$sysroot is $version, not 1.95";; esac
  # The build stage downloads crates: it trusts what the host trusts (a
  # TLS-intercepting proxy's CA, say), not only Debian's bundle.
  local ca="${CUMUX_IMAGES_CA:-/etc/ssl/certs/ca-certificates.crt}"
  [ -r "$ca" ] || fail "no CA bundle at $ca (set CUMUX_IMAGES_CA)"
  step "making rust:1.95-bookworm (debian:bookworm-slim, gcc, $version from $sysroot, the CAs of $ca)"
  mkdir -p "$work/rust"
  cat >"$work/rust/Containerfile" <<'EOF'
FROM docker.io/library/debian:bookworm-slim
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends ca-certificates gcc libc6-dev make pkg-config git curl >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && cp /host-ca.crt /usr/local/share/ca-certificates/host-bundle.crt && update-ca-certificates >/dev/null 2>&1
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo RUST_VERSION=1.95.0 \
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN mkdir -p /usr/local/rustup/toolchains/1.95.0-x86_64-unknown-linux-gnu /usr/local/cargo/bin \
 && cp -a /toolchain/bin /toolchain/lib /toolchain/libexec /toolchain/etc \
      /usr/local/rustup/toolchains/1.95.0-x86_64-unknown-linux-gnu/ \
 && for b in /usr/local/rustup/toolchains/1.95.0-x86_64-unknown-linux-gnu/bin/*; do \
      ln -s "$b" /usr/local/cargo/bin/; done \
 && cargo --version && rustc --version
EOF
  # shellcheck disable=SC2086
  nice -n "$nice_level" "$podman" $gflags build $flags -q -v "$sysroot:/toolchain:ro" -v "$ca:/host-ca.crt:ro" \
    -t docker.io/library/rust:1.95-bookworm "$work/rust" >/dev/null \
    || fail "building rust:1.95-bookworm failed"
}

step "base images"
have_image docker.io/library/debian:bookworm-slim || make_debian_slim
if [ -n "${CUMUX_IMAGES_FLAGS+set}" ]; then
  chosen="$CUMUX_IMAGES_FLAGS"
else
  chosen="$(probe_flags)" || fail "podman cannot run a container here (see the attempts above)"
fi
gflags="${chosen%%|*}"; flags="${chosen#*|}"
[ "$chosen" != "$gflags" ] || flags=""
echo "podman flags: global '${gflags}', run and build '${flags}' (CUMUX_IMAGES_FLAGS='$chosen')"
have_image docker.io/library/rust:1.95-bookworm || make_rust
pm run --rm $flags docker.io/library/rust:1.95-bookworm cargo --version \
  || fail "rust:1.95-bookworm has no working cargo"

# --- the two images ----------------------------------------------------------

build() {  # build NAME DOCKERFILE
  local start end
  step "podman build -f $2 -t $1 ."
  start=$(date +%s)
  # shellcheck disable=SC2086
  nice -n "$nice_level" "$podman" $gflags build $flags -f "$root/$2" -t "$1" "$root" >"$work/build-$1.log" 2>&1 \
    || { tail -30 "$work/build-$1.log" >&2; fail "podman build of $1 failed (log above)"; }
  end=$(date +%s)
  echo "built $1 in $((end - start)) s; $(pm image inspect --format '{{.Size}}' "$1" | awk '{printf "%.1f MB", $1/1e6}')"
}
build cumux-server packaging/Dockerfile.server
build cumux-client packaging/Dockerfile.client

# --- the program -------------------------------------------------------------

step "building tests/cuda/corpus/vector_add.cu, and a program that holds a session open, with the pinned nvcc"
cuda_home="${CUMUX_CUDA_HOME:-$("$root/scripts/setup-nvcc")}"
mkdir -p "$work/bin" "$work/run" "$work/src"
"$cuda_home/bin/nvcc" -L"$cuda_home/lib" -o "$work/bin/vector_add" "$root/tests/cuda/corpus/vector_add.cu" \
  || fail "nvcc failed on vector_add.cu"
# hold: a session that stays open (1 MiB, one launch) until the file named by
# its argument exists (at most 2 minutes), for cumux status and the drain.
cat >"$work/src/hold.cu" <<'CU'
#include <cstdio>
#include <unistd.h>
__global__ void fill(int* p) { p[threadIdx.x] = threadIdx.x; }
int main(int argc, char** argv)
{
    int* d = nullptr;
    if (argc < 2 || cudaMalloc(&d, 1 << 20) != cudaSuccess) return 2;
    fill<<<1, 32>>>(d);
    if (cudaDeviceSynchronize() != cudaSuccess) return 2;
    printf("hold: READY\n");
    fflush(stdout);
    for (int i = 0; i < 1200 && access(argv[1], F_OK) != 0; ++i) usleep(100000);
    int h[32];
    if (cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess || h[31] != 31) return 1;
    cudaFree(d);
    printf("hold: PASS\n");
    return 0;
}
CU
"$cuda_home/bin/nvcc" -L"$cuda_home/lib" -o "$work/bin/hold" "$work/src/hold.cu" || fail "nvcc failed on hold.cu"

# --- the pair ----------------------------------------------------------------

step "server container: cumux serve --device cpu, socket folder $work/run mounted at /run/cumux"
# shellcheck disable=SC2086
pm run -d $flags --name "$server_name" -v "$work/run:/run/cumux" cumux-server \
  serve --device cpu --listen unix:/run/cumux/cumux.sock >/dev/null || fail "the server container did not start"
for _ in $(seq 60); do [ -S "$work/run/cumux.sock" ] && break; sleep 0.5; done
[ -S "$work/run/cumux.sock" ] || { pm logs "$server_name" 2>&1 | tail -20; fail "no socket after 30 s"; }
pm logs "$server_name" 2>&1 | grep -m1 'cumux serve: listening' || fail "the server did not say it listens"

client() {  # client ARGS...: a client container with the socket folder and the program
  # shellcheck disable=SC2086
  pm run --rm $flags -v "$work/run:/run/cumux" -v "$work/bin:/prog:ro" cumux-client "$@"
}

step "client container, the image's LD_LIBRARY_PATH alone: /prog/vector_add"
out="$(client /prog/vector_add 2>&1)" || { echo "$out"; fail "vector_add failed in the client container"; }
echo "$out"
grep -q '^vector_add: PASS' <<<"$out" || fail "no PASS from vector_add (LD_LIBRARY_PATH)"

step "client container: cumux run -- /prog/vector_add"
out="$(client cumux run -- /prog/vector_add 2>&1)" || { echo "$out"; fail "cumux run vector_add failed"; }
echo "$out"
grep -q '^vector_add: PASS' <<<"$out" || fail "no PASS from vector_add (cumux run)"

step "client container: /prog/hold keeps a session open; cumux status from another client container"
hold_name="cumux-images-hold-$$"
# shellcheck disable=SC2086
pm run -d $flags --name "$hold_name" -v "$work/run:/run/cumux" -v "$work/bin:/prog:ro" cumux-client \
  /prog/hold /prog/release >/dev/null || fail "the hold container did not start"
for _ in $(seq 60); do pm logs "$hold_name" 2>&1 | grep -q 'hold: READY' && break; sleep 0.5; done
pm logs "$hold_name" 2>&1 | grep -q 'hold: READY' || { pm logs "$hold_name"; fail "hold never got ready"; }
out="$(client cumux status 2>&1)" || { echo "$out"; fail "cumux status failed"; }
echo "$out"
grep -q 'cumux CPU reference device' <<<"$out" || fail "cumux status shows no CPU device"
grep -Eq '^[0-9]+ +[0-9]+ +hold +default +1.0 MiB +1 +1 ' <<<"$out" \
  || fail "cumux status does not show hold's session (1 MiB, 1 allocation, 1 launch)"

step "podman stop (SIGTERM) while hold's session is open: the server drains, hold finishes, the server exits 0"
pm stop -t 60 "$server_name" >/dev/null &
stopper=$!
for _ in $(seq 40); do pm logs "$server_name" 2>&1 | grep -q 'SIGTERM: draining' && break; sleep 0.25; done
pm logs "$server_name" 2>&1 | grep -q 'SIGTERM: draining' || fail "no drain line in the server's log after SIGTERM"
# podman says "stopping" from the signal on; the server waits for hold.
case "$(pm inspect --format '{{.State.Status}}' "$server_name")" in
  running|stopping) ;;
  *) fail "the server stopped without waiting for hold's session";;
esac
sleep 1
touch "$work/bin/release"
code="$(pm wait "$hold_name")"
pm logs "$hold_name" 2>&1
pm rm "$hold_name" >/dev/null
[ "$code" = 0 ] || fail "hold exited with $code during the drain"
wait "$stopper" || fail "podman stop failed"
code="$(pm inspect --format '{{.State.ExitCode}}' "$server_name")"
pm logs "$server_name" 2>&1 | grep -E 'SIGTERM: draining|draining: new connections|cumux serve: stopped' \
  | sed 's/^[0-9T:.-]*Z *//'
[ "$code" = 0 ] || fail "the server exited with $code"
pm logs "$server_name" 2>&1 | grep -q 'cumux serve: stopped: every session had ended' \
  || fail "the server's log does not say every session ended"
[ ! -e "$work/run/cumux.sock" ] || fail "the socket is left behind"

step "the server image's own CMD (its /etc/cumux/cumux.toml; without a GPU, the CPU device)"
pm rm "$server_name" >/dev/null
# shellcheck disable=SC2086
pm run -d $flags --name "$server_name" -v "$work/run:/run/cumux" cumux-server >/dev/null \
  || fail "the server container did not start with its CMD"
for _ in $(seq 60); do [ -S "$work/run/cumux.sock" ] && break; sleep 0.5; done
[ -S "$work/run/cumux.sock" ] || { pm logs "$server_name" 2>&1 | tail -5; fail "the image's CMD does not listen"; }
pm logs "$server_name" 2>&1 | grep -m1 'cumux serve: listening'
out="$(client /prog/vector_add 2>&1)" || { echo "$out"; fail "vector_add failed against the image's CMD"; }
echo "$out"
grep -q '^vector_add: PASS' <<<"$out" || fail "no PASS from vector_add (the image's CMD)"
pm stop -t 60 "$server_name" >/dev/null || fail "podman stop failed"
code="$(pm inspect --format '{{.State.ExitCode}}' "$server_name")"
[ "$code" = 0 ] || fail "the server (the image's CMD) exited with $code"

step "images"
pm images --format '{{.Repository}}:{{.Tag}} {{.Size}}' \
  | grep -E 'cumux-(server|client)|debian:bookworm-slim|rust:1.95-bookworm'
echo
echo "images.sh: PASS: both images build; vector_add passes in client containers (LD_LIBRARY_PATH, cumux run); cumux status sees a live session; SIGTERM drains it and the server exits 0; the server image's own CMD serves"
