#!/usr/bin/env bash
# Does CUDA_DEVICE_MAX_CONNECTIONS=32 (what cumux gives its workers, so that
# tenants' streams do not share hardware queues) cost a launch after an idle
# gap? launch_probe.cu and the latency tenant natively with the driver's
# default (8) and with 32, and the latency tenant alone through cumux (shared,
# `priority`) with its workers at 8 and at 32. ROUNDS rounds of each.
# Writes $OUT/connections.txt.
#
#   OUT=/some/dir bench/h100/probes/connections.sh
# Optional: KIT=, NVCC=, SECS= (default 3), ROUNDS= (default 2).
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-connections}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
SECS=${SECS:-3}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-connections.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
P=$ROOT/bench/h100/probes/launch_probe.cu
"$NVCC" -O2 -arch=sm_90 -o "$W/lp" "$P" -lcuda || exit 1
"$NVCC" -arch=sm_90 -cubin -o "$W/launch_probe.cubin" "$P" || exit 1
"$NVCC" -O2 -arch=sm_90 -o "$W/tb" "$ROOT/bench/cuda/tenant_bench.cu" || exit 1
metric() { awk -v k="$2" '$1 == "metric" && $2 == k { print $3 }' "$1" | tail -1; }
"$W/tb" calibrate 50 >"$W/c50" 2>&1
I50=$(metric "$W/c50" iters)
REPORT=$OUT/connections.txt
say() { echo "$*" | tee -a "$REPORT"; }
: >"$REPORT"
printf '[tenants.lc]\nclass = "latency-critical"\n' >"$W/tenants.toml"
for r in $(seq "$ROUNDS"); do
    for conns in default 32; do
        env=()
        [ "$conns" = 32 ] && env=(CUDA_DEVICE_MAX_CONNECTIONS=32)
        say "round $r, native, connections $conns:"
        (cd "$W" && env "${env[@]}" ./lp "$I50" "$SECS" "$W/launch_probe.cubin" 2>&1 | grep -E "plain|worker" | sed 's/^/    /' | tee -a "$REPORT")
        env "${env[@]}" "$W/tb" latency "$I50" "$SECS" >"$W/run" 2>&1
        say "    tenant_bench latency: p50 $(metric "$W/run" p50_us) p99 $(metric "$W/run" p99_us), launch p50 $(metric "$W/run" launch_p50_us) p99 $(metric "$W/run" launch_p99_us)"
    done
    for conns in 8 32; do
        CUDA_DEVICE_MAX_CONNECTIONS=$conns "$KIT/cumux" serve --device cuda --sharing shared --policy priority \
            --config "$W/tenants.toml" --listen "unix:$W/s.sock" >"$OUT/server_${r}_$conns.log" 2>&1 &
        server=$!
        for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
        "$KIT/cumux" run --server "unix:$W/s.sock" --tenant lc -- "$W/tb" latency "$I50" "$SECS" >"$W/run" 2>&1
        say "round $r, cumux shared priority, worker connections $conns: p50 $(metric "$W/run" p50_us) p99 $(metric "$W/run" p99_us), launch p50 $(metric "$W/run" launch_p50_us) p99 $(metric "$W/run" launch_p99_us)"
        kill "$server"; wait "$server" 2>/dev/null
        rm -f "$W/s.sock"
    done
done
rm -rf "$W"
