#!/usr/bin/env bash
# NVIDIA's public CUDA samples, natively and through `cumux run` (isolated):
# the census of issue 23. The samples are fetched here, never committed: a
# copy of NVIDIA/cuda-samples' Common/ and Samples/ (0, 1, 2, 3, 4, 6) in
# SAMPLES (an ignored folder carried to the GPU machine). Each sample without
# graphics or a library cumux's machine lacks is built with nvcc (-arch=sm_90,
# its libraries by what it includes), run natively, and the ones that pass
# natively run through cumux. Writes $OUT/samples.txt (a line per sample:
# native and cumux exit codes, the last error lines of a cumux failure).
#
#   OUT=/some/dir KIT=device-kit/main SAMPLES=.samples bench/h100/samples.sh
# Optional: ONLY= (sample names), JOBS= (parallel builds, 16), LIMIT= (seconds a run, 60),
# DEADLINE= (seconds in all before the runs stop, 400).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=$(cd "${KIT:-$ROOT/device-kit}" && pwd)
SAMPLES=$(cd "${SAMPLES:-$ROOT/.samples}" && pwd)
OUT=${OUT:-/tmp/cumux-samples}
JOBS=${JOBS:-16}
LIMIT=${LIMIT:-60}
DEADLINE=${DEADLINE:-400}
NVCC=${NVCC:-nvcc}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-samples.XXXXXX)
REPORT=$OUT/samples.txt
say() { echo "$*" | tee -a "$REPORT"; }
# shellcheck source=bench/samples_libs.sh
. "$ROOT/bench/samples_libs.sh"
start=$SECONDS

# The samples to build: name and folder, unless graphics or missing libraries.
for dir in "$SAMPLES"/Samples/*/*/; do
    name=$(basename "$dir")
    [ -n "${ONLY:-}" ] && ! printf ' %s ' $ONLY | grep -qF " $name " && continue
    libs=$(sample_libs "$dir" "$SAMPLES") || continue
    echo "$name|$dir|$libs"
done >"$W/list"
say "samples: $(wc -l <"$W/list") to build ($(date -u +%FT%TZ)); gpu $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); kit $(cat "$KIT/COMMIT" 2>/dev/null)"

build() {
    IFS='|' read -r name dir libs <<<"$1"
    [ -x "$dir/$name" ] && return 0
    # Driver-API samples load their kernels from a fatbin or PTX file that
    # their CMakeLists builds beside them (CUDA_FATBIN_FILE / CUDA_PTX_FILE).
    local kernel out kind
    kernel=$(sed -n 's/.*set(CUDA_KERNEL_SOURCE "[^"]*\/\([^"/]*\.cu\)").*/\1/p' "$dir/CMakeLists.txt" 2>/dev/null | head -1)
    for kind in fatbin ptx; do
        out=$(sed -n "s/.*set(CUDA_$(tr a-z A-Z <<<"$kind")_FILE \"[^\"]*\/\([^\"/]*\.$kind\)\").*/\1/p" "$dir/CMakeLists.txt" 2>/dev/null | head -1)
        if [ -n "$out" ] && [ -n "$kernel" ] && [ ! -e "$dir/$out" ]; then
            timeout 240 "$NVCC" -w -arch=sm_90 -I"$SAMPLES/Common" -I"$dir" "-$kind" -o "$dir/$out" "$dir/$kernel" >>"$dir/build.log" 2>&1
        fi
    done
    # shellcheck disable=SC2086 # library flags are words
    timeout 240 "$NVCC" -O2 -w -std=c++17 -arch=sm_90 -I"$SAMPLES/Common" -I"$dir" -o "$dir/$name" \
        "$dir"*.cu $(ls "$dir"*.cpp 2>/dev/null) $libs >"$dir/build.log" 2>&1 || echo "$name" >>"$2"
}
export -f build
export NVCC SAMPLES
: >"$W/build-failed"
xargs -P "$JOBS" -I{} bash -c 'build "$@"' _ {} "$W/build-failed" <"$W/list"
say "built in $((SECONDS - start)) s; build failures: $(wc -l <"$W/build-failed"): $(tr '\n' ' ' <"$W/build-failed")"

"$KIT/cumux" serve --device cuda --listen "unix:$W/s.sock" >"$W/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
native_pass=0 cumux_pass=0 tried=0
while IFS='|' read -r name dir _; do
    [ -x "$dir/$name" ] || continue
    if [ $((SECONDS - start)) -gt "$DEADLINE" ]; then say "deadline: stopped before $name"; break; fi
    (cd "$dir" && timeout "$LIMIT" "./$name" >"$W/$name.native" 2>&1)
    n=$?
    if [ "$n" != 0 ]; then
        say "$(printf '%-36s native %3s  (not run through cumux)' "$name" "$n")"
        continue
    fi
    native_pass=$((native_pass + 1)); tried=$((tried + 1))
    (cd "$dir" && timeout "$LIMIT" "$KIT/cumux" run --server "unix:$W/s.sock" -- "./$name" >"$W/$name.cumux" 2>&1)
    c=$?
    [ "$c" = 0 ] && cumux_pass=$((cumux_pass + 1))
    why=""
    [ "$c" != 0 ] && why=$(grep -v '^$' "$W/$name.cumux" | grep -i -E 'error|fail|cumux|not' | tail -2 | tr '\n' ' ' | cut -c1-220)
    say "$(printf '%-36s native %3s  cumux %3s  %s' "$name" "$n" "$c" "$why")"
done <"$W/list"
say "natively passing: $native_pass; through cumux: $cumux_pass of $tried ($((SECONDS - start)) s)"
kill "$server" 2>/dev/null
wait "$server" 2>/dev/null
