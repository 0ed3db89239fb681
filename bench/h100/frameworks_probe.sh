#!/usr/bin/env bash
# Frameworks that queue deep or read results from pinned memory, natively and
# through `cumux run` (isolated, fifo): JAX (bench/h100/jax_probe.py) and
# PyTorch launching matmuls for 3 s without synchronizing
# (pytorch_tenants.py work 1 3), with each side's time and matmul count.
# Writes $OUT/frameworks.txt; the JAX run's client errors go to
# $OUT/jax-errors.txt.
#
#   OUT=/some/dir bench/h100/frameworks_probe.sh
# Optional: KIT=, LIMIT= (seconds per run, default 150).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-frameworks}
LIMIT=${LIMIT:-150}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-frameworks.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
REPORT=$OUT/frameworks.txt
say() { echo "$*" | tee -a "$REPORT"; }

"$KIT/cumux" serve --device cuda --listen "unix:$W/s.sock" >"$W/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done

# side NAME CMD...: runs CMD natively or through cumux; one line of result.
side() {
    local name=$1 start=$SECONDS rc
    shift
    timeout "$LIMIT" "$@" >"$W/$name.log" 2>&1
    rc=$?
    say "$name: rc=$rc in $((SECONDS - start)) s: $(grep -E 'PASS|FAIL|Error' "$W/$name.log" | tail -1)"
}
JAX=(python3 "$ROOT/bench/h100/jax_probe.py")
WORK=(python3 "$ROOT/bench/h100/pytorch_tenants.py" work 1 3)
side jax-native "${JAX[@]}"
CUMUX_LOG=debug side jax-cumux "$KIT/cumux" run --server "unix:$W/s.sock" -- "${JAX[@]}"
grep -E -- '-> CUDA_ERROR|server: CUresult' "$W/jax-cumux.log" | grep -v -E 'cuGetExportTable|cuGetProcAddress|context_storage' | head -60 >"$OUT/jax-errors.txt"
side work-native "${WORK[@]}"
side work-cumux "$KIT/cumux" run --server "unix:$W/s.sock" -- "${WORK[@]}"
kill "$server"
wait "$server" 2>/dev/null
say done
