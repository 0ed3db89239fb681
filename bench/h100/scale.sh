#!/usr/bin/env bash
# Issue 19's scale run on every GPU of the machine, natively and through cumux
# in the same run; adapts to the number of GPUs it finds (N):
# - NCCL: PyTorch DDP across all N GPUs (bench/h100/ddp.py under torchrun):
#   losses equal to native, step time and all-reduce bus bandwidth ratios;
# - many tenants: 2 per GPU (a 2 ms batch tenant and a 50 µs latency tenant,
#   bench/cuda/tenant_bench.cu), all 2N at once, under `fair` (Jain's index
#   over every tenant's share of its speed alone) and `priority` (the latency
#   tenants' p99), each against the same mix on one GPU;
# - server: its CPU time and peak memory while the tenants run;
# - drain: `cumux drain 0` while 2 deterministic training runs per GPU go on
#   (an isolated server): the sessions moved, their pauses, every run's
#   losses against a native run's.
# The remote pool has a script of its own (bench/h100/pool.sh: a server per
# GPU behind the network emulator). Writes $OUT/scale.txt and
# $OUT/DATE-GPU-scale.json.
#
#   OUT=/some/dir bench/h100/scale.sh
# Optional: KIT=, NVCC=, SECS= (seconds per tenant run, default 4),
# PARTS= (of "ddp tenants drain", all by default; the JSON names those left out).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-scale}
NVCC=${NVCC:-nvcc}
SECS=${SECS:-4}
PARTS=${PARTS:-ddp tenants drain}
part() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p "$OUT/runs"
W=$(mktemp -d /tmp/cumux-scale.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
REPORT=$OUT/scale.txt
say() { echo "$*" | tee -a "$REPORT"; }
N=$(nvidia-smi -L | wc -l)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
say "scale $(date -u +%FT%TZ) kit $(cat "$KIT/COMMIT" 2>/dev/null): $N x $GPU, driver $DRIVER"
"$NVCC" -O2 -arch=sm_90 -o "$W/tenant_bench" "$ROOT/bench/cuda/tenant_bench.cu" >"$W/nvcc.log" 2>&1 || say "nvcc failed"
metric() { awk -v k="$2" '$1 == "metric" && $2 == k { print $3 }' "$1" | tail -1; }
value() { grep -h "^$2:" "$1" | tail -1 | awk '{ print $2 }'; }

server=
start_server() { # POLICY
    rm -f "$W/s.sock"
    printf '[tenants.lc]\nclass = "latency-critical"\n' >"$W/tenants.toml"
    "$KIT/cumux" serve --device cuda --sharing shared --policy "$1" --config "$W/tenants.toml" \
        --listen "unix:$W/s.sock" >"$OUT/runs/server-$1.log" 2>&1 &
    server=$!
    for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
}
stop_server() { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; }
# Samples the server's CPU seconds and RSS every 0.5 s into FILE until stopped.
sample_server() {
    while kill -0 "$server" 2>/dev/null; do
        ps -o rss=,times= -p "$server" >>"$1" 2>/dev/null
        sleep 0.5
    done
}

# --- NCCL: DDP across every GPU ---
if part ddp; then
DDP=(torchrun --standalone --nproc_per_node="$N" "$ROOT/bench/h100/ddp.py")
# Two rounds, alternating; the figures are the second round's (the first
# warms the machine), both rounds' step times are in the runs.
start_server fifo
for round in 1 2; do
    ( for _ in $(seq 10); do
        nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader
        echo --; sleep 2
      done >"$OUT/runs/ddp-native-apps-round$round.txt" 2>&1 ) &
    apps=$!
    timeout 300 "${DDP[@]}" >"$OUT/runs/ddp-native.log" 2>&1
    kill "$apps" 2>/dev/null
    # Which GPUs each process's contexts took, every 2 s while it runs.
    ( for _ in $(seq 15); do
        nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader
        echo --; sleep 2
      done >"$OUT/runs/ddp-apps-round$round.txt" 2>&1 ) &
    apps=$!
    timeout 300 "$KIT/cumux" run --server "unix:$W/s.sock" -- "${DDP[@]}" >"$OUT/runs/ddp-cumux.log" 2>&1
    kill "$apps" 2>/dev/null
    for side in native cumux; do
        cp "$OUT/runs/ddp-$side.log" "$OUT/runs/ddp-$side-round$round.log"
        say "ddp round $round $side: $(grep -h '^step_times_ms' "$OUT/runs/ddp-$side.log")"
    done
done
stop_server
for side in native cumux; do
    say "ddp $side: $(grep -c '^step [0-9]* loss' "$OUT/runs/ddp-$side.log") steps, step_ms $(value "$OUT/runs/ddp-$side.log" step_ms), busbw $(value "$OUT/runs/ddp-$side.log" allreduce_busbw_gbs) GB/s, $(grep -E 'ddp: PASS' -c "$OUT/runs/ddp-$side.log") PASS"
done
# The most GPUs any one process held a context on, over the samples.
most() { awk -F', ' '$1 != "--" { n[$1]++ } $1 == "--" { for (p in n) if (n[p] > m) m = n[p]; delete n } END { print m + 0 }' "$1"; }
say "ddp native: most GPUs one process held contexts on: $(most "$OUT/runs/ddp-native-apps-round2.txt")"
say "ddp cumux: most GPUs one worker process held contexts on: $(awk -F', ' '$1 != "--" { n[$1]++ } $1 == "--" { for (p in n) if (n[p] > m) m = n[p]; delete n } END { print m + 0 }' "$OUT/runs/ddp-apps-round2.txt")"
same=$(diff <(grep '^step [0-9]* loss' "$OUT/runs/ddp-native.log") <(grep '^step [0-9]* loss' "$OUT/runs/ddp-cumux.log") >/dev/null && echo yes || echo no)
say "ddp losses equal: $same"
fi

# --- many tenants: 2 per GPU ---
if part tenants; then
"$W/tenant_bench" calibrate 2000 >"$OUT/runs/cal2000.txt" 2>&1
"$W/tenant_bench" calibrate 50 >"$OUT/runs/cal50.txt" 2>&1
I2000=$(metric "$OUT/runs/cal2000.txt" iters)
I50=$(metric "$OUT/runs/cal50.txt" iters)
CUDA_VISIBLE_DEVICES=0 "$W/tenant_bench" throughput "$I2000" "$SECS" >"$OUT/runs/alone-batch.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 "$W/tenant_bench" latency "$I50" "$SECS" >"$OUT/runs/alone-lc.txt" 2>&1
# mix POLICY GPUS: on each of the first GPUS GPUs, a batch tenant and a latency tenant.
mix() {
    local policy=$1 gpus=$2 pids=() g
    for g in $(seq 0 $((gpus - 1))); do
        CUDA_VISIBLE_DEVICES=$g timeout $((SECS + 60)) "$KIT/cumux" run --server "unix:$W/s.sock" --tenant "batch$g" -- \
            "$W/tenant_bench" throughput "$I2000" "$SECS" >"$OUT/runs/$policy-$gpus-batch$g.txt" 2>&1 &
        pids+=($!)
        CUDA_VISIBLE_DEVICES=$g timeout $((SECS + 60)) "$KIT/cumux" run --server "unix:$W/s.sock" --tenant lc -- \
            "$W/tenant_bench" latency "$I50" "$SECS" >"$OUT/runs/$policy-$gpus-lc$g.txt" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
}
for policy in fair priority; do
    start_server "$policy"
    sample_server "$OUT/runs/server-samples-$policy.txt" &
    sampler=$!
    mix "$policy" 1
    mix "$policy" "$N"
    stop_server
    wait "$sampler" 2>/dev/null
done
fi

# --- drain: GPU 0 emptied while 2 training runs per GPU go on ---
if part drain; then
# An isolated server (a worker per session: sessions move); every run is the
# same deterministic training (bench/h100/migrate_train.py), so each one's
# losses must equal one native run's.
# 1500 steps (about a minute): long enough that every session on GPU 0 is
# still running when its move is carried out (300 let one end first).
TRAIN=(python3 "$ROOT/bench/h100/migrate_train.py" --steps "${DRAIN_STEPS:-1500}")
"${TRAIN[@]}" >"$OUT/runs/drain-native.txt" 2>&1
rm -f "$W/d.sock"
"$KIT/cumux" serve --device cuda --listen "unix:$W/d.sock" >"$OUT/runs/server-drain.log" 2>&1 &
server=$!
for _ in $(seq 300); do [ -S "$W/d.sock" ] && break; sleep 0.1; done
sample_server "$OUT/runs/server-samples-drain.txt" &
sampler=$!
runs=()
for g in $(seq 0 $((N - 1))); do
    for k in 1 2; do
        CUDA_VISIBLE_DEVICES=$g timeout 600 "$KIT/cumux" run --server "unix:$W/d.sock" -- "${TRAIN[@]}" \
            >"$OUT/runs/drain-gpu$g-$k.txt" 2>&1 &
        runs+=($!)
    done
done
for f in "$OUT"/runs/drain-gpu*-*.txt; do
    for _ in $(seq 1200); do grep -q '^ready' "$f" 2>/dev/null && break; sleep 0.1; done
done
sleep 1
"$KIT/cumux" drain 0 --server "unix:$W/d.sock" >"$OUT/runs/drain.txt" 2>&1
# A refused session: keep every worker's address map while they still run,
# to see what holds the range in the target.
if grep -q 'taken in' "$OUT/runs/drain.txt"; then
    for w in $(pgrep -P "$server"); do cp "/proc/$w/maps" "$OUT/runs/drain-maps-$w.txt" 2>/dev/null; done
fi
wait "${runs[@]}"
stop_server
wait "$sampler" 2>/dev/null
drain_passed=0; drain_same=0
for f in "$OUT"/runs/drain-gpu*-*.txt; do
    grep -q '^PASS' "$f" && drain_passed=$((drain_passed + 1))
    diff <(grep '^step [0-9]* loss' "$OUT/runs/drain-native.txt") <(grep '^step [0-9]* loss' "$f") >/dev/null &&
        drain_same=$((drain_same + 1))
done
grep -h 'moved from device' "$OUT/runs/server-drain.log" | sed 's/.*INFO [^:]*: //' >"$OUT/runs/drain-moves.txt"
say "drain of GPU 0: $(head -3 "$OUT/runs/drain.txt" | tr '\n' ' ')"
say "drain: $(grep -c . "$OUT/runs/drain-moves.txt") sessions moved; $drain_passed of $((2 * N)) runs passed, $drain_same with losses equal to native"
sed 's/^/  /' "$OUT/runs/drain-moves.txt" | tee -a "$REPORT"
echo "$drain_passed $drain_same $((2 * N))" >"$OUT/runs/drain-counts.txt"
fi

python3 - "$OUT" "$N" "$GPU" "$DRIVER" "$(cat "$KIT/COMMIT" 2>/dev/null)" "$PARTS" <<'PY' | tee -a "$REPORT"
import datetime, glob, json, re, sys
out, n, gpu, driver, commit = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
parts = sys.argv[6].split()
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

def value(path, key):
    try:
        for line in open(path, errors="replace"):
            if line.startswith(key + ":"):
                return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return None

def ratio(a, b):
    return a / b if a is not None and b else None

alone_batch = metric(f"{runs}/alone-batch.txt", "kernels_per_s")
alone_p99 = metric(f"{runs}/alone-lc.txt", "p99_us")
metrics, lines = [], []

def figure(name, unit, better, native, cumux):
    """One metric in the results' shape: ratio is cumux / native."""
    metrics.append({"name": name, "unit": unit, "better": better, "native": native,
                    "cumux": cumux, "ratio": ratio(cumux, native)})

ddp = {side: f"{runs}/ddp-{side}.log" for side in ("native", "cumux")}
figure("ddp_step_ms", "ms", "lower", value(ddp["native"], "step_ms"), value(ddp["cumux"], "step_ms"))
figure("ddp_allreduce_busbw_gbs", "GB/s", "higher",
       value(ddp["native"], "allreduce_busbw_gbs"), value(ddp["cumux"], "allreduce_busbw_gbs"))
for policy in ("fair", "priority"):
    for gpus in (1, n):
        rates = [metric(f"{runs}/{policy}-{gpus}-batch{g}.txt", "kernels_per_s") for g in range(gpus)]
        p99s = [metric(f"{runs}/{policy}-{gpus}-lc{g}.txt", "p99_us") for g in range(gpus)]
        shares = [ratio(r, alone_batch) for r in rates]
        ok = [s for s in shares if s is not None]
        jain = sum(ok) ** 2 / (len(ok) * sum(s * s for s in ok)) if ok and len(ok) == len(shares) else None
        slowest = min((r for r in rates if r is not None), default=None)
        worst = max((p for p in p99s if p is not None), default=None)
        # The batch tenants' speed against running alone natively (the slowest
        # of them), the latency tenants' p99 against alone natively (the worst).
        figure(f"{policy}_{gpus}gpu_batch_kernels_per_s", "1/s", "higher", alone_batch, slowest)
        figure(f"{policy}_{gpus}gpu_lc_p99_us", "us", "lower", alone_p99, worst)
        figure(f"{policy}_{gpus}gpu_batch_jain", "index", "higher", None, jain)
        lines.append(f"{policy} on {gpus} GPU(s): batch shares {['%.3f' % s if s is not None else 'failed' for s in shares]}"
                     f", Jain {jain if jain is None else round(jain, 3)}, latency p99 max {worst} µs"
                     f" (alone natively p99 {alone_p99})")
for policy in ("fair", "priority"):
    rss, cpu = [], []
    try:
        for line in open(f"{runs}/server-samples-{policy}.txt"):
            parts = line.split()
            if len(parts) == 2:
                rss.append(int(parts[0]))
                t = [int(x) for x in re.split("[-:]", parts[1])]
                cpu.append(sum(v * m for v, m in zip(reversed(t), (1, 60, 3600, 86400))))
    except OSError:
        pass
    peak = max(rss) / 1024 if rss else None
    cpu_s = (cpu[-1] - cpu[0]) if len(cpu) > 1 else None
    figure(f"server_peak_rss_mib_{policy}", "MiB", "lower", None, peak)
    figure(f"server_cpu_s_{policy}", "s", "lower", None, cpu_s)
    lines.append(f"server under {policy}: peak RSS {peak} MiB, CPU {cpu_s} s")
moves = []
try:
    for line in open(f"{runs}/drain-moves.txt"):
        m = re.search(r"in ([0-9.]+)(ms|s|µs) \(([0-9]+) bytes", line)
        if m:
            scale = {"ms": 1, "s": 1000, "µs": 0.001}[m.group(2)]
            moves.append((float(m.group(1)) * scale, int(m.group(3))))
except OSError:
    pass
try:
    passed, same, total = (int(x) for x in open(f"{runs}/drain-counts.txt").read().split())
except (OSError, ValueError):
    passed = same = total = None
pauses = sorted(p for p, _ in moves)
figure("drain_sessions_moved", "sessions", "higher", 2, len(moves))
figure("drain_runs_passed", "runs", "higher", total, passed)
figure("drain_runs_losses_equal_native", "runs", "higher", total, same)
figure("drain_pause_ms_max", "ms", "lower", None, pauses[-1] if pauses else None)
figure("drain_pause_ms_min", "ms", "lower", None, pauses[0] if pauses else None)
figure("drain_moved_bytes_max", "bytes", "lower", None, max((b for _, b in moves), default=None))
lines.append(f"drain: {len(moves)} sessions moved, pauses {pauses} ms; runs passed {passed}/{total}, losses equal to native {same}/{total}")
# Which part each figure and line is of; those of parts not run are left out.
def part_of(text):
    for prefix, name in (("ddp", "ddp"), ("fair", "tenants"), ("priority", "tenants"),
                         ("server", "tenants"), ("drain", "drain")):
        if text.startswith(prefix):
            return name
    return None
metrics = [m for m in metrics if part_of(m["name"]) in parts]
lines = [l for l in lines if part_of(l) in parts]
not_run = {"pool": "run by bench/h100/pool.sh (its own JSON)"}
for name in ("ddp", "tenants", "drain"):
    if name not in parts:
        not_run[name] = "left out of this run (PARTS)"
result = {
    "suite": "scale",
    "date": datetime.date.today().isoformat(),
    "gpu": gpu, "gpus": n, "driver": driver, "cuda": "13.0", "commit": commit,
    "metrics": metrics,
    "not_run": not_run,
}
slug = re.sub(r"[^a-z0-9]+", "", gpu.lower().replace("nvidia", "").split()[0]) if gpu else "gpu"
path = f"{out}/{result['date']}-{slug}x{n}-scale.json"
json.dump(result, open(path, "w"), indent=1)
for line in lines:
    print(line)
print("wrote", path)
PY
tar -C "$OUT" -czf "$OUT/scale-runs.tar.gz" runs 2>/dev/null && rm -rf "$OUT/runs"
say "done"
