#!/usr/bin/env bash
# Issue 23's library probe on one GPU: NVIDIA's math libraries (cuFFT,
# cuSOLVER, cuSPARSE, cuRAND, cuBLAS from PyTorch and CuPy: libs_probe.py),
# JAX (jax_probe.py) and PyTorch with expandable segments, natively and
# through `cumux run` (isolated), plus a native run of each under the logging
# libcuda.so.1 of probes/export_log.sh, which records every private
# export-table slot the libraries call, with arguments and answers.
#
#   OUT=/some/dir KIT=device-kit/main bench/h100/libs_probe.sh
# Optional: LIMIT= (seconds per run, default 180), ONLY= (names of the runs to
# do, default "libs jax expandable").
# Writes $OUT/libs.txt (one line per run and check) and $OUT/libs-runs.tgz:
# NAME-SIDE.log, export-NAME.txt (the native logging runs) and $OUT/cumux-NAME.errors
# (calls that failed through cumux, and tables it refused).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-libs}
LIMIT=${LIMIT:-180}
ONLY=${ONLY:-libs jax expandable}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-libs.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
REPORT=$OUT/libs.txt
say() { echo "$*" | tee -a "$REPORT"; }
describe_machine | tee -a "$REPORT"
say "kit: $(cat "$KIT/COMMIT" 2>/dev/null || echo unknown)"

"$ROOT/bench/h100/probes/export_log.sh" "$W/shim" >>"$REPORT" 2>&1 || say "export_log: build failed"
"$KIT/cumux" serve --device cuda --listen "unix:$W/s.sock" >"$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done

cat >"$W/expandable.py" <<'PY'
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 512, device="cuda"); y = torch.randint(0, 10, (256,), device="cuda")
for step in range(30):
    big = torch.empty(int(64e6) * (1 + step % 3), dtype=torch.uint8, device="cuda"); del big
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
print("loss %.6f" % loss.item())
print("reserved", torch.cuda.memory_reserved())
print("expandable: PASS")
PY

# run NAME SIDE CMD...: SIDE is native, logged or cumux; the output's PASS/FAIL
# lines go to the report.
run() {
    local name=$1 side=$2 start=$SECONDS rc
    shift 2
    case $side in
    native) timeout "$LIMIT" "$@" >"$OUT/$name-$side.log" 2>&1 ;;
    logged) REAL_LIBCUDA=$(cat "$W/shim/real") EXPORT_LOG="$OUT/export-$name.txt" \
        LD_LIBRARY_PATH="$W/shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        timeout "$LIMIT" "$@" >"$OUT/$name-$side.log" 2>&1 ;;
    cumux) CUMUX_LOG=debug timeout "$LIMIT" "$KIT/cumux" run --server "unix:$W/s.sock" -- "$@" \
        >"$OUT/$name-$side.log" 2>&1 ;;
    esac
    rc=$?
    say "== $name $side: rc=$rc in $((SECONDS - start)) s"
    grep -E '^check |PASS|FAIL|^loss|final loss|jit product|grad norm' "$OUT/$name-$side.log" | head -40 | sed 's/^/   /' | tee -a "$REPORT" >/dev/null
    if [ "$side" = cumux ]; then
        grep -E -- '-> CUDA_ERROR|server: CUresult|unknown table|not implemented|NOT_SUPPORTED|not supported|panick' \
            "$OUT/$name-$side.log" | grep -v -E 'cuGetProcAddress|context_storage|CUresult 600' |
            sed -E 's/^[0-9TZ:.-]+ +//' | sort | uniq -c | sort -rn | head -80 >"$OUT/cumux-$name.errors"
        say "   errors: $(wc -l <"$OUT/cumux-$name.errors") distinct lines"
    fi
}
for what in $ONLY; do
    case $what in
    libs) CMD=(python3 "$ROOT/bench/h100/libs_probe.py" all) ;;
    jax) CMD=(python3 "$ROOT/bench/h100/jax_probe.py") ;;
    expandable) CMD=(env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 "$W/expandable.py") ;;
    *) say "unknown run $what"; continue ;;
    esac
    run "$what" native "${CMD[@]}"
    run "$what" logged "${CMD[@]}"
    run "$what" cumux "${CMD[@]}"
done
kill "$server" 2>/dev/null
wait "$server" 2>/dev/null
say done
# At most 8 files come back from the device machine: the report, and the rest in one archive.
(cd "$OUT" && tar czf libs-runs.tgz --remove-files --exclude libs.txt --exclude libs-runs.tgz -- *)
