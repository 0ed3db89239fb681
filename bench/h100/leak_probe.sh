#!/usr/bin/env bash
# Where a shared context's GPU memory goes (issue 15's soak found the GPU's
# used memory growing through a soak under `--sharing shared`): one server,
# then rounds of sessions run one after another - PyTorch (`pytorch_tenants.py
# work`), the CUDA corpus programs, and PyTorch killed mid-run - and after each
# round, with no session left, the GPU memory each process holds
# (nvidia-smi's compute apps) and what cumux counts as used. A leak shows as
# a process's memory growing round after round while cumux counts 0.
#
#   OUT=/some/dir KIT=device-kit/main bench/h100/leak_probe.sh
# Optional: ROUNDS= (default 4), RUNS= (sessions a round, default 10), KINDS=
# (default "pytorch cuda killed"),
# SERVE_ARGS= (default "--sharing shared"), NVCC=.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-leak}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
ROUNDS=${ROUNDS:-4}
RUNS=${RUNS:-10}
SERVE_ARGS=${SERVE_ARGS---sharing shared}
KINDS=${KINDS:-pytorch cuda killed}
mkdir -p "$OUT"
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
W=$(mktemp -d /tmp/cumux-leak.XXXXXX)
pids=()
trap stop_all EXIT
SOCK=$W/s.sock
REPORT=$OUT/leak-probe.txt
for p in vector_add matmul_tiled reduce_shfl; do
    "$NVCC" -I"$ROOT/tests/cuda/corpus" -o "$W/$p" "$ROOT/tests/cuda/corpus/$p.cu" || exit 1
done
# shellcheck disable=SC2086
"$KIT/cumux" serve --device cuda $SERVE_ARGS --listen "unix:$SOCK" >"$W/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do [ -S "$SOCK" ] && break; sleep 0.1; done
used() { "$KIT/cumux" status --json --server "unix:$SOCK" | python3 -c 'import json,sys; print(json.load(sys.stdin)["devices"][0]["used_mem"])'; }
apps() { nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | tr '\n' ';'; }
run() { timeout 120 "$KIT/cumux" run --server "unix:$SOCK" --tenant probe -- "$@" >>"$W/runs.log" 2>&1; }
{
    echo "leak probe, $(date -u +%FT%TZ), kit $(cat "$KIT/COMMIT" 2>/dev/null), serve $SERVE_ARGS, $RUNS sessions a round"
    nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
    echo "before any session: apps [$(apps)]"
} | tee "$REPORT"
for kind in $KINDS; do
    for r in $(seq "$ROUNDS"); do
        fails=0
        for _ in $(seq "$RUNS"); do
            case $kind in
                pytorch) run python3 "$ROOT/bench/h100/pytorch_tenants.py" work 0.5 1 || fails=$((fails + 1)) ;;
                cuda) for p in vector_add matmul_tiled reduce_shfl; do run "$W/$p" || fails=$((fails + 1)); done ;;
                killed)
                    run python3 "$ROOT/bench/h100/pytorch_tenants.py" work 0.5 5 &
                    sleep 3
                    pkill -9 -f "^python3 $ROOT/bench/h100/pytorch_tenants.py"
                    wait
                    ;;
            esac
        done
        sleep 1
        echo "$kind round $r: failed $fails; cumux used $(used) B; apps [$(apps)]; GPU used $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)" | tee -a "$REPORT"
    done
done
grep -c -E "ERROR|panicked" "$W/server.log" | sed 's/^/server log ERROR or panic lines: /' | tee -a "$REPORT"
