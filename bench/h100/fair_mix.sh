#!/usr/bin/env bash
# Fairness under every pacing style (issue 20): four tenants, each a process
# running GPU-filling kernels (TENANT_BLOCKS_PER_SM=8) of 20 µs, 200 µs, 2 ms
# and 5 µs of work, paced as programs pace them (bench/cuda/tenant_bench.cu
# `paced`: window, sync, streamsync, graph, streams). Each tenant alone
# natively is its reference; then the four at once natively (the GPU's time
# slicing) and through each cumux kit under `--policy fair`, where each
# tenant also runs alone through that kit. Per mix: each tenant's share of
# its alone rate (natively, and through the same kit), Jain's index over the
# shares, and their sum. Writes $OUT/fair-mix.txt and .json.
#
#   OUT=/some/dir KITS="main:/path/kit [other:/path/kit2]" bench/h100/fair_mix.sh
# The four of a mix time the same window (START_DELAY= seconds after they
# start, default 4: `start_together` in lib.sh).
# Optional: NVCC=, SECS= (default 3), STYLES= (default all five), US= (default
# "20 200 2000 5"), POLICY= (default fair), SHARING= (default isolated).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/cumux-fair-mix}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
SECS=${SECS:-3}
STYLES=${STYLES:-window sync streamsync graph streams}
US=${US:-20 200 2000 5}
POLICY=${POLICY:-fair}
SHARING=${SHARING:-isolated}
KITS=${KITS:-main:$ROOT/device-kit}
KIT=${KITS#*:}; KIT=${KIT%% *}
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
describe_machine
W=$(mktemp -d)
pids=()
trap stop_all EXIT
mkdir -p "$OUT"
REPORT=$OUT/fair-mix.txt
say() { echo "$*" | tee -a "$REPORT"; }
metric() { awk -v k="$2" '$1 == "metric" && $2 == k { print $3 }' "$1" | tail -1; }
: >"$REPORT"
say "fair mix, $DATE, $GPU, driver $DRIVER, CUDA $CUDA; kits: $KITS; $SECS s a run; --sharing $SHARING --policy $POLICY"
"$NVCC" -O2 -arch=sm_90 -o "$W/tb" "$ROOT/bench/cuda/tenant_bench.cu" || { say "build failed"; exit 1; }
export TENANT_BLOCKS_PER_SM=8
declare -A ITERS
for us in $US; do
    "$W/tb" calibrate "$us" >"$W/cal_$us.txt" 2>&1
    ITERS[$us]=$(metric "$W/cal_$us.txt" iters)
    say "kernel $us us: ${ITERS[$us]} iterations ($(metric "$W/cal_$us.txt" kernel_us) us alone)"
done
# One tenant: tenant SERVER|native STYLE US FILE
tenant() {
    local server=$1 style=$2 us=$3 file=$4
    if [ "$server" = native ]; then
        timeout $((SECS + 60)) "$W/tb" paced "$style" "${ITERS[$us]}" "$SECS" >"$file" 2>&1
    else
        timeout $((SECS + 60)) "$server_kit/cumux" run --server "$server" --tenant "t$us" -- \
            "$W/tb" paced "$style" "${ITERS[$us]}" "$SECS" >"$file" 2>&1
    fi
}
rate() { local r; r=$(metric "$1" kernels_per_s); echo "${r:-0}"; }
# The four at once: mix SERVER|native STYLE LABEL
mix() {
    local tp=() us
    start_together
    for us in $US; do
        tenant "$1" "$2" "$us" "$W/mix_$3_$2_$us.txt" &
        tp+=($!)
    done
    wait "${tp[@]}"
    unset TENANT_START_AT
    for us in $US; do
        echo "rate $3 $2 $us $(rate "$W/mix_$3_$2_$us.txt")" | tee -a "$REPORT"
    done
}
for style in $STYLES; do
    for us in $US; do
        tenant native "$style" "$us" "$W/alone_${style}_$us.txt"
        echo "rate alone $style $us $(rate "$W/alone_${style}_$us.txt")" | tee -a "$REPORT"
    done
    mix native "$style" native
done
for kit in $KITS; do
    label=${kit%%:*}
    server_kit=${kit#*:}
    sock=$W/$label.sock
    "$server_kit/cumux" serve --device cuda --sharing "$SHARING" --policy "$POLICY" \
        --listen "unix:$sock" >"$W/server_$label.log" 2>&1 &
    server=$!
    pids+=($server)
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    for style in $STYLES; do
        for us in $US; do
            tenant "unix:$sock" "$style" "$us" "$W/alone_${label}_${style}_$us.txt"
            echo "rate alone-$label $style $us $(rate "$W/alone_${label}_${style}_$us.txt")" | tee -a "$REPORT"
        done
        mix "unix:$sock" "$style" "$label"
        # fair's turns so far on this server (cumulative): turns, GPU idle in
        # held turns (ms), overruns.
        "$server_kit/cumux" status --server "unix:$sock" --json 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)["devices"][0]
print("turns %s %s %d %.1f %d" % (sys.argv[1], sys.argv[2], d.get("turns", 0),
      d.get("turn_idle_held_ns", 0) / 1e6, d.get("turn_overruns", 0)))' "$label" "$style" | tee -a "$REPORT"
    done
    kill "$server"; wait "$server" 2>/dev/null
done

python3 - "$REPORT" "$OUT/fair-mix.json" <<PY
import sys
sys.path.insert(0, "$ROOT/bench/h100")
from results_json import write
rates = {}
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) == 5 and p[0] == "rate":
        rates[(p[1], p[2], p[3])] = float(p[4])
labels = sorted({k[0] for k in rates if not k[0].startswith("alone")}, key=lambda l: (l != "native", l))
styles = list(dict.fromkeys(k[1] for k in rates))
us = "$US".split()
metrics, table = [], ["mix            style       " + "  ".join(f"{u:>6}us" for u in us) + "   Jain    sum"]
def row(label, style, base, name):
    shares = [rates.get((label, style, u), 0) / rates[(base, style, u)]
              if rates.get((base, style, u)) else 0 for u in us]
    s, q = sum(shares), sum(x * x for x in shares)
    jain = s * s / (len(shares) * q) if q else 0
    table.append(f"{name:<14} {style:<11} " + "  ".join(f"{x:8.3f}" for x in shares) + f"  {jain:5.3f}  {s:5.3f}")
    metrics.append({"name": f"jain_{style}_{name}", "unit": "index", "better": "higher",
                    "native": None, "cumux": round(jain, 4), "ratio": None})
    metrics.append({"name": f"shares_sum_{style}_{name}", "unit": "alone rates", "better": "higher",
                    "native": None, "cumux": round(s, 4), "ratio": None})
for style in styles:
    for label in labels:
        row(label, style, "alone", label)
        if label != "native" and any(k[0] == "alone-" + label for k in rates):
            row(label, style, "alone-" + label, label + "/own")
with open(sys.argv[1], "a") as f:
    f.write("## shares of each tenant's alone rate (kernel sizes in µs), Jain's index, their sum; LABEL: of the native alone rate, LABEL/own: of the alone rate through the same kit\n" + "\n".join(table) + "\n")
print("\n".join(table))
write(sys.argv[2], {"date": "$DATE", "gpu": "$GPU", "driver": "$DRIVER", "cuda": "$CUDA",
                    "commit": "$COMMIT", "suite": "fair-mix"}, metrics,
      ["four GPU-filling tenants (kernels of $US µs) under each pacing style; native = the GPU's time slicing; other labels = cumux kits under --policy $POLICY --sharing $SHARING"])
PY
