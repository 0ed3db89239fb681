#!/usr/bin/env bash
# Issue 4's micro-benchmarks on a GPU machine (the H100 box), native and
# through cumux in the same run: builds bench/cuda/microbench.cu with nvcc,
# starts `cumux serve --device cuda` on a private socket, runs each subcommand
# (launch_rate, launch_sync, sync_rtt, graph_replay, bandwidth) natively and then through `cumux run`,
# alternating, and writes $OUT/DATE-GPU-micro.json in the shape of
# bench/README.md (one metric per figure, ratio = cumux / native), plus a table on stdout. Logs of every run
# and the server's go to $OUT/micro-logs/.
#
# Needs prebuilt binaries in device-kit/ (cumux and libcumux_client.so from
# `cargo build --release`) and nvcc; needs no Rust and no network. Every run
# has a timeout and the whole script keeps to MICRO_BUDGET seconds (default
# 165) however slow cumux is: a run that fails or times out leaves its figures
# null, with the reason in the JSON's "notes".
#
#   OUT=/some/dir bench/h100/microbench.sh
# Optional: KIT=, NVCC=, NVCC_FLAGS= (extra nvcc arguments), DEVICE= (default
# cuda; cpu for a dry run without a GPU), MICRO_SCALE= (default 1: scales
# launch counts, iterations and repetitions; 0.01 for a dry run),
# MICRO_MAX_BYTES= (largest copy, default 268435456), MICRO_BUDGET=,
# GPU_SLUG= (file name part, default from nvidia-smi, e.g. h100),
# CUMUX_REAL_LIBCUDA= (default: the libcuda.so.1 ldconfig knows),
# WORKER_TRANSPORT= (shm, the default: server <-> worker through shared memory;
# socket: CUMUX_WORKER_TRANSPORT=socket, that hop on its socket pair as before).
set -u

START=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-micro}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
NVCC_FLAGS=${NVCC_FLAGS:-}
DEVICE=${DEVICE:-cuda}
MICRO_SCALE=${MICRO_SCALE:-1}
MICRO_MAX_BYTES=${MICRO_MAX_BYTES:-268435456}
MICRO_BUDGET=${MICRO_BUDGET:-165}
WORKER_TRANSPORT=${WORKER_TRANSPORT:-shm}
WORK=$(mktemp -d /tmp/cumux-micro.XXXXXX)
SOCK=$WORK/cumux.sock
SERVER=unix:$SOCK
LOGS=$OUT/micro-logs
mkdir -p "$LOGS"
NOTES=$LOGS/notes.txt
: >"$NOTES"
note() { printf '%s\n' "$*" >>"$NOTES"; printf 'note: %s\n' "$*"; }
elapsed() { echo $(($(date +%s) - START)); }

# The server must load NVIDIA's driver, never cumux's: name it by path.
if [ -z "${CUMUX_REAL_LIBCUDA:-}" ]; then
    real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    if [ -n "$real" ]; then export CUMUX_REAL_LIBCUDA=$real; fi
fi

DATE=$(date -u +%Y-%m-%d)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
if [ "$DEVICE" != cuda ]; then GPU="none (cumux $DEVICE device)"; fi
if [ -z "${GPU_SLUG:-}" ]; then
    GPU_SLUG=$(printf '%s\n' "$GPU" | tr ' ' '\n' | grep -m1 -E '^[A-Za-z]+[0-9]+' | tr 'A-Z' 'a-z')
    [ "$DEVICE" != cuda ] && GPU_SLUG=$DEVICE
    GPU_SLUG=${GPU_SLUG:-gpu}
fi
COMMIT=$(cat "$KIT/COMMIT" 2>/dev/null | head -1 | tr -d '[:space:]')
[ -n "$COMMIT" ] || COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
JSON=$OUT/$DATE-$GPU_SLUG-micro.json

# Iteration counts (full: 20000 launches, 2000 launch+sync, rep scale 1).
read -r LAUNCHES ITERS < <(awk -v s="$MICRO_SCALE" 'BEGIN {
    l = int(20000 * s + 0.5); if (l < 10) l = 10
    i = int(2000 * s + 0.5); if (i < 10) i = 10
    print l, i }')
SUBS=(launch_rate launch_sync sync_rtt graph_replay bandwidth)
declare -A ARGS=([launch_rate]="$LAUNCHES" [launch_sync]="$ITERS" [sync_rtt]="$ITERS" [graph_replay]="$ITERS" [bandwidth]="$MICRO_SCALE $MICRO_MAX_BYTES")

echo "cumux micro-benchmarks, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "gpu: ${GPU:-unknown}, driver ${DRIVER:-unknown}; kit: $KIT ($COMMIT); device: $DEVICE"
echo "real libcuda: ${CUMUX_REAL_LIBCUDA:-libcuda.so.1 by soname}"
echo "server <-> worker transport: $WORKER_TRANSPORT"
echo "launches $LAUNCHES, launch+sync iterations $ITERS, bandwidth rep scale $MICRO_SCALE up to $MICRO_MAX_BYTES bytes"
[ "$MICRO_SCALE" = 1 ] || note "scaled run: MICRO_SCALE=$MICRO_SCALE ($LAUNCHES launches, $ITERS launch+sync iterations)"
[ "$MICRO_MAX_BYTES" = 268435456 ] || note "copies only up to MICRO_MAX_BYTES=$MICRO_MAX_BYTES bytes"

SERVER_PID=
stop_server() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$SERVER_PID" 2>/dev/null
    fi
}
cleanup() { stop_server; rm -rf "$WORK"; }
trap cleanup EXIT

# --- build ----------------------------------------------------------------
BIN=$WORK/microbench
built=0
# shellcheck disable=SC2086 # NVCC_FLAGS is a list of words
if timeout -k 5 90 "$NVCC" -O2 $NVCC_FLAGS -o "$BIN" "$ROOT/bench/cuda/microbench.cu" >"$LOGS/build.txt" 2>&1; then
    built=1
else
    note "build failed: $(grep -v '^$' "$LOGS/build.txt" | tail -1 | cut -c1-200)"
fi

# --- server ---------------------------------------------------------------
up=0
if [ "$built" = 1 ]; then
    missing=
    for f in cumux libcumux_client.so; do [ -e "$KIT/$f" ] || missing="$missing $f"; done
    if [ -n "$missing" ]; then
        note "kit $KIT lacks:$missing; no cumux runs"
    else
        # The server logs how each worker connection travels (checked below).
        if [ "$WORKER_TRANSPORT" = socket ]; then export CUMUX_WORKER_TRANSPORT=socket; else unset CUMUX_WORKER_TRANSPORT; fi
        CUMUX_LOG=${CUMUX_LOG:-info,cumux_server::worker=debug} \
            "$KIT/cumux" serve --device "$DEVICE" --listen "$SERVER" >"$LOGS/server.log" 2>&1 &
        SERVER_PID=$!
        for _ in $(seq 300); do
            if [ -S "$SOCK" ] && timeout 10 "$KIT/cumux" status --server "$SERVER" >/dev/null 2>&1; then up=1; break; fi
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        if [ "$up" = 1 ]; then
            echo "server: up after $(elapsed) s"
            # Let its warm spare context settle before native figures are taken.
            sleep 1
        else
            note "cumux serve --device $DEVICE did not come up: $(tail -1 "$LOGS/server.log" | cut -c1-200)"
        fi
    fi
fi
echo

# --- runs: native, cumux, alternating ---------------------------------------
# Each run's limit: a native run at most 30 s; a cumux run at most 120 s and
# its weighted share of what is left once 20 s per native run still to come is
# set aside (unused time passes on to the later runs).
declare -A WEIGHT=([launch_rate]=1 [launch_sync]=1 [sync_rtt]=1 [graph_replay]=1 [bandwidth]=2)
run_one() { # way sub
    local way=$1 sub=$2 limit t0 t1 rc why s i native_after=0 weight_after=0 pool
    for i in "${!SUBS[@]}"; do [ "${SUBS[$i]}" = "$sub" ] && break; done
    for s in "${SUBS[@]:$((i + 1))}"; do
        native_after=$((native_after + 1)); weight_after=$((weight_after + WEIGHT[$s]))
    done
    [ "$way" = native ] && weight_after=$((weight_after + WEIGHT[$sub]))
    pool=$((MICRO_BUDGET - $(elapsed) - 20 * native_after))
    if [ "$way" = native ]; then
        limit=$((pool - 5 * weight_after)); [ "$limit" -gt 30 ] && limit=30
    else
        limit=$((pool * WEIGHT[$sub] / (WEIGHT[$sub] + weight_after))); [ "$limit" -gt 120 ] && limit=120
    fi
    local out=$LOGS/$sub.$way.txt err=$LOGS/$sub.$way.err
    : >"$out"; : >"$err"
    if [ "$built" != 1 ]; then return; fi
    if [ "$way" = cumux ] && [ "$up" != 1 ]; then return; fi
    if [ "$limit" -lt 5 ]; then note "$way $sub: skipped, out of time"; return; fi
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086 # ARGS are words
    if [ "$way" = native ]; then
        timeout -k 5 "$limit" "$BIN" "$sub" ${ARGS[$sub]} >"$out" 2>"$err"
    else
        timeout -k 5 "$limit" "$KIT/cumux" run --server "$SERVER" --tenant micro -- "$BIN" "$sub" ${ARGS[$sub]} >"$out" 2>"$err"
    fi
    rc=$?
    t1=$(date +%s.%N)
    printf '%-8s %-12s rc=%-3s %6.2f s\n' "$way" "$sub" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')"
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        note "$way $sub: timed out after $limit s (figures it printed before are kept)"
    elif [ "$rc" != 0 ]; then
        why=$( (cat "$out"; cat "$err") 2>/dev/null | grep -v -e '^metric ' -e '^$' | tail -1 | cut -c1-200)
        note "$way $sub: exit $rc: $why"
    fi
}
for sub in "${SUBS[@]}"; do
    run_one native "$sub"
    run_one cumux "$sub"
done
echo

if [ "$up" = 1 ]; then
    shm_links=$(grep -c 'worker connection on shared memory' "$LOGS/server.log")
    socket_links=$(grep -c -e 'worker connection on its socket' -e 'worker connection stays on its socket' "$LOGS/server.log")
    note "server <-> worker transport $WORKER_TRANSPORT: $shm_links worker connection(s) on shared memory, $socket_links on their socket"
    if [ "$WORKER_TRANSPORT" = shm ] && [ "$socket_links" != 0 ]; then
        note "server <-> worker: $socket_links connection(s) stayed on the socket: $(grep -m1 'stays on its socket' "$LOGS/server.log" | cut -c1-200)"
    fi
fi

# --- result ---------------------------------------------------------------
python3 "$ROOT/bench/h100/micro_json.py" "$LOGS" "$JSON" "$DATE" "$GPU" "$DRIVER" "$COMMIT" "$MICRO_MAX_BYTES"
py_rc=$?
if [ "$up" = 1 ]; then
    kill -0 "$SERVER_PID" 2>/dev/null && echo "server alive at the end: yes" || echo "server alive at the end: NO"
fi
echo "total wall: $(elapsed) s"
exit "$py_rc"
