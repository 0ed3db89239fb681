#!/usr/bin/env bash
# Where a synchronous call's time goes on the GPU machine: runs the latency
# tenant (50 us kernel + stream sync, bench/cuda/tenant_bench.cu) and the
# launch+sync micro-benchmark natively and through cumux with the hop trace on
# (CUMUX_HOP_TRACE), and splits each call into its hops (bench/hop_trace.py).
# Also records the host's steal time per run and a native control with busy
# CPU hogs beside it. Writes $OUT/hop_profile.txt and $OUT/hop-*.json.
#
#   OUT=/some/dir bench/h100/hop_profile.sh
# Optional: KIT=, NVCC=, SECS= (default 3), DEVICE= (default cuda; worker-cpu for
# a dry run), RUNS= (default "lc_native lc lc_hogs micro lc_batch"; lc2,
# lc_batch2... repeat a run; lc_prio runs lc under `priority`, lc_batch_fifo
# runs lc_batch under `fifo`).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-hops}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
SECS=${SECS:-3}
DEVICE=${DEVICE:-cuda}
RUNS=${RUNS:-lc_native lc lc_hogs micro lc_batch}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-hops.XXXXXX)
if [ -z "${CUMUX_REAL_LIBCUDA:-}" ]; then
    real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    [ -n "$real" ] && export CUMUX_REAL_LIBCUDA=$real
fi
"$NVCC" -O2 -arch=sm_90 -o "$W/tb" "$ROOT/bench/cuda/tenant_bench.cu" || exit 1
"$NVCC" -O2 -arch=sm_90 -o "$W/mb" "$ROOT/bench/cuda/microbench.cu" || exit 1
metric() { awk -v k="$2" '$1 == "metric" && $2 == k { print $3 }' "$1" | tail -1; }
"$W/tb" calibrate 50 >"$W/c50" 2>&1
I50=$(metric "$W/c50" iters)
"$W/tb" calibrate 2000 >"$W/c2000" 2>&1
I2000=$(metric "$W/c2000" iters)
printf '[tenants.lc]\nclass = "latency-critical"\n' >"$W/tenants.toml"
REPORT=$OUT/hop_profile.txt
: >"$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }
# Steal time (host-taken vCPU time) in ticks, summed over all CPUs.
steal() { awk '$1 == "cpu" { print $9 }' /proc/stat; }

SERVER=
serve() { # serve NAME POLICY
    local name=$1 policy=$2
    rm -rf "$W/trace_$name"
    CUMUX_HOP_TRACE=$W/trace_$name "$KIT/cumux" serve --device "$DEVICE" --sharing shared \
        --policy "$policy" --config "$W/tenants.toml" --listen "unix:$W/$name.sock" \
        >"$W/server_$name.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 100); do [ -S "$W/$name.sock" ] && break; sleep 0.1; done
}
unserve() { kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; }
through() { # through NAME TENANT TRACE(0/1) program...
    local name=$1 tenant=$2 traced=$3
    shift 3
    if [ "$traced" = 1 ]; then
        CUMUX_HOP_TRACE=$W/trace_$name "$KIT/cumux" run --server "unix:$W/$name.sock" --tenant "$tenant" -- "$@"
    else
        "$KIT/cumux" run --server "unix:$W/$name.sock" --tenant "$tenant" -- "$@"
    fi
}
hops() { # hops NAME CALL
    python3 "$ROOT/bench/hop_trace.py" "$W/trace_$1" --call "$2" --top 12 --json "$OUT/hop-$1.json" \
        >>"$REPORT" 2>&1
    # The launch before it, up to the worker's cuLaunchKernel.
    python3 "$ROOT/bench/hop_path.py" "$W/trace_$1" >>"$REPORT" 2>&1
}

for run in $RUNS; do
    s0=$(steal)
    case $run in
        lc_native*)
            "$W/tb" latency "$I50" "$SECS" >"$W/$run.txt" 2>&1 ;;
        lc_hogs*)
            # Native, with three CPU-bound spinners beside it (as many as cumux's spinning threads).
            hogs=()
            for _ in 1 2 3; do timeout $((SECS + 3)) sh -c 'while :; do :; done' & hogs+=($!); done
            "$W/tb" latency "$I50" "$SECS" >"$W/$run.txt" 2>&1
            kill "${hogs[@]}" 2>/dev/null; wait "${hogs[@]}" 2>/dev/null ;;
        lc | lc[0-9] | lc_prio*)
            policy=fifo
            case $run in lc_prio*) policy=priority ;; esac
            serve "$run" "$policy"
            through "$run" lc 1 "$W/tb" latency "$I50" "$SECS" >"$W/$run.txt" 2>&1
            unserve ;;
        micro)
            "$W/mb" launch_sync ${MICRO_ITERS:-20000} >"$W/micro_native.txt" 2>&1
            serve micro fifo
            through micro bench 1 "$W/mb" launch_sync ${MICRO_ITERS:-20000} >"$W/$run.txt" 2>&1
            unserve
            say "micro native: launch_sync p50 $(metric "$W/micro_native.txt" launch_sync_p50_us) p99 $(metric "$W/micro_native.txt" launch_sync_p99_us)" ;;
        lc_batch*)
            policy=priority
            case $run in lc_batch_fifo*) policy=fifo ;; esac
            serve "$run" "$policy"
            through "$run" batch 0 "$W/tb" throughput "$I2000" "$SECS" >"$W/${run}_batch.txt" 2>&1 &
            b=$!
            through "$run" lc 1 "$W/tb" latency "$I50" "$SECS" >"$W/$run.txt" 2>&1
            wait $b
            unserve ;;
    esac
    s1=$(steal)
    if [ "$run" = micro ]; then
        say "== $run: launch_sync p50 $(metric "$W/$run.txt" launch_sync_p50_us) p99 $(metric "$W/$run.txt" launch_sync_p99_us) us; steal $((s1 - s0)) ticks"
        hops micro StreamSynchronize
    else
        say "== $run: p50 $(metric "$W/$run.txt" p50_us) p99 $(metric "$W/$run.txt" p99_us) us; steal $((s1 - s0)) ticks"
        [ -d "$W/trace_$run" ] && hops "$run" StreamSynchronize
    fi
    say ""
done
say "host: $(nproc) cpus; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
tar czf "$OUT/hop-runs.tgz" -C "$W" --exclude=tb --exclude=mb . 2>/dev/null
rm -rf "$W"
