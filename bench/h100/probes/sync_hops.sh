#!/usr/bin/env bash
# Where a launch+sync and a synchronous pinned copy spend their time through
# KIT with marks on and off: bench/cuda/microbench.cu's launch_sync and
# bandwidth (pinned copies up to 64 KiB) through `cumux run` with the hop trace
# on in the server, its worker and the client, split by bench/hop_posted.py
# (unanswered calls and marks) and bench/hop_trace.py (waiting calls).
# Run from the repository root on the GPU machine:
#   KIT=device-kit/new OUT=$OUT bench/h100/probes/sync_hops.sh
# CALL= names the unanswered call to follow (default Launch; GraphLaunch).
# BENCH= picks another microbench subcommand and count (default
# "launch_sync 3000"; "graph_replay 2000" for a graph of 100 launches).
set -u
BENCH=${BENCH:-launch_sync 3000}
KIT=${KIT:-device-kit/main}
OUT=${OUT:-/tmp/sync-hops}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$OUT"
T=$(mktemp -d)
"$NVCC" -O2 -arch=sm_90 -o "$T/mb" bench/cuda/microbench.cu || exit 1
if [ -z "${CUMUX_REAL_LIBCUDA:-}" ]; then
    real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    [ -n "$real" ] && export CUMUX_REAL_LIBCUDA=$real
fi
echo "kit $KIT ($(cat "$KIT/COMMIT" 2>/dev/null))"
echo "== native"; "$T/mb" $BENCH | grep metric
for marks in on off; do
    tr=$T/tr-$marks
    CUMUX_HOP_TRACE=$tr "$KIT/cumux" serve --device cuda --listen "unix:$T/s.sock" >"$T/server-$marks.log" 2>&1 &
    sp=$!
    for _ in $(seq 100); do [ -S "$T/s.sock" ] && break; sleep 0.1; done
    echo "== marks $marks: $BENCH"
    CUMUX_MARKS=$marks CUMUX_HOP_TRACE=$tr "$KIT/cumux" run --server "unix:$T/s.sock" -- "$T/mb" $BENCH | grep metric
    python3 bench/hop_posted.py "$tr" --call "${CALL:-Launch}"
    [ "$marks" = on ] && python3 bench/hop_posted.py "$tr" --call Mark | tail -n +2
    [ "$marks" = off ] && python3 bench/hop_trace.py "$tr" --call StreamSynchronize --top 0
    kill "$sp"; wait "$sp" 2>/dev/null; rm -f "$T/s.sock"
done
rm -rf "$T"
