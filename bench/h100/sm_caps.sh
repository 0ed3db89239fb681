#!/usr/bin/env bash
# SM caps (issue 20): a saturating tenant's throughput through cumux with
# sm_percent 25 / 50 / 75 against the same tenant uncapped, in one
# `cumux serve --sharing isolated`; natively first, for the ratio to native.
# The tenant is bench/cuda/tenant_bench.cu's throughput mode with
# TENANT_BLOCKS_PER_SM=128 (16 full waves of 8 x 256 threads an SM, so a
# part of the SMs still runs full waves), back to back for SECS seconds.
# Then two capped tenants at once (50 + 50 %, and a latency-critical 25 %
# beside a batch 75 %), each against its own rate alone, with isolated
# workers and with one shared context (PAIR_MODES): disjoint parts keep each
# at its rate where the GPU runs both at once. Also runs bench/cuda/green_probe.c natively (what green
# contexts give).
# Writes $OUT/sm-caps.txt and $OUT/sm-caps.json.
#
#   OUT=/some/dir KIT=/path/to/kit bench/h100/sm_caps.sh
# Optional: NVCC=, SECS= (default 4), ROUNDS= (default 2), CAPS= (default "25 50 75").
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-sm-caps}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
SECS=${SECS:-4}
ROUNDS=${ROUNDS:-2}
CAPS=${CAPS:-25 50 75}
PAIR_MODES=${PAIR_MODES:-isolated shared}
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
describe_machine
W=$(mktemp -d)
pids=()
trap stop_all EXIT
mkdir -p "$OUT"
REPORT=$OUT/sm-caps.txt
say() { echo "$*" | tee -a "$REPORT"; }
metric() { awk -v k="$2" '$1 == "metric" && $2 == k { print $3 }' "$1" | tail -1; }
: >"$REPORT"
say "sm caps, $DATE, $GPU, driver $DRIVER, CUDA $CUDA, kit $COMMIT; $SECS s a run, $ROUNDS rounds"

"$NVCC" -O2 -arch=sm_90 -o "$W/tenant_bench" "$ROOT/bench/cuda/tenant_bench.cu" || { say "build failed"; exit 1; }
"$NVCC" -ptx -arch=compute_90 -o "$W/spin.ptx" "$ROOT/bench/cuda/green_spin.cu" &&
    "$NVCC" -o "$W/green_probe" "$ROOT/bench/cuda/green_probe.c" -lcuda -lpthread ||
    { say "probe build failed"; exit 1; }
say "## natively, green contexts (bench/cuda/green_probe.c)"
"$W/green_probe" "$W/spin.ptx" 2>&1 | tee -a "$REPORT"

export TENANT_BLOCKS_PER_SM=128
"$W/tenant_bench" calibrate 2000 >"$W/calibrate.txt" 2>&1
ITERS=$(metric "$W/calibrate.txt" iters)
say "## a saturating tenant: $TENANT_BLOCKS_PER_SM blocks an SM, $ITERS iterations (2 ms of work alone, natively)"

{
    echo "[tenants.full]"
    for cap in $CAPS; do printf '[tenants.c%s]\nsm_percent = %s\n' "$cap" "$cap"; done
} >"$W/caps.toml"
"$KIT/cumux" serve --device cuda --sharing isolated --config "$W/caps.toml" \
    --listen "unix:$W/s.sock" >"$W/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
run_as() { # run_as TENANT: kernels/s through cumux ("native": natively)
    local file=$W/run-$1-$RANDOM.txt
    if [ "$1" = native ]; then
        timeout $((SECS + 60)) "$W/tenant_bench" throughput "$ITERS" "$SECS" >"$file" 2>&1
    else
        timeout $((SECS + 60)) "$KIT/cumux" run --server "unix:$W/s.sock" --tenant "$1" -- \
            "$W/tenant_bench" throughput "$ITERS" "$SECS" >"$file" 2>&1
    fi
    local rate
    rate=$(metric "$file" kernels_per_s)
    [ -n "$rate" ] || { tail -3 "$file" >&2; rate=0; }
    echo "$rate"
}
declare -A RATE
for r in $(seq "$ROUNDS"); do
    for t in native full $(for c in $CAPS; do echo "c$c"; done); do
        rate=$(run_as "$t")
        RATE[$t]="${RATE[$t]:-} $rate"
        say "round $r: $t $rate kernels/s"
    done
done
"$KIT/cumux" status --server "unix:$W/s.sock" >"$W/status.txt" 2>&1
say "## cumux status (tenants)"
sed -n '/^TENANT/,/^$/p' "$W/status.txt" | tee -a "$REPORT"
say "## the server's log on caps"
grep -E "part of|SMs" "$W/server.log" | head -8 | tee -a "$REPORT"

# Two capped tenants at once: their parts must not share SMs, so each runs
# at its own part's speed (overlapping parts would halve both). Placement:
# the latency-critical tenant first, then batch tenants by name; 200 % in
# all, so half_a starts again from the front (serve warns).
cat >"$W/pairs.toml" <<TOML
[tenants.lc]
sm_percent = 25
class = "latency-critical"
[tenants.bulk]
sm_percent = 75
[tenants.half_a]
sm_percent = 50
[tenants.half_b]
sm_percent = 50
TOML
pair_rate() { # pair_rate MODE TENANT: kernels/s through that mode's pairs server
    local file=$W/pair-$1-$2-$RANDOM.txt
    timeout $((SECS + 60)) "$KIT/cumux" run --server "unix:$W/p-$1.sock" --tenant "$2" -- \
        "$W/tenant_bench" throughput "$ITERS" "$SECS" >"$file" 2>&1
    local rate
    rate=$(metric "$file" kernels_per_s)
    [ -n "$rate" ] || { echo "# $2@$1 failed:" >>"$REPORT"; tail -5 "$file" >>"$REPORT"; }
    echo "${rate:-0}"
}
for mode in $PAIR_MODES; do
    "$KIT/cumux" serve --device cuda --sharing "$mode" --config "$W/pairs.toml" \
        --listen "unix:$W/p-$mode.sock" >"$W/pairs-$mode.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do [ -S "$W/p-$mode.sock" ] && break; sleep 0.1; done
    for r in $(seq "$ROUNDS"); do
        for pair in "half_a half_b" "lc bulk"; do
            set -- $pair
            for t in "$1" "$2"; do say "round $r: alone $t@$mode $(pair_rate "$mode" "$t") kernels/s"; done
            pair_rate "$mode" "$1" >"$W/a.rate" &
            first=$!
            pair_rate "$mode" "$2" >"$W/b.rate"
            wait "$first"
            say "round $r: together $1@$mode $(cat "$W/a.rate") kernels/s"
            say "round $r: together $2@$mode $(cat "$W/b.rate") kernels/s"
        done
    done
done
say "## the pairs server's log on placement"
for mode in $PAIR_MODES; do
    say "# $mode"
    grep -E "SM parts|SM caps add up|first_group|part of its GPU" "$W/pairs-$mode.log" | head -8 | tee -a "$REPORT"
done

python3 - "$REPORT" "$OUT/sm-caps.json" "$CAPS" <<PY
import sys, statistics
sys.path.insert(0, "$ROOT/bench/h100")
from results_json import write
rates = {}
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) == 5 and p[0] == "round" and p[4] == "kernels/s":
        rates.setdefault(p[2], []).append(float(p[3]))
med = {k: statistics.median(v) for k, v in rates.items()}
metrics = [{"name": "saturating_uncapped", "unit": "kernels/s", "better": "higher",
            "native": med.get("native"), "cumux": med.get("full"),
            "ratio": med["full"] / med["native"] if med.get("native") else None}]
lines = []
for cap in sys.argv[3].split():
    share = med.get("c" + cap, 0) / med["full"] if med.get("full") else None
    metrics.append({"name": f"share_at_sm_percent_{cap}", "unit": "of uncapped", "better": "closer to cap",
                    "native": int(cap) / 100, "cumux": share,
                    "ratio": share / (int(cap) / 100) if share else None})
    lines.append(f"sm_percent {cap}: {share:.3f} of uncapped (cap {int(cap)/100:.2f}; ratio {share/(int(cap)/100):.3f})")
pairs = {}
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) == 6 and p[0] == "round" and p[5] == "kernels/s":
        pairs.setdefault((p[2], p[3]), []).append(float(p[4]))
modes = sorted({k[1].split("@")[1] for k in pairs if "@" in k[1]})
for a, b, mode in [(a, b, m) for m in modes for a, b in (("half_a", "half_b"), ("lc", "bulk"))]:
    a, b = f"{a}@{mode}", f"{b}@{mode}"
    for t in (a, b):
        alone, together = pairs.get(("alone", t)), pairs.get(("together", t))
        if not alone or not together or not med.get("full"):
            continue
        al, to = statistics.median(alone), statistics.median(together)
        lines.append(f"{t} beside {b if t == a else a}: {to / al:.3f} of its rate alone "
                     f"({to / med['full']:.3f} of uncapped; alone {al / med['full']:.3f})")
        metrics.append({"name": f"together_{t.replace('@', '_')}", "unit": "of its capped rate alone", "better": "closer to 1",
                        "native": 1.0, "cumux": to / al, "ratio": to / al})
with open(sys.argv[1], "a") as f:
    f.write("## medians\n" + "\n".join(lines) + "\n")
print("\n".join(lines))
write(sys.argv[2], {"date": "$DATE", "gpu": "$GPU", "driver": "$DRIVER", "cuda": "$CUDA",
                    "commit": "$COMMIT", "suite": "sm-caps"}, metrics,
      ["a saturating tenant (tenant_bench throughput, 128 blocks an SM) alone through one cumux serve --sharing isolated; shares are of the same tenant uncapped"])
PY
