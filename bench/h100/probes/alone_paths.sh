#!/usr/bin/env bash
# What one paced tenant gets alone through each path (issues 20, 21): the
# kernels/s of `tenant_bench paced STYLE` with launch-bound (1 iteration) and
# ~20 µs kernels, natively and through cumux under each --sharing:--policy,
# alternating ROUNDS times; then one hop trace of TRACE (a mode) with the
# window style: each EventSynchronize split into hops, and a launch's path.
#   KIT=device-kit/main OUT=dir bench/h100/probes/alone_paths.sh
# Optional: DEVICE= (cuda; worker-cpu for a dry run, natively nothing), NVCC=, SECS= (2), ROUNDS= (2), STYLES= ("window sync streams"),
# MODES= ("isolated:fifo isolated:fair shared:fifo"), TRACE= (isolated:fair; none: no trace).
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
KIT=${KIT:-$ROOT/device-kit/main}
OUT=${OUT:-/tmp/alone-paths}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
SECS=${SECS:-2}
ROUNDS=${ROUNDS:-2}
STYLES=${STYLES:-window sync streams}
MODES=${MODES:-isolated:fifo isolated:fair shared:fifo}
TRACE=${TRACE:-isolated:fair}
. "$ROOT/bench/h100/lib.sh"
W=$(mktemp -d); pids=(); trap stop_all EXIT
mkdir -p "$OUT"
"$NVCC" -O2 -arch=sm_90 -o "$W/tb" "$ROOT/bench/cuda/tenant_bench.cu" || exit 1
export TENANT_BLOCKS_PER_SM=8
metric() { awk -v k="$2" '$1 == "metric" && $2 == k { print $3 }' "$1" | tail -1; }
"$W/tb" calibrate 20 >"$W/c20"; I20=$(metric "$W/c20" iters)
echo "kernels: 1 iteration (launch-bound) and $I20 iterations (about 20 us)"
declare -A SOCK
serve() { # serve MODE [TRACEDIR]: a server for sharing:policy, its socket in SOCK[MODE]
    local sharing=${1%%:*} policy=${1##*:} name=${1//:/-}
    if [ -n "${2:-}" ]; then
        CUMUX_HOP_TRACE=$2 "$KIT/cumux" serve --device "${DEVICE:-cuda}" --sharing "$sharing" --policy "$policy" \
            --listen "unix:$W/$name.sock" >"$W/server-$name.log" 2>&1 &
    else
        "$KIT/cumux" serve --device "${DEVICE:-cuda}" --sharing "$sharing" --policy "$policy" \
            --listen "unix:$W/$name.sock" >"$W/server-$name.log" 2>&1 &
    fi
    pids+=($!)
    for _ in $(seq 100); do [ -S "$W/$name.sock" ] && break; sleep 0.1; done
    SOCK[$1]=unix:$W/$name.sock
}
for m in $MODES; do serve "$m"; done
one() { # one MODE STYLE ITERS
    if [ "$1" = native ]; then [ "${DEVICE:-cuda}" = cuda ] && "$W/tb" paced "$2" "$3" "$SECS" >"$W/o" 2>&1
    else "$KIT/cumux" run --server "${SOCK[$1]}" --tenant "t$RANDOM" -- "$W/tb" paced "$2" "$3" "$SECS" >"$W/o" 2>&1; fi
    metric "$W/o" kernels_per_s
}
for r in $(seq "$ROUNDS"); do
    for style in $STYLES; do
        for iters in 1 "$I20"; do
            for m in native $MODES; do echo "rate $r $style $iters $m $(one "$m" "$style" "$iters")"; done
        done
    done
done
if [ "$TRACE" != none ]; then
    mkdir -p "$W/trace"
    serve "$TRACE" "$W/trace"
    CUMUX_HOP_TRACE=$W/trace "$KIT/cumux" run --server "${SOCK[$TRACE]}" --tenant traced -- \
        "$W/tb" paced window 1 1 >"$W/o" 2>&1
    echo "traced $TRACE window 1: $(metric "$W/o" kernels_per_s) kernels/s"
    # The server writes its trace as it ends.
    kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null
    python3 "$ROOT/bench/hop_trace.py" "$W/trace" --call EventSynchronize --top 5 2>&1 | head -40
    python3 "$ROOT/bench/hop_path.py" "$W/trace" 2>&1 | head -60
fi
