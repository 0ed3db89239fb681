#!/usr/bin/env bash
# Stock PyTorch on the GPU machine, natively and through `cumux run`: runs the
# steps of bench/h100/pytorch_suite.py in a few processes per side (checks,
# torch.compile, benchmarks), compares each check within its tolerance and
# each benchmark as a ratio, and writes $OUT/pytorch-suite.txt (a table) and
# $OUT/DATE-GPU-pytorch.json (the benchmarks, in the shape of
# bench/README.md). Needs device-kit/ (prebuilt cumux and
# libcumux_client.so); every process has a timeout and a failure never stops
# the run.
#
#   OUT=/some/dir bench/h100/pytorch_suite.sh
# Optional: KIT=, GROUPS_OVERRIDE="steps;steps" (process groups, ';'-separated),
# GROUP_TIMEOUT= (seconds per process, default 240), GPU_SLUG= (default h100),
# BENCH_ROUNDS= (default 3: the benchmarks run in this many alternating
# native/cumux rounds, each in fresh processes; the median counts),
# CUMUX_REAL_LIBCUDA= (default: the libcuda.so.1 ldconfig knows),
# SERVE_ARGS= (more `cumux serve` arguments, e.g. "--sharing shared"),
# SUITE= and SUITE_NAME= (another suite in the same line protocol and its
# name in the files written: bench/h100/framework_suite.sh sets them).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-pytorch-suite}
GROUP_TIMEOUT=${GROUP_TIMEOUT:-240}
GPU_SLUG=${GPU_SLUG:-h100}
SUITE=${SUITE:-$ROOT/bench/h100/pytorch_suite.py}
SUITE_NAME=${SUITE_NAME:-pytorch}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/cumux-pts.XXXXXX)
SOCK=$WORK/s.sock
if [ -z "${CUMUX_REAL_LIBCUDA:-}" ]; then
    real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    [ -n "$real" ] && export CUMUX_REAL_LIBCUDA=$real
fi
# shellcheck disable=SC2086 # SERVE_ARGS are words
"$KIT/cumux" serve --device cuda ${SERVE_ARGS:-} --listen "unix:$SOCK" >"$OUT/suite_server.log" 2>&1 &
server=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done

CHECKS="props tensor matmul_fp32 matmul_bf16 autocast_bf16 conv conv_notf32 cnn_train gpt_train_fp32 gpt_train_bf16 graph allocator_pressure"
BENCHES="gpt_step_fp32_ms gpt_step_bf16_ms resnet18_infer_b32_ms tiny_kernels_200_ms"
BENCH_ROUNDS=${BENCH_ROUNDS:-3}
default_groups="$CHECKS;compile"
for _ in $(seq "$BENCH_ROUNDS"); do default_groups="$default_groups;$BENCHES"; done
GROUPS_SPEC=${GROUPS_OVERRIDE:-$default_groups}

IFS=';' read -ra groups <<<"$GROUPS_SPEC"
n=0
for group in "${groups[@]}"; do
    n=$((n + 1))
    for side in native cumux; do
        log=$OUT/group${n}_$side
        t0=$(date +%s)
        if [ $side = native ]; then
            timeout "$GROUP_TIMEOUT" python3 "$SUITE" $group >"$log.out" 2>"$log.err"
        else
            timeout "$GROUP_TIMEOUT" "$KIT/cumux" run --server "unix:$SOCK" -- \
                python3 "$SUITE" $group >"$log.out" 2>"$log.err"
        fi
        echo "rc=$? seconds=$(($(date +%s) - t0))" >"$log.rc"
    done
done
kill $server 2>/dev/null

python3 - "$OUT" "$n" "$GPU_SLUG" "$(cat "$KIT/COMMIT" 2>/dev/null | head -1)" "$SUITE_NAME" "${SERVE_ARGS:-}" <<'PY'
import datetime, glob, json, math, os, subprocess, sys
out, groups, slug, commit, name, serve_args = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]

def parse(path):
    found = {}
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return found
    for line in lines:
        kind, _, rest = line.partition(" ")
        step, _, payload = rest.partition(" ")
        if kind == "result":
            try:
                found[step] = ("ok", json.loads(payload))
            except ValueError:
                found[step] = ("error", "unparsable result")
        elif kind == "error":
            found[step] = ("error", payload)
    return found

def tail(path):
    try:
        lines = [l for l in open(path, errors="replace").read().splitlines() if l.strip()]
        return lines[-1][:120] if lines else ""
    except OSError:
        return ""

rows, metrics, passed, total = [], [], 0, 0
bench_ms = {}  # step -> {"native": [...], "cumux": [...]}, over rounds
for g in range(1, groups + 1):
    sides = {s: parse(f"{out}/group{g}_{s}.out") for s in ("native", "cumux")}
    info = {s: open(f"{out}/group{g}_{s}.rc").read().strip() for s in ("native", "cumux")}
    steps = list(dict.fromkeys([*sides["native"], *sides["cumux"]]))
    if not steps:
        rows.append((f"group {g}", "NO OUTPUT", f"native {info['native']}: {tail(f'{out}/group{g}_native.err')} | cumux {info['cumux']}: {tail(f'{out}/group{g}_cumux.err')}"))
        continue
    for step in steps:
        n = sides["native"].get(step)
        c = sides["cumux"].get(step)
        if c is None:
            c = ("error", f"not run ({info['cumux']}: {tail(f'{out}/group{g}_cumux.err')})")
        if n is None:
            n = ("error", f"not run ({info['native']})")
        if n[0] != "ok" or c[0] != "ok":
            total += 1
            rows.append((step, "FAIL", f"native: {n[1] if n[0] != 'ok' else 'ok'} | cumux: {c[1] if c[0] != 'ok' else 'ok'}"))
            continue
        if "values" in n[1]:
            total += 1
            a, b = n[1]["values"], c[1]["values"]
            rtol, atol = n[1]["rtol"], n[1]["atol"]
            same = len(a) == len(b) and all(abs(x - y) <= atol + rtol * abs(x) for x, y in zip(a, b))
            passed += same
            worst = max((abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b)), default=0.0)
            rows.append((step, "PASS" if same else "FAIL", f"{len(a)} values, worst rel diff {worst:.2e} (rtol {rtol})"))
        else:
            b = bench_ms.setdefault(step, {"native": [], "cumux": []})
            b["native"].append(n[1]["ms"])
            b["cumux"].append(c[1]["ms"])

def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

for step, b in bench_ms.items():
    nm, cm = median(b["native"]), median(b["cumux"])
    ratio = cm / nm
    metrics.append({"name": step, "unit": "ms", "better": "lower", "native": round(nm, 4),
                    "cumux": round(cm, 4), "ratio": round(ratio, 4), "rounds": len(b["native"]),
                    "native_rounds": [round(x, 3) for x in b["native"]],
                    "cumux_rounds": [round(x, 3) for x in b["cumux"]]})
    rows.append((step, "BENCH", f"median of {len(b['native'])}: native {nm:.3f} ms, cumux {cm:.3f} ms, ratio {ratio:.3f}"
                 f" (native {', '.join(f'{x:.2f}' for x in b['native'])}; cumux {', '.join(f'{x:.2f}' for x in b['cumux'])})"))

def smi(q):
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception:
        return "unknown"
try:
    import torch
    cuda, torch_version = torch.version.cuda, torch.__version__
except ImportError:
    cuda, torch_version = "unknown", "unknown"
date = datetime.date.today().isoformat()
result = {"suite": name, "serve_args": serve_args, "date": date, "gpu": smi("name"), "driver": smi("driver_version"),
          "cuda": cuda, "torch": torch_version, "commit": commit, "metrics": metrics,
          "checks": {"passed": passed, "total": total}}
with open(f"{out}/{date}-{slug}-{name}.json", "w") as f:
    json.dump(result, f, indent=1)
with open(f"{out}/{name}-suite.txt", "w") as f:
    f.write(f"{name} suite{' (' + serve_args + ')' if serve_args else ''}, {date}, {result['gpu']}, driver {result['driver']}, torch {torch_version}, kit {commit}\n")
    for r in rows:
        f.write(f"{r[0]:<24} {r[1]:<6} {r[2]}\n")
    f.write(f"checks matching native: {passed}/{total}\n")
print(open(f"{out}/{name}-suite.txt").read())
PY
