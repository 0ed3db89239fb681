#!/usr/bin/env bash
# Where the server's memory goes over many sessions (the soak saw its RSS grow):
# one `cumux serve` (SERVE_ARGS, default `--sharing shared --policy fair`)
# takes ROUNDS rounds of (a) PyTorch sessions (pytorch_tenants.py work 1 2),
# (b) CUDA corpus programs, (c) corpus programs killed mid-run; the server's RSS
# and threads after each round. Run once more with MALLOC_ARENA_MAX=2 to tell
# allocator arenas from a leak (ARENAS=0 leaves that run out). Writes
# $OUT/rss-probe.txt, and each server's log to $W (printed at the end).
#
#   OUT=/some/dir bench/h100/rss_probe.sh
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-rss}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
ROUNDS=${ROUNDS:-4}
SERVE_ARGS=${SERVE_ARGS---sharing shared --policy fair}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-rss.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
REPORT=$OUT/rss-probe.txt
: >"$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }
for p in vector_add saxpy printf_kernel matmul_tiled; do
    "$NVCC" -I"$ROOT/tests/cuda/corpus" -o "$W/$p" "$ROOT/tests/cuda/corpus/$p.cu" || say "build failed: $p"
done
probe() { # probe LABEL ENV...
    local label=$1
    shift
    rm -f "$W/s.sock"
    # shellcheck disable=SC2086
    env "$@" "$KIT/cumux" serve --device cuda $SERVE_ARGS --listen "unix:$W/s.sock" >"$W/server-$label.log" 2>&1 &
    local server=$!
    for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
    local run="$KIT/cumux run --server unix:$W/s.sock"
    sample() { say "$label $1: rss $(ps -o rss= -p $server | tr -d ' ') KiB, threads $(ls /proc/$server/task | wc -l)"; }
    sample start
    for r in $(seq "$ROUNDS"); do
        pids=()
        for i in 1 2 3 4; do
            $run --tenant "p$i" -- python3 "$ROOT/bench/h100/pytorch_tenants.py" work 1 2 >/dev/null 2>&1 &
            pids+=($!)
        done
        wait "${pids[@]}"
        sample "round $r after 4 PyTorch"
        for i in $(seq 10); do
            pids=()
            for p in vector_add saxpy printf_kernel matmul_tiled; do
                $run --tenant "c$((i % 3))" -- "$W/$p" >/dev/null 2>&1 &
                pids+=($!)
            done
            wait "${pids[@]}"
        done
        sample "round $r after 40 programs"
        for i in $(seq 10); do
            $run --tenant k -- "$W/matmul_tiled" >/dev/null 2>&1 &
            local victim=$!
            sleep 0.$((RANDOM % 5 + 1))
            pkill -9 -f "^$W/matmul_tiled" 2>/dev/null
            wait "$victim"
        done
        sample "round $r after 10 killed"
    done
    "$KIT/cumux" status --server "unix:$W/s.sock" >>"$REPORT" 2>&1
    kill "$server"
    wait "$server" 2>/dev/null
    cp "$W/server-$label.log" "$OUT/" 2>/dev/null
}
probe plain CUMUX_LOG=${CUMUX_LOG:-info}
[ "${ARENAS:-1}" = 1 ] && probe arenas2 MALLOC_ARENA_MAX=2
say done
