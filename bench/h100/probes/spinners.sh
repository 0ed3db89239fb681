#!/usr/bin/env bash
# Does a busy host cost a native program its latency tail? The latency tenant
# (bench/cuda/tenant_bench.cu latency: a 50 us kernel, a synchronize, 1 ms
# apart) natively, beside K threads that spin with pause instructions as
# cumux's waiting threads do (K = 0 3 6 12 by default), ROUNDS rounds each.
# Writes $OUT/spinners.txt.
#
#   OUT=/some/dir bench/h100/probes/spinners.sh
# Optional: NVCC=, SECS= (default 3), COUNTS=, ROUNDS= (default 2).
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${OUT:-/tmp/cumux-spinners}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
SECS=${SECS:-3}
COUNTS=${COUNTS:-0 3 6 12}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-spinners.XXXXXX)
"$NVCC" -O2 -arch=sm_90 -o "$W/tb" "$ROOT/bench/cuda/tenant_bench.cu" || exit 1
cat >"$W/spin.c" <<'C'
int main(void) { for (;;) __builtin_ia32_pause(); }
C
cc -O2 -o "$W/spin" "$W/spin.c" || exit 1
metric() { awk -v k="$2" '$1 == "metric" && $2 == k { print $3 }' "$1" | tail -1; }
"$W/tb" calibrate 50 >"$W/c50" 2>&1
I50=$(metric "$W/c50" iters)
REPORT=$OUT/spinners.txt
echo "latency tenant natively beside K pause-spinning threads ($(nproc) CPUs), p50 / p99 us" | tee "$REPORT"
for r in $(seq "$ROUNDS"); do
    for k in $COUNTS; do
        pids=()
        for _ in $(seq "$k"); do "$W/spin" & pids+=($!); done
        "$W/tb" latency "$I50" "$SECS" >"$W/run" 2>&1
        [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null
        wait 2>/dev/null
        echo "round $r K=$k: p50 $(metric "$W/run" p50_us) p99 $(metric "$W/run" p99_us)" | tee -a "$REPORT"
    done
done
rm -rf "$W"
