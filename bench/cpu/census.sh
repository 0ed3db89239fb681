#!/usr/bin/env bash
# The CPU device's census (issue 22): NVIDIA's public CUDA samples and the
# Rodinia suite (the CUDA half of manospavlidakis/rodinia_suite), built with
# this repository's pinned nvcc as PTX for compute 7.5 (what the CPU device
# runs), each run through `cumux run` against `cumux serve --device cpu` with
# a time limit. Both are fetched copies, never committed: SAMPLES is a copy of
# NVIDIA/cuda-samples (Common/ and Samples/), RODINIA an extracted
# rodinia_suite (cuda/, data/, common/); nothing is written into them. Its
# largest inputs are not in that repository; programs needing them are
# listed as not run.
#
#   SAMPLES=/path/cuda-samples RODINIA=/path/rodinia_suite OUT=/tmp/census bench/cpu/census.sh
#
# Optional: KIT= (a folder with `cumux` and `libcumux_client.so`; default the
# release build in $CARGO_TARGET_DIR or target/), NVCC= (default .venv's, as
# scripts/setup-nvcc installs it), PKGS= (a pip --target folder holding
# nvidia-cuda-nvrtc, nvidia-cuda-profiler-api and nvidia-nvtx; default: the
# script installs them into $OUT/pkgs with .venv's pip), LIMIT= (seconds a run,
# 60), JOBS= (parallel builds, 2), ONLY= (program names), SKIP= ("samples" or
# "rodinia"), NATIVE= (the H100 census whose natively passing samples are the
# denominator; default bench/results/2026-11-27-h100-samples-cumux-4b336f2.txt),
# SERVER_ARGS= (more `cumux serve` arguments), STAGE=build (build the samples
# and stop). Built programs are kept in $OUT/build and not rebuilt.
# Writes $OUT/census.txt: a line per program (built?, exit code, seconds,
# check, last error lines), the counts, and how many kernels ran on the
# interpreter for which reason; each program's output in $OUT/logs, the
# server's log (which names each such kernel) in $OUT/server.log.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=bench/samples_libs.sh
. "$ROOT/bench/samples_libs.sh"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
KIT=${KIT:-$TARGET/release}
OUT=${OUT:-/tmp/cumux-cpu-census}
LIMIT=${LIMIT:-60}
JOBS=${JOBS:-2}
SKIP=${SKIP:-}
NVCC=${NVCC:-$(ls "$ROOT"/.venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc 2>/dev/null | head -1)}
[ -x "$NVCC" ] || { echo "nvcc not found: run scripts/setup-nvcc or set NVCC=" >&2; exit 1; }
if [ ! -x "$KIT/cumux" ] || [ ! -e "$KIT/libcumux_client.so" ]; then
    echo "no cumux kit in $KIT: cargo build --release -p cumux-cli -p cumux-client, or set KIT=" >&2
    exit 1
fi
KIT=$(cd "$KIT" && pwd)
CUDA_HOME=$(cd "$(dirname "$NVCC")/.." && pwd)
NATIVE=${NATIVE:-$ROOT/bench/results/2026-11-27-h100-samples-cumux-4b336f2.txt}
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d /tmp/cumux-cpu-census.XXXXXX)
B=$OUT/build # the built programs, kept: a second census reuses them
mkdir -p "$B"
# NVIDIA's headers and libraries some samples need beside the compiler
# (NVRTC, the profiler API header, NVTX), from PyPI into $OUT/pkgs, unless
# PKGS names such a --target folder.
if [ -z "${PKGS:-}" ]; then
    PKGS=$OUT/pkgs
    [ -e "$PKGS/nvidia/cu13/include/nvrtc.h" ] || "$ROOT/.venv/bin/pip" install -q \
        --disable-pip-version-check --no-deps --target "$PKGS" nvidia-cuda-nvrtc==13.0.88 \
        nvidia-cuda-profiler-api==13.0.85 nvidia-nvtx==13.0.85 >&2
fi
PKG_HOME=$PKGS/nvidia/cu13
# Link folder: libcuda.so as the client driver (what a driver-API program
# links against; `cumux run` gives it the client), libnvrtc.so by its
# unversioned name, which NVIDIA's wheel lacks.
LINK=$B/link
mkdir -p "$LINK"
ln -sf "$KIT/libcumux_client.so" "$LINK/libcuda.so"
ln -sf "$(ls "$PKG_HOME"/lib/libnvrtc.so.* 2>/dev/null | head -1)" "$LINK/libnvrtc.so"
REPORT=$OUT/census.txt
: >"$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }
wanted() { [ -z "${ONLY:-}" ] || printf ' %s ' $ONLY | grep -qF " $1 "; }
start=$SECONDS
say "cpu census ($(date -u +%FT%TZ)); commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); limit ${LIMIT} s; nvcc $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"

# The server: one for the whole census, as a user's would be.
server=""
if [ "${STAGE:-}" != build ]; then
    # shellcheck disable=SC2086 # more arguments are words
    "$KIT/cumux" serve --device cpu --listen "unix:$W/s.sock" ${SERVER_ARGS:-} >"$OUT/server.log" 2>&1 &
    server=$!
fi
trap '[ -n "$server" ] && kill $server 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
for _ in $(seq 300); do [ -z "$server" ] || [ -S "$W/s.sock" ] && break; sleep 0.1; done
[ -z "$server" ] || [ -S "$W/s.sock" ] || { say "the server did not start: $(tail -3 "$OUT/server.log")"; exit 1; }

# run NAME DIR COMMAND...: one program through cumux in DIR, limited; sets
# rc, secs and why (the last error-looking lines of its output).
run() {
    local name=$1 dir=$2
    shift 2
    local t0=$EPOCHREALTIME
    (cd "$dir" && LD_LIBRARY_PATH="$PKG_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        timeout -k 5 "$LIMIT" "$KIT/cumux" run --server "unix:$W/s.sock" -- "$@" \
        >"$OUT/logs/$name.out" 2>&1)
    rc=$?
    secs=$(echo "$EPOCHREALTIME - $t0" | bc)
    secs=$(printf '%.1f' "$secs")
    why=""
    if [ "$rc" != 0 ]; then
        why=$(grep -a -v '^$' "$OUT/logs/$name.out" | grep -a -i -E 'error|fail|cumux|not |waiv|abort|assert|illegal' | tail -2 | tr '\n' ' ' | cut -c1-200)
        [ "$rc" = 124 ] || [ "$rc" = 137 ] && why="timed out; $why"
    fi
}

# --- NVIDIA's samples ---------------------------------------------------
if [ "$SKIP" != samples ] && [ -n "${SAMPLES:-}" ]; then
    SAMPLES=$(cd "$SAMPLES" && pwd)
    S=$B/samples
    mkdir -p "$S"
    # The same selection as bench/h100/samples.sh: no graphics, no library
    # this kind of machine lacks; each sample built in a copy of its folder.
    for dir in "$SAMPLES"/Samples/*/*/; do
        name=$(basename "$dir")
        wanted "$name" || continue
        libs=$(sample_libs "$dir" "$SAMPLES") || continue
        [ -d "$S/$name" ] || { mkdir -p "$S/$name" && cp -r "$dir". "$S/$name/"; }
        echo "$name|$S/$name/|$libs"
    done >"$W/samples.list"
    say "samples: $(wc -l <"$W/samples.list") to build; denominator: the natively passing ones in $(basename "${NATIVE:-none}")"

    # build LINE FAILED-LIST: PTX for compute 7.5 (the CPU device's
    # capability), else, for a sample that needs a newer architecture to
    # compile, PTX for compute 8.0 or 9.0 (the CPU device then runs the
    # lowest newer one). The driver-API samples' fatbins and PTX files too.
    build() {
        IFS='|' read -r name dir libs <<<"$1"
        local arch kernel out kind
        [ -x "$dir/$name" ] && [ -e "$dir/ARCH" ] && return 0
        kernel=$(sed -n 's/.*set(CUDA_KERNEL_SOURCE "[^"]*\/\([^"/]*\.cu\)").*/\1/p' "$dir/CMakeLists.txt" 2>/dev/null | head -1)
        for arch in 75 80 90; do
            : >"$dir/build.log"
            for kind in fatbin ptx; do
                out=$(sed -n "s/.*set(CUDA_$(tr a-z A-Z <<<"$kind")_FILE \"[^\"]*\/\([^\"/]*\.$kind\)\").*/\1/p" "$dir/CMakeLists.txt" 2>/dev/null | head -1)
                if [ -n "$out" ] && [ -n "$kernel" ]; then
                    timeout 600 "$NVCC" -w -arch=compute_$arch -I"$SAMPLES/Common" -I"$dir" -I"$PKG_HOME/include" "-$kind" -o "$dir/$out" "$dir/$kernel" >>"$dir/build.log" 2>&1
                fi
            done
            # shellcheck disable=SC2086 # library flags are words
            if timeout 600 "$NVCC" -O2 -w -std=c++17 -gencode "arch=compute_$arch,code=compute_$arch" \
                -I"$SAMPLES/Common" -I"$dir" -I"$PKG_HOME/include" -L"$CUDA_HOME/lib" -L"$LINK" -o "$dir/$name" \
                "$dir"*.cu $(ls "$dir"*.cpp 2>/dev/null) $libs >>"$dir/build.log" 2>&1; then
                echo "$arch" >"$dir/ARCH"
                return 0
            fi
        done
        echo "$name" >>"$2"
    }
    export -f build
    export NVCC SAMPLES CUDA_HOME PKG_HOME LINK
    : >"$W/build-failed"
    xargs -P "$JOBS" -I{} bash -c 'build "$@"' _ {} "$W/build-failed" <"$W/samples.list"
    say "built in $((SECONDS - start)) s; build failures: $(wc -l <"$W/build-failed"): $(tr '\n' ' ' <"$W/build-failed")"
    [ "${STAGE:-}" = build ] && exit 0

    pass=0 denom=0 waived=0 tried=0
    while IFS='|' read -r name dir _; do
        native=unknown
        if [ -n "$NATIVE" ]; then
            native=$(awk -v n="$name" '$1 == n && $2 == "native" { print $3 }' "$NATIVE" | head -1)
            [ -z "$native" ] && native=unlisted
        fi
        [ "$native" = 0 ] && denom=$((denom + 1))
        if [ ! -x "$dir/$name" ]; then
            err=$(grep -a -E 'error|fatal|cannot find' "$dir/build.log" | head -1 | cut -c1-160)
            say "$(printf '%-34s native %-8s not built  %s' "$name" "$native" "$err")"
            cp "$dir/build.log" "$OUT/logs/$name.build" 2>/dev/null
            continue
        fi
        tried=$((tried + 1))
        run "$name" "$dir" "./$name"
        # some samples exit 0 whatever their check found
        if [ "$rc" = 0 ] && grep -a -q -E 'Test failed|FAILED|Result = FAIL' "$OUT/logs/$name.out"; then
            rc=failed
            why=$(grep -a -E 'Test failed|FAILED|Result = FAIL' "$OUT/logs/$name.out" | head -1 | cut -c1-200)
        fi
        [ "$rc" = 0 ] && [ "$native" = 0 ] && pass=$((pass + 1))
        [ "$rc" = 2 ] && waived=$((waived + 1))
        say "$(printf '%-34s native %-8s ptx %s  rc %3s  %6s s  %s' "$name" "$native" "$(cat "$dir/ARCH")" "$rc" "$secs" "$why")"
    done <"$W/samples.list"
    say "samples passing on the CPU device: $pass of $denom natively passing on an H100 ($tried built and run here, $waived waived with exit code 2)"
fi

# --- Rodinia --------------------------------------------------------------
# name|folder|command|check. Checks: golden:OUT:REF (the program's output
# file against the suite's native reference, numbers within 1e-3 relative),
# none (ran, unchecked: no reference for this input).
# Inputs the suite names but does not ship (too large for its repository, and
# without a deterministic generator) are replaced by the shipped smaller ones,
# unchecked; a program whose only input is missing is listed as not run.
# particlefilter seeds its generator with the clock, so no two runs agree.
RODINIA_PROGRAMS='
backprop|backprop|./backprop 4194304|golden:result.txt:nat_result.txt
bfs|bfs|./bfs ../../data/bfs/graph65536.txt|golden:result.txt:nat_result.txt
b+tree|b+tree|./b+tree file ../../data/b+tree/mil.txt command ../../data/b+tree/command.txt|golden:result.txt:nat_result.txt
cfd|cfd|./cfd ../../data/cfd/fvcorr.domn.193K|golden:result_density.txt:nat_result_density.txt
dwt2d|dwt2d|./dwt2d ../../data/dwt2d/rgb.bmp -d 1024x1024 -f -5 -l 3|none
gaussian|gaussian|./gaussian -s 2048|golden:result.txt:nat_result.txt
heartwall|heartwall|./heartwall ../../data/heartwall/test.avi 20|golden:result.txt:nat_result.txt
hotspot|hotspot|./hotspot 512 2 2 ../../data/hotspot/temp_512 ../../data/hotspot/power_512 output.out|none
hotspot3D|hotspot3D|./hotspot3D 64 8 100 ../../data/hotspot3D/power_64x8 ../../data/hotspot3D/temp_64x8 output.out|none
huffman|huffman|./huffman ../../data/huffman/test1024_H2.206587175259.in|golden:result.txt:nat_result.txt
hybridsort|hybridsort|./hybridsort r|none
kmeans|kmeans|./kmeans -i ../../data/kmeans/100|none
lavaMD|lavaMD|./lavaMD -boxes1d 10|none
nn|nn|./nn filelist -r 5 -lat 30 -lng 90|none
nw|nw|./nw 8192 10|golden:result.txt:nat_result.txt
particlefilter|particlefilter|./particlefilter_float -x 128 -y 128 -z 100 -np 1000|none
pathfinder|pathfinder|./pathfinder 4096 4096 2|none
'
if [ "$SKIP" != rodinia ] && [ -n "${RODINIA:-}" ]; then
    RODINIA=$(cd "$RODINIA" && pwd)
    R=$B/rodinia
    if [ ! -d "$R" ]; then
        mkdir -p "$R"
        cp -r "$RODINIA/cuda" "$RODINIA/data" "$R/"
        [ -d "$RODINIA/common" ] && cp -r "$RODINIA/common" "$R/"
    fi
    rpass=0 rtried=0 rchecked=0
    while IFS='|' read -r name folder cmd check; do
        [ -n "$name" ] || continue
        wanted "$name" || continue
        dir=$R/cuda/$folder
        # Inputs the command names that are not there.
        missing=""
        for word in $cmd; do
            case $word in ../../data/*) [ -e "$dir/$word" ] || missing+=" ${word#../../}" ;; esac
        done
        if [ -n "$missing" ]; then
            say "$(printf '%-34s not run: input not in the suite%s' "rodinia/$name" "$missing")"
            continue
        fi
        if ! (cd "$dir" && PATH="$CUDA_HOME/bin:$PATH" make -s CUDA_DIR="$CUDA_HOME" CUDA_LIB_DIR="$CUDA_HOME/lib" \
            NVCC="$NVCC -L$CUDA_HOME/lib" GENCODE_FLAGS="-gencode arch=compute_75,code=compute_75" CXXFLAGS=" -m64 -O3 -DOUTPUT" \
            >"$OUT/logs/rodinia-$name.build" 2>&1); then
            say "$(printf '%-34s not built  %s' "rodinia/$name" "$(grep -a -E 'error' "$OUT/logs/rodinia-$name.build" | head -1 | cut -c1-160)")"
            continue
        fi
        rtried=$((rtried + 1))
        # shellcheck disable=SC2086 # the command is words
        run "rodinia-$name" "$dir" $cmd
        verdict=""
        if [ "$rc" = 0 ]; then
            case $check in
            golden:*)
                IFS=: read -r _ produced ref <<<"$check"
                rchecked=$((rchecked + 1))
                if [ ! -e "$dir/$ref" ]; then
                    verdict="ran, unchecked (no native reference in the suite)"
                    rchecked=$((rchecked - 1))
                elif verdict=$(python3 "$ROOT/bench/cpu/census_compare.py" "$dir/$produced" "$dir/$ref"); then
                    rpass=$((rpass + 1))
                else
                    rc=mismatch
                fi
                ;;
            none) verdict="ran, unchecked" ;;
            esac
        fi
        say "$(printf '%-34s rc %3s  %6s s  %s %s' "rodinia/$name" "$rc" "$secs" "$verdict" "$why")"
    done <<<"$RODINIA_PROGRAMS"
    say "rodinia: $rtried built and run; $rpass of $rchecked with a check pass it"
fi
say "kernels the CPU device ran on the interpreter, by reason (from its log):"
grep -a 'runs on the interpreter' "$OUT/server.log" | sed -n 's/.* why=\(line [0-9]*: \)\{0,1\}\(.*\)$/\2/p' | sort | uniq -c | sort -rn | tee -a "$REPORT"
say "census took $((SECONDS - start)) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
