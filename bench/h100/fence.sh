#!/usr/bin/env bash
# Fencing's overhead (`--sharing fenced`) (docs/mechanisms.md, "Fencing"): every
# tests/cuda/corpus program and fence_kernels.cu (memory-bound kernels timed
# with events), built with PTX, run natively, through `cumux serve --device
# cuda --sharing fenced` as a trusted tenant (unfenced) and as an untrusted
# one (fenced: its PTX rewritten, its memory in a partition). Figures: each
# program's wall time (median of ROUNDS; the first fenced run pays the JIT of
# the fenced PTX, which the driver's cache keeps after) and each kernel's
# time per launch; ratios ÷ native and their geomeans. Writes
# $OUT/DATE-GPU-fence.json and $OUT/fence.txt (the raw runs).
#
#   OUT=/some/dir bench/h100/fence.sh
# Optional: KIT= (cumux binaries, default ./device-kit), NVCC=, ROUNDS= (default 5).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-fence}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
ROUNDS=${ROUNDS:-5}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-fence.XXXXXX)
pids=()
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
trap stop_all EXIT
describe_machine
GENCODE=(-gencode "arch=compute_90,code=sm_90" -gencode "arch=compute_90,code=compute_90")
progs=()
for src in "$ROOT"/tests/cuda/corpus/*.cu; do
    name=$(basename "$src" .cu)
    if "$NVCC" -O2 "${GENCODE[@]}" -I "$ROOT/tests/cuda/corpus" -o "$W/$name" "$src" 2>"$W/$name.nvcc"; then
        progs+=("$name")
    else
        echo "skipped $name (nvcc failed)" >&2
    fi
done
"$NVCC" -O2 "${GENCODE[@]}" -o "$W/fence_kernels" "$ROOT/bench/h100/fence_kernels.cu" || exit 1
printf 'allow_unknown = true\n[tenants.fast]\ntrusted = true\n[tenants.fenced]\n' >"$W/cfg.toml"
"$KIT/cumux" serve --device cuda --sharing fenced --config "$W/cfg.toml" \
    --listen "unix:$W/s.sock" >"$W/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
RAW=$OUT/fence.txt
: >"$RAW"
# Isolation first (tests/cuda/tenants/fence_probe.cu): a fenced tenant's kernel
# aimed at another tenant's buffer must see none of it and leave it intact; a
# cubin-only build must be refused with a log line naming the tenant.
"$NVCC" -O2 "${GENCODE[@]}" -o "$W/fence_probe" "$ROOT/tests/cuda/tenants/fence_probe.cu" || exit 1
"$NVCC" -O2 -gencode arch=compute_90,code=sm_90 -o "$W/fence_probe_cubin" "$ROOT/tests/cuda/tenants/fence_probe.cu" || exit 1
# probe TENANT LABEL: an owner holds a secret, TENANT's program pokes it.
probe() {
    "$KIT/cumux" run --server "unix:$W/s.sock" --tenant owner -- "$W/fence_probe" own 10 >"$W/owner.txt" 2>&1 &
    local owner=$!
    for _ in $(seq 300); do grep -q holding "$W/owner.txt" 2>/dev/null && break; sleep 0.1; done
    local ptr
    ptr=$(awk '/^ptr / { print $2 }' "$W/owner.txt")
    "$KIT/cumux" run --server "unix:$W/s.sock" --tenant "$1" -- "$W/fence_probe" poke "$ptr" >"$W/poke.txt" 2>&1
    wait "$owner"
    { echo "== $2"; cat "$W/poke.txt"; cat "$W/owner.txt"; } >>"$RAW"
}
probe fenced "fenced poke (expect kernel: cudaSuccess, secret: not seen, own: PASS)"
probe fast "trusted poke, unfenced (expect secret: seen and the owner's secret changed)"
"$KIT/cumux" run --server "unix:$W/s.sock" --tenant fenced -- "$W/fence_probe_cubin" poke 0x1000 >"$W/cubin.txt" 2>&1
{
    echo "== cubin-only module as a fenced tenant (expect an error, and a refusal in the log)"; cat "$W/cubin.txt"
    grep 'refused a module' "$W/server.log" | tail -3
} >>"$RAW"
# run MODE PROGRAM ARGS…: one run, its wall seconds on stdout, its output in $W/last.
run() {
    local mode=$1; shift
    local t0 t1
    t0=$(date +%s.%N)
    case $mode in
        native) "$@" >"$W/last" 2>&1 ;;
        unfenced) "$KIT/cumux" run --server "unix:$W/s.sock" --tenant fast -- "$@" >"$W/last" 2>&1 ;;
        fenced) "$KIT/cumux" run --server "unix:$W/s.sock" --tenant fenced -- "$@" >"$W/last" 2>&1 ;;
    esac
    local rc=$?
    t1=$(date +%s.%N)
    echo "$mode $* rc=$rc $(awk "BEGIN { print $t1 - $t0 }")" >>"$RAW"
    [ $rc -eq 0 ] || { echo "FAILED: $mode $*" >>"$RAW"; sed 's/^/    /' "$W/last" >>"$RAW"; }
    awk "BEGIN { print $t1 - $t0 }"
}
for name in "${progs[@]}"; do
    for mode in native unfenced fenced; do
        for _ in $(seq "$ROUNDS"); do
            echo "wall $name $mode $(run "$mode" "$W/$name")" >>"$W/figures"
        done
    done
done
for mode in native unfenced fenced; do
    for _ in $(seq "$ROUNDS"); do
        run "$mode" "$W/fence_kernels" >/dev/null
        grep ' ms ' "$W/last" | awk -v m="$mode" '{ print "kernel", $1, m, $3 }' >>"$W/figures"
        grep -q 'check OK' "$W/last" || echo "fence_kernels $mode: check failed" >>"$RAW"
    done
done
grep -E 'refused|fenc' "$W/server.log" | head -50 >>"$RAW"
python3 - "$W/figures" "$OUT" <<PY
import json, math, statistics, sys
sys.path.insert(0, "$ROOT/bench/h100")
import results_json
rows = {}
for line in open(sys.argv[1]):
    kind, name, mode, value = line.split()
    rows.setdefault((kind, name), {}).setdefault(mode, []).append(float(value))
metrics, ratios = [], {"unfenced": [], "fenced": []}
for (kind, name), by in sorted(rows.items()):
    med = {m: statistics.median(v) for m, v in by.items() if v}
    if "native" not in med:
        continue
    for mode in ("unfenced", "fenced"):
        if mode in med and med["native"] > 0:
            r = med[mode] / med["native"]
            ratios[mode].append(r)
            metrics.append({"name": f"{kind}_{name}_{mode}", "unit": "s" if kind == "wall" else "ms",
                            "better": "lower", "native": med["native"], "cumux": med[mode], "ratio": r})
for mode, rs in ratios.items():
    if rs:
        g = math.exp(sum(math.log(r) for r in rs) / len(rs))
        metrics.append({"name": f"geomean_{mode}", "unit": "ratio", "better": "lower",
                        "native": 1.0, "cumux": g, "ratio": g})
        print(f"geomean {mode} / native: {g:.4f} over {len(rs)} figures")
result = {"suite": "fence", "date": "$DATE", "gpu": "$GPU", "driver": "$DRIVER",
          "cuda": "$CUDA", "commit": "$COMMIT"}
notes = ["unfenced: tenant 'fast' (trusted = true); fenced: tenant 'fenced'; both --sharing fenced",
         "wall: a program's whole run (median of $ROUNDS); kernel: ms per launch from events"]
results_json.write(f"{sys.argv[2]}/$DATE-$SLUG-fence.json", result, metrics, notes)
PY
