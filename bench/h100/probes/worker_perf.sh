#!/usr/bin/env bash
# Where a worker's time goes per launch: runs bench/cuda/microbench.cu's
# launch_rate through KIT and samples the worker process with `perf record`
# (if the machine has perf), printing the top symbols. Run from the
# repository root on the GPU machine:
#   KIT=device-kit/new OUT=$OUT bench/h100/probes/worker_perf.sh
set -u
KIT=${KIT:-device-kit/main}
OUT=${OUT:-/tmp/worker-perf}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$OUT"
PERF=$(command -v perf || ls /usr/lib/linux-tools/*/perf 2>/dev/null | head -1)
echo "perf: ${PERF:-none}"
T=$(mktemp -d)
"$NVCC" -O2 -arch=sm_90 -o "$T/mb" bench/cuda/microbench.cu || exit 1
if [ -z "${CUMUX_REAL_LIBCUDA:-}" ]; then
    real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    [ -n "$real" ] && export CUMUX_REAL_LIBCUDA=$real
fi
"$KIT/cumux" serve --device cuda --listen "unix:$T/s.sock" >"$T/server.log" 2>&1 &
sp=$!
for _ in $(seq 100); do [ -S "$T/s.sock" ] && break; sleep 0.1; done
"$KIT/cumux" run --server "unix:$T/s.sock" -- "$T/mb" launch_rate 2000000 >"$T/rate.txt" 2>&1 &
rp=$!
sleep 1.5
pgrep -af "cumux" | head
worker=$(pgrep -f "cumux worker" | head -1)
echo "worker pid: ${worker:-none}, server pid $sp"
if [ -n "$PERF" ] && [ -n "$worker" ]; then
    "$PERF" record -F 4999 -g -p "$worker" -o "$T/worker.data" -- sleep 2 >/dev/null 2>&1
    "$PERF" report -i "$T/worker.data" --no-children --percent-limit 0.7 --stdio 2>/dev/null | grep -v "^$" | head -120
    "$PERF" record -F 4999 -g -p "$sp" -o "$T/server.data" -- sleep 2 >/dev/null 2>&1
    echo "== server"
    "$PERF" report -i "$T/server.data" --no-children --percent-limit 1.5 --stdio 2>/dev/null | grep -v "^$" | grep -v "^ *|" | head -60
fi
wait "$rp"; cat "$T/rate.txt" | grep metric
kill "$sp"; wait "$sp" 2>/dev/null
rm -rf "$T"
