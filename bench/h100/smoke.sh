#!/usr/bin/env bash
# Smoke test of cumux's cuda backend on a GPU machine (the H100 box): starts
# `cumux serve --device cuda`, builds every tests/cuda/corpus program and the
# plain tests/cuda/driver ones with nvcc, runs each natively and through
# `cumux run`, and writes PASS/FAIL per program and way to $OUT/smoke.txt, the
# server's log to $OUT/server.log.
#
# Needs prebuilt binaries in device-kit/ (cumux and libcumux_client.so from
# `cargo build --release`; cumux-cuda-probe too, if present, checks the driver
# layer alone first); needs no Rust and no network. Every step has a
# timeout and a failure never stops the run.
#
#   OUT=/some/dir bench/h100/smoke.sh
# Optional: KIT=, NVCC=, NVCC_FLAGS= (extra nvcc arguments), DEVICE= (default
# cuda; cpu for a dry run without a GPU), PROGRAMS="vector_add saxpy" (a
# subset of corpus and driver programs), SERVE_ARGS= (more `cumux serve`
# arguments, e.g. "--sharing shared"), CUMUX_REAL_LIBCUDA= (default: the
# libcuda.so.1 ldconfig knows).
set -u

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-smoke}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
NVCC_FLAGS=${NVCC_FLAGS:-}
DEVICE=${DEVICE:-cuda}
PROGRAMS=${PROGRAMS:-}
CORPUS=$ROOT/tests/cuda/corpus
WORK=$(mktemp -d /tmp/cumux-smoke.XXXXXX)
SOCK=$WORK/cumux.sock
SERVER=unix:$SOCK
mkdir -p "$OUT/outputs" "$WORK/bin"
SUMMARY=$OUT/smoke.txt
LOG=$OUT/server.log
: >"$SUMMARY"

say() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# The server must load NVIDIA's driver, never cumux's: name it by path.
if [ -z "${CUMUX_REAL_LIBCUDA:-}" ]; then
    real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    if [ -n "$real" ]; then export CUMUX_REAL_LIBCUDA=$real; fi
fi

say "cumux smoke test, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "nvcc: $("$NVCC" --version 2>/dev/null | tail -1)"
say "kit: $KIT ($(cat "$KIT/COMMIT" 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown))"
say "real libcuda: ${CUMUX_REAL_LIBCUDA:-libcuda.so.1 by soname}"

for f in cumux libcumux_client.so; do
    if [ ! -e "$KIT/$f" ]; then say "FATAL: $KIT/$f is missing"; exit 1; fi
done

# --- the driver layer alone (if the kit has cumux-cuda-probe) ---------------
if [ -x "$KIT/cumux-cuda-probe" ] && [ "$DEVICE" = cuda ]; then
    if timeout 180 "$KIT/cumux-cuda-probe" >"$OUT/probe.txt" 2>&1; then
        say "probe: PASS (see probe.txt)"
    else
        say "probe: FAIL (see probe.txt)"
    fi
    sed 's/^/    /' "$OUT/probe.txt" | tee -a "$SUMMARY"
fi

# --- server ---------------------------------------------------------------
# shellcheck disable=SC2086 # a list of arguments
"$KIT/cumux" serve --device "$DEVICE" --listen "$SERVER" ${SERVE_ARGS:-} >"$LOG" 2>&1 &
SERVER_PID=$!
stop_server() {
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$SERVER_PID" 2>/dev/null
    fi
}
trap stop_server EXIT
up=0
for _ in $(seq 600); do
    if [ -S "$SOCK" ] && timeout 10 "$KIT/cumux" status --server "$SERVER" >/dev/null 2>&1; then up=1; break; fi
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
done
if [ "$up" != 1 ]; then
    say "FATAL: cumux serve --device $DEVICE did not come up: $(tail -1 "$LOG")"
    exit 1
fi
say "server: up ($(head -1 "$LOG" | cut -c1-200))"
say ""

# --- build ----------------------------------------------------------------
programs=()
for src in "$CORPUS"/*.cu; do
    name=$(basename "$src" .cu)
    if [ -n "$PROGRAMS" ] && ! printf ' %s ' $PROGRAMS | grep -qF " $name "; then continue; fi
    # shellcheck disable=SC2086 # NVCC_FLAGS is a list of words
    if timeout 300 "$NVCC" $NVCC_FLAGS -o "$WORK/bin/$name" "$src" >"$OUT/outputs/$name.build.txt" 2>&1; then
        programs+=("$name")
    else
        say "$(printf '%-30s BUILD FAIL (see outputs/%s.build.txt)' "$name" "$name")"
    fi
done

# Driver-level programs of tests/cuda/driver: name;source;extra nvcc flags;args.
DRIVER_DIR=$ROOT/tests/cuda/driver
driver_programs=(
    "device_query;device_query.cu;;"
    "streams_events;streams_events.cu;;"
    "streams_events_ptds;streams_events.cu;--default-stream per-thread;"
    "memcpy_to_symbol;memcpy_to_symbol.cu;;"
    "pinned_memory;pinned_memory.cu;;"
    "host_callback;host_callback.cu;;"
    "cluster_launch;cluster_launch.cu;-arch=sm_90;"
    "cluster_occupancy;cluster_occupancy.cu;-arch=sm_90;"
    "driver_api;driver_api.cu;-lcuda;$ROOT/crates/fatbin/tests/fixtures/zstd.fatbin"
    "rdc_program;rdc_program.cu;-rdc=true $DRIVER_DIR/rdc_helper.cu;"
    "launch_window;launch_window.cu;;"
    "uva_pinned;uva_pinned.cu;-lcuda;"
    "zero_copy_kernel;zero_copy_kernel.cu;;"
    "graph_nodes;graph_nodes.cu;;"
    "graph_update;graph_update.cu;;"
    "graph_memory;graph_memory.cu;;"
    "graph_api;graph_api.cu;;"
    "vmm;vmm.cu;-lcuda;"
    "private_tables;private_tables.cu;-lcuda;"
    "stack_limit;stack_limit.cu;;"
    "textures;textures.cu;;"
    "managed_memory;managed_memory.cu;;"
    "managed_concurrent;managed_concurrent.cu;;"
    "mem_pools;mem_pools.cu;;"
    "pool_ipc;pool_ipc.cu;;"
    "ipc_programs;ipc_programs.cu;;"
    "device_launch;device_launch.cu;-rdc=true -lcudadevrt;"
    "graph_conditional;graph_conditional.cu;;"
    "ptx_choice;ptx_choice.cu;-gencode arch=compute_75,code=compute_75 -gencode arch=compute_80,code=compute_80 -gencode arch=compute_90,code=compute_90;"
    "shared_wrap;shared_wrap.cu;;"
    "indirect_recursion;indirect_recursion.cu;;"
    "grid_sync_full;grid_sync_full.cu;;"
    "device_heap;device_heap.cu;;"
    "assert_code;assert_code.cu;;"
    "async_copies;async_copies.cu;-arch=sm_80;"
    "printf_fifo;printf_fifo.cu;-lcuda;"
    # tests/cuda/parity (issue 22), not yet run on a GPU before
    "parity_device_assert;../parity/device_assert.cu;;"
    "parity_limits;../parity/limits.cu;;"
    "parity_cp_async;../parity/cp_async.cu;-arch=sm_80;"
    "parity_multi_arch;../parity/multi_arch.cu;-gencode arch=compute_75,code=compute_75 -gencode arch=compute_90,code=compute_90;"
    "parity_jit_log;../parity/jit_log.cu;-lcuda;"
    "parity_shared_window;../parity/shared_window.cu;;"
    "parity_grid_sync;../parity/grid_sync.cu;;"
    "parity_device_malloc;../parity/device_malloc.cu;;"
    "parity_indirect_calls;../parity/indirect_calls.cu;;"
)
declare -A program_args
if [ -z "$PROGRAMS" ] || [ "${DRIVER_PROGRAMS:-1}" = 1 ]; then
    for entry in "${driver_programs[@]}"; do
        IFS=';' read -r name src flags args <<<"$entry"
        if [ -n "$PROGRAMS" ] && ! printf ' %s ' $PROGRAMS | grep -qF " $name "; then continue; fi
        [ -e "$DRIVER_DIR/$src" ] || continue
        # shellcheck disable=SC2086 # flag lists are words
        if timeout 300 "$NVCC" $NVCC_FLAGS $flags -o "$WORK/bin/$name" "$DRIVER_DIR/$src" >"$OUT/outputs/$name.build.txt" 2>&1; then
            programs+=("$name")
            program_args[$name]=$args
        else
            say "$(printf '%-30s BUILD FAIL (see outputs/%s.build.txt)' "$name" "$name")"
        fi
    done
fi

# --- run: natively, then through cumux --------------------------------------
pass_native=0; pass_cumux=0; total=0
printf '%-30s %-14s %-14s\n' program native cumux | tee -a "$SUMMARY"
for name in "${programs[@]}"; do
    bin=$WORK/bin/$name
    # shellcheck disable=SC2206 # arguments are words
    args=(${program_args[$name]:-})
    t0=$(now)
    timeout 60 "$bin" "${args[@]}" >"$OUT/outputs/$name.native.txt" 2>&1
    native_rc=$?
    t1=$(now)
    timeout 60 "$KIT/cumux" run --server "$SERVER" --tenant smoke -- "$bin" "${args[@]}" \
        >"$OUT/outputs/$name.cumux.txt" 2>"$OUT/outputs/$name.cumux.err"
    cumux_rc=$?
    t2=$(now)
    native=FAIL; [ "$native_rc" = 0 ] && native=PASS && pass_native=$((pass_native + 1))
    cumux=FAIL; [ "$cumux_rc" = 0 ] && cumux=PASS && pass_cumux=$((pass_cumux + 1))
    total=$((total + 1))
    line=$(printf '%-30s %-4s %6ss    %-4s %6ss' "$name" "$native" "$(secs "$t0" "$t1")" "$cumux" "$(secs "$t1" "$t2")")
    if [ "$native" = FAIL ]; then
        why=$(grep -v '^$' "$OUT/outputs/$name.native.txt" 2>/dev/null | tail -1 | cut -c1-120)
        line="$line   native rc=$native_rc ${why}"
    fi
    if [ "$cumux" = FAIL ]; then
        why=$(tail -n 2 "$OUT/outputs/$name.cumux.err" "$OUT/outputs/$name.cumux.txt" 2>/dev/null | grep -v '^==>' | grep -v '^$' | tail -1 | cut -c1-160)
        line="$line   cumux rc=$cumux_rc ${why}"
    fi
    say "$line"
done
say ""
say "native: $pass_native/$total PASS; cumux: $pass_cumux/$total PASS"

# --- device printf reaches the program, not the server ----------------------
if [ -e "$OUT/outputs/printf_kernel.cumux.txt" ]; then
    want0='block 0: int=7 float=1.250 str=first char=A big=1099511627776'
    want1='block 1: int=17 float=2.500 str=second char=B big=2199023255552'
    out=$OUT/outputs/printf_kernel.cumux.txt
    if grep -qF "$want0" "$out" && grep -qF "$want1" "$out" && ! grep -qF 'block 0: int=7' "$LOG"; then
        say "printf routing: PASS (in the program's stdout, not the server's)"
    else
        say "printf routing: FAIL (program stdout has block 0: $(grep -cF "$want0" "$out"), block 1: $(grep -cF "$want1" "$out"); server log has $(grep -cF 'block 0: int=7' "$LOG"))"
    fi
fi

# --- four tenants at once ---------------------------------------------------
together=()
for name in vector_add saxpy matmul_tiled reduce_shfl; do
    [ -x "$WORK/bin/$name" ] && together+=("$name")
done
if [ "${#together[@]}" -gt 0 ]; then
    pids=()
    for name in "${together[@]}"; do
        timeout 120 "$KIT/cumux" run --server "$SERVER" --tenant "t-$name" -- "$WORK/bin/$name" \
            >"$OUT/outputs/$name.concurrent.txt" 2>&1 &
        pids+=($!)
    done
    ok=0
    for pid in "${pids[@]}"; do wait "$pid" && ok=$((ok + 1)); done
    r=FAIL; [ "$ok" = "${#together[@]}" ] && r=PASS
    say "concurrent tenants: $r ($ok/${#together[@]}: ${together[*]})"
fi

# --- the server outlives a faulting tenant ----------------------------------
if [ -x "$WORK/bin/vector_add" ]; then
    if timeout 60 "$KIT/cumux" run --server "$SERVER" -- "$WORK/bin/vector_add" >"$OUT/outputs/after_all.txt" 2>&1; then
        say "server still serves after every program (incl. out_of_bounds): PASS"
    else
        say "server still serves after every program (incl. out_of_bounds): FAIL"
    fi
fi

timeout 10 "$KIT/cumux" status --server "$SERVER" --json >"$OUT/status.json" 2>&1
kill -0 "$SERVER_PID" 2>/dev/null && say "server alive at the end: yes" || say "server alive at the end: NO"
stop_server
rm -rf "$WORK"
exit 0
