#!/usr/bin/env bash
# Issue 6's sharing benchmark on the GPU machine: tenants as separate
# processes running fixed-work kernels (bench/cuda/tenant_bench.cu) at once,
# natively (the driver time-slices their contexts), under MPS, and through
# cumux in `isolated` and `shared` mode, the latter also under the `fair` and
# `priority` policies (modes `fair` and `priority`; each tenant its own name,
# the latency tenant of the last mix configured latency-critical). For each mix it reports every
# tenant's throughput against running alone natively, Jain's fairness index
# over those, their sum (total throughput, 1.0 per tenant at full speed), and
# a latency-critical tenant's p50/p99 next to a batch tenant. Writes
# $OUT/tenants.txt and $OUT/DATE-GPU-tenants.json. Needs device-kit/ and nvcc.
#
#   OUT=/some/dir bench/h100/tenants.sh
# Optional: KIT=, NVCC=, NVCC_FLAGS=, SECS= (seconds per run, default 4),
# MODES= (default "native mps isolated shared fair priority"), GPU_SLUG= (default h100),
# DEVICE= (what cumux serves, default cuda; worker-cpu for a dry run),
# TENANT_BLOCKS_PER_SM= (default 1; 8 makes every kernel fill the GPU, so
# kernels of different tenants cannot run side by side), TAG= (added to the
# result file names), LC_ROUNDS= (default 3: rounds of the latency mix, each
# with the latency tenant alone in the mode too; figures are medians over them).
# Mode splitNN: a static split in shared mode, the latency tenant capped at
# NN % of the SMs and the batch tenant at the rest (`sm_percent`); it runs
# only the latency mix.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-tenants}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
SECS=${SECS:-4}
MODES=${MODES:-native mps isolated shared fair priority}
GPU_SLUG=${GPU_SLUG:-h100}
DEVICE=${DEVICE:-cuda}
NVCC_FLAGS=${NVCC_FLAGS:-}
LC_ROUNDS=${LC_ROUNDS:-3}
mkdir -p "$OUT/runs"
WORK=$(mktemp -d /tmp/cumux-tenants.XXXXXX)
BIN=$WORK/tenant_bench
if [ -z "${CUMUX_REAL_LIBCUDA:-}" ]; then
    real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    [ -n "$real" ] && export CUMUX_REAL_LIBCUDA=$real
fi
# shellcheck disable=SC2086 # a flag list
"$NVCC" -O2 -arch=sm_90 $NVCC_FLAGS -o "$BIN" "$ROOT/bench/cuda/tenant_bench.cu" || { echo "build failed"; exit 1; }

. "$ROOT/bench/h100/lib.sh"
metric() { awk -v k="$2" '$1 == "metric" && $2 == k { print $3 }' "$1" | tail -1; }

# Kernel sizes (µs of work alone) → calibrated iterations.
declare -A ITERS
for us in 2000 500 50 20 5; do
    "$BIN" calibrate "$us" >"$OUT/runs/calibrate_$us.txt" 2>&1
    ITERS[$us]=$(metric "$OUT/runs/calibrate_$us.txt" iters)
done

SERVER_PID=
start_mode() {
    case $1 in
        mps)
            export CUDA_MPS_PIPE_DIRECTORY=$WORK/mps-pipe CUDA_MPS_LOG_DIRECTORY=$WORK/mps-log
            mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
            nvidia-cuda-mps-control -d
            sleep 1
            ;;
        isolated | shared | fair | priority | split*)
            local sharing=$1 policy=fifo
            case $1 in fair | priority | split*) sharing=shared; [ "${1#split}" = "$1" ] && policy=$1 ;; esac
            printf '[tenants.lc]\nclass = "latency-critical"\n' >"$WORK/tenants.toml"
            case $1 in split*)
                printf 'sm_percent = %s\n[tenants.batch]\nsm_percent = %s\n' "${1#split}" $((100 - ${1#split})) >>"$WORK/tenants.toml" ;;
            esac
            "$KIT/cumux" serve --device "$DEVICE" --sharing "$sharing" --policy "$policy" \
                --config "$WORK/tenants.toml" --listen "unix:$WORK/$1.sock" \
                >"$OUT/runs/server_$1.log" 2>&1 &
            SERVER_PID=$!
            for _ in $(seq 100); do [ -S "$WORK/$1.sock" ] && break; sleep 0.1; done
            ;;
    esac
}
stop_mode() {
    case $1 in
        mps)
            echo quit | nvidia-cuda-mps-control
            sleep 1
            unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
            ;;
        isolated | shared | fair | priority | split*)
            "$KIT/cumux" status --server "unix:$WORK/$1.sock" >"$OUT/runs/status_$1.txt" 2>&1
            kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null ;;
    esac
}
# One tenant process of `mode`: tenant MODE KIND US OUTFILE [NAME]; NAME is its
# tenant name under cumux (default: one of its own).
tenant() {
    local mode=$1 kind=$2 us=$3 file=$4 name=${5:-t$RANDOM$RANDOM}
    case $mode in
        isolated | shared | fair | priority | split*)
            timeout $((SECS + 60)) "$KIT/cumux" run --server "unix:$WORK/$mode.sock" --tenant "$name" -- \
                "$BIN" "$kind" "${ITERS[$us]}" "$SECS" >"$file" 2>&1
            ;;
        *) timeout $((SECS + 60)) "$BIN" "$kind" "${ITERS[$us]}" "$SECS" >"$file" 2>&1 ;;
    esac
}

# Alone, natively: the reference of every tenant (the latency tenant once per round).
for us in 2000 500 50 20 5; do
    tenant native throughput "$us" "$OUT/runs/alone_$us.txt"
done
for r in $(seq "$LC_ROUNDS"); do
    tenant native latency 50 "$OUT/runs/alone_latency_50_r$r.txt"
done

for mode in $MODES; do
    start_mode "$mode"
    # s1: a 2 ms tenant and a 20 µs tenant; s2: four sizes.
    mixes="s1:2000 20|s2:2000 500 50 5"
    case $mode in split*) mixes= ;; esac
    IFS='|' read -ra mix_list <<<"$mixes"
    for mix in "${mix_list[@]}"; do
        name=${mix%%:*}
        i=0
        pids=()
        start_together
        for us in ${mix#*:}; do
            tenant "$mode" throughput "$us" "$OUT/runs/${mode}_${name}_${i}_$us.txt" &
            pids+=($!)
            i=$((i + 1))
        done
        # Only the tenants: a plain `wait` would wait for the server too.
        wait "${pids[@]}"
        unset TENANT_START_AT
    done
    # lc: a latency-critical tenant (50 µs kernels) next to a 2 ms batch tenant,
    # and alone in this mode (its standalone here), LC_ROUNDS times each.
    for r in $(seq "$LC_ROUNDS"); do
        tenant "$mode" latency 50 "$OUT/runs/${mode}_lcalone_latency_50_r$r.txt" lc
        start_together
        tenant "$mode" throughput 2000 "$OUT/runs/${mode}_lc_batch_2000_r$r.txt" batch &
        batch=$!
        tenant "$mode" latency 50 "$OUT/runs/${mode}_lc_latency_50_r$r.txt" lc &
        wait $batch $!
        unset TENANT_START_AT
    done
    stop_mode "$mode"
done

python3 - "$OUT" "$GPU_SLUG" "$(head -1 "$KIT/COMMIT" 2>/dev/null)" "$MODES" <<'PY'
import datetime, glob, json, os, re, subprocess, sys
out, slug, commit, modes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
runs = f"{out}/runs"

def metric(path, key):
    try:
        for line in open(path, errors="replace"):
            p = line.split()
            if len(p) == 4 and p[0] == "metric" and p[1] == key:
                return float(p[2])
    except OSError:
        pass
    return None

def rounds(pattern, key):
    """One figure from each round's file, in round order (missing ones left out)."""
    files = sorted(glob.glob(pattern), key=lambda p: int(re.search(r"_r(\d+)\.txt$", p).group(1)))
    return [v for v in (metric(p, key) for p in files) if v is not None]

def median(values):
    if not values:
        return None
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2

def fmt(values):
    return "/".join(f"{v:.1f}" for v in values) or "failed"

alone = {us: metric(f"{runs}/alone_{us}.txt", "kernels_per_s") for us in (2000, 500, 50, 20, 5)}
lines, metrics = [], []
lines.append("alone (native): " + ", ".join(f"{us} µs: {v:.1f}/s" if v else f"{us} µs: failed" for us, v in alone.items()))
summary = {}
for mode in modes:
    for mix in ("s1", "s2"):
        shares = []
        for path in sorted(glob.glob(f"{runs}/{mode}_{mix}_*.txt")):
            us = int(re.search(r"_(\d+)\.txt$", path).group(1))
            rate = metric(path, "kernels_per_s")
            shares.append((us, rate / alone[us] if rate and alone.get(us) else None))
        ok = [s for _, s in shares if s is not None]
        if len(ok) == len(shares) and ok:
            jain = sum(ok) ** 2 / (len(ok) * sum(s * s for s in ok))
            total = sum(ok)
        else:
            jain = total = None
        summary[(mode, mix)] = (jain, total)
        lines.append(f"{mode:<9} {mix}: " + ", ".join(
            f"{us} µs {s:.3f}" if s is not None else f"{us} µs failed" for us, s in shares)
            + (f" | Jain {jain:.3f}, total {total:.3f}" if jain is not None else " | incomplete"))
    batch = rounds(f"{runs}/{mode}_lc_batch_2000_r*.txt", "kernels_per_s")
    if batch and alone.get(2000):
        shares = [b / alone[2000] for b in batch]
        summary[(mode, "lc_batch")] = (median(shares), None)
        lines.append(f"{mode:<9} lc: the 2 ms batch tenant beside it: {fmt(shares)} of its rate alone natively")
    for kind, label in (("lc", "next to a 2 ms batch tenant"), ("lcalone", "alone in this mode")):
        p50s = rounds(f"{runs}/{mode}_{kind}_latency_50_r*.txt", "p50_us")
        p99s = rounds(f"{runs}/{mode}_{kind}_latency_50_r*.txt", "p99_us")
        summary[(mode, kind)] = (median(p50s), median(p99s))
        lines.append(f"{mode:<9} {kind}: latency tenant {label}: p50 {fmt(p50s)}, p99 {fmt(p99s)} µs"
                     f" (median {median(p99s)})")
a50s = rounds(f"{runs}/alone_latency_50_r*.txt", "p50_us")
a99s = rounds(f"{runs}/alone_latency_50_r*.txt", "p99_us")
a50, a99 = median(a50s), median(a99s)
lines.append(f"latency tenant alone (native): p50 {fmt(a50s)}, p99 {fmt(a99s)} µs (median {a99})")
for mode in modes:
    p99, own = summary[(mode, "lc")][1], summary[(mode, "lcalone")][1]
    if p99 and a99:
        lines.append(f"{mode:<9} lc p99 against alone natively {p99 / a99:.2f}x"
                     + (f", against alone in this mode {p99 / own:.2f}x" if own else ""))

def row(name, unit, better, idx, key):
    vals = {m: summary.get((m, key), (None, None))[idx] for m in modes}
    native = vals.get("native")
    cumux = vals.get("shared")
    m = {"name": name, "unit": unit, "better": better, "native": native, "cumux": cumux,
         "ratio": round(cumux / native, 4) if native and cumux else None}
    for mode in modes:
        m[mode] = vals[mode]
    metrics.append(m)

for mix in ("s1", "s2"):
    row(f"{mix}_jain", "index", "higher", 0, mix)
    row(f"{mix}_total_throughput", "tenants at full speed", "higher", 1, mix)
row("lc_batch_share", "of alone natively", "higher", 0, "lc_batch")
row("lc_p50_us", "us", "lower", 0, "lc")
row("lc_p99_us", "us", "lower", 1, "lc")
row("lc_alone_in_mode_p50_us", "us", "lower", 0, "lcalone")
row("lc_alone_in_mode_p99_us", "us", "lower", 1, "lcalone")

def smi(q):
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception:
        return "unknown"
date = datetime.date.today().isoformat()
result = {"suite": "tenants", "date": date, "gpu": smi("name"), "driver": smi("driver_version"),
          "cuda": "13.0", "commit": commit,
          "notes": "native = separate processes time-sliced by the driver; cumux = shared mode; "
                   "fair and priority = shared mode under those policies; "
                   "each mode's value is also given under its name; throughputs are against the "
                   "tenant alone natively; lc = 50 µs latency tenant next to a 2 ms batch tenant, "
                   "lc_alone_in_mode = the same tenant alone in that mode, both medians over "
                   f"{os.environ.get('LC_ROUNDS', '3')} rounds (alone natively: p50 {a50} µs, "
                   f"p99 {a99} µs); "
                   f"blocks per SM per kernel: {os.environ.get('TENANT_BLOCKS_PER_SM', '1')}",
          "metrics": metrics}
tag = os.environ.get("TAG", "")
with open(f"{out}/{date}-{slug}-tenants{tag}.json", "w") as f:
    json.dump(result, f, indent=1)
with open(f"{out}/tenants.txt", "w") as f:
    f.write(f"tenants benchmark, {date}, {result['gpu']}, driver {result['driver']}, kit {commit}, {os.environ.get('SECS', '4')} s per run\n")
    f.write("\n".join(lines) + "\n")
print(open(f"{out}/tenants.txt").read())
PY
