#!/usr/bin/env bash
# Do two GPU-filling tenants in separate processes overlap on the GPU? Each
# runs `tenant_bench throughput` (back-to-back kernels of about 2 ms and
# 200 µs, 8 blocks of 256 threads an SM) alone and beside the other:
# natively (the driver time-slices two contexts, so the two shares of the
# alone rates add up to at most about 1) and through cumux in each
# --sharing/--policy given. Prints `share MODE PAIR A B SUM`.
#   KIT=device-kit/main OUT=dir bench/h100/probes/overlap.sh
# Optional: NVCC=, SECS= (3), MODES= ("isolated:fifo isolated:fair shared:fifo").
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
KIT=${KIT:-$ROOT/device-kit/main}
OUT=${OUT:-/tmp/overlap}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
SECS=${SECS:-3}
MODES=${MODES:-isolated:fifo isolated:fair shared:fifo}
. "$ROOT/bench/h100/lib.sh"
W=$(mktemp -d); pids=(); trap stop_all EXIT
mkdir -p "$OUT"
"$NVCC" -O2 -arch=sm_90 -o "$W/tb" "$ROOT/bench/cuda/tenant_bench.cu" || exit 1
export TENANT_BLOCKS_PER_SM=8
metric() { awk -v k="$2" '$1 == "metric" && $2 == k { print $3 }' "$1" | tail -1; }
nvidia-smi -q | grep -i -E "compute mode|MPS|Persistence" | sed 's/^ */smi: /'
declare -A IT
for us in 2000 200; do "$W/tb" calibrate $us >"$W/c$us"; IT[$us]=$(metric "$W/c$us" iters); echo "kernel $us us: ${IT[$us]} iterations"; done
one() { # one PREFIX US FILE
    if [ "$1" = native ]; then "$W/tb" throughput "${IT[$2]}" "$SECS" >"$3" 2>&1
    else "$KIT/cumux" run --server "$1" --tenant "t$2$RANDOM" -- "$W/tb" throughput "${IT[$2]}" "$SECS" >"$3" 2>&1; fi
}
measure() { # measure LABEL SERVER
    local a b pa pb
    for us in 2000 200; do one "$2" $us "$W/alone_$1_$us"; echo "rate $1 alone $us $(metric "$W/alone_$1_$us" kernels_per_s)"; done
    for pair in "2000 2000" "2000 200"; do
        set -- "$1" "$2" $pair
        start_together
        one "$2" "$3" "$W/pa" & pa=$!; one "$2" "$4" "$W/pb" & pb=$!; wait $pa $pb; unset TENANT_START_AT
        a=$(metric "$W/pa" kernels_per_s); b=$(metric "$W/pb" kernels_per_s)
        python3 -c "a=$a/$(metric "$W/alone_$1_$3" kernels_per_s); b=$b/$(metric "$W/alone_$1_$4" kernels_per_s); print('share $1 $3+$4 %.3f %.3f %.3f' % (a, b, a+b))"
    done
}
measure native native
for m in $MODES; do
    sock=$W/${m/:/-}.sock
    "$KIT/cumux" serve --device cuda --sharing "${m%%:*}" --policy "${m#*:}" --listen "unix:$sock" >"$W/server-${m/:/-}.log" 2>&1 &
    srv=$!; pids+=($srv)
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    measure "${m/:/-}" "unix:$sock"
    kill $srv; wait $srv 2>/dev/null
done
