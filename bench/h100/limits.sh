#!/usr/bin/env bash
# Context limits and the device memory behind them (bench/cuda/lmem_probe.cu).
# Natively: free memory at start, after a kernel with a 16 KiB stack a thread,
# after the stack is set back to its default, and after a 1 GiB malloc heap is
# used and set back. Then through `cumux serve --sharing shared`, with $KIT's
# cumux and, if given, $OLD_KIT's (a build whose shared context kept every
# limit a tenant ever asked for): the shared worker's GPU memory (nvidia-smi's
# compute apps) and the GPU's, after tenants that each leave one thing behind
# (`idle`, `stack`, `heap`, `heap-used`), one at a time, none left when it is
# read. Writes $OUT/limits.txt.
#
#   OUT=/some/dir bench/h100/limits.sh
# Optional: KIT=, OLD_KIT=, NVCC=.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OLD_KIT=${OLD_KIT:-}
OUT=${OUT:-/tmp/cumux-limits}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-limits.XXXXXX)
pids=()
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
trap stop_all EXIT
"$NVCC" -O2 -arch=sm_90 -o "$W/lmem_probe" "$ROOT/bench/cuda/lmem_probe.cu" || exit 1
REPORT=$OUT/limits.txt
: >"$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }

say "native ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)):"
"$W/lmem_probe" 2>&1 | tee -a "$REPORT"

# Process $1's GPU memory in MiB, as nvidia-smi's compute apps list it.
process_mib() {
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
        awk -F', *' -v p="$1" '$1 == p { print $2 }'
}
gpu_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }

kits=("$KIT")
[ -n "$OLD_KIT" ] && kits+=("$OLD_KIT")
for kit in "${kits[@]}"; do
    commit=$(head -1 "$kit/COMMIT" 2>/dev/null | tr -d '[:space:]')
    log=$W/server-${commit:-kit}.log
    rm -f "$W/s.sock"
    CUMUX_WORKER_SPARES=0 "$kit/cumux" serve --device cuda --sharing shared \
        --listen "unix:$W/s.sock" >"$log" 2>&1 &
    server=$!
    pids+=("$server")
    for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
    for mode in idle stack idle heap idle heap-used idle; do
        if ! "$kit/cumux" run --server "unix:$W/s.sock" -- "$W/lmem_probe" "$mode" >>"$W/runs.txt" 2>&1; then
            say "$commit: the $mode tenant failed: $(tail -2 "$W/runs.txt" | tr '\n' ' ')"
        fi
        sleep 2
        worker=$(pgrep -P "$server" -f worker | head -1)
        say "$commit shared, after a $mode tenant: worker ${worker:-?} GPU memory $(process_mib "${worker:-0}") MiB; GPU used $(gpu_mib) MiB"
    done
    kill "$server"
    wait "$server" 2>/dev/null
    grep -i "limit" "$log" | tail -5 | sed "s/^/$commit log: /" | tee -a "$REPORT"
done
