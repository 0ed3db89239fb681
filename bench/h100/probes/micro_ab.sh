#!/usr/bin/env bash
# Paired A/B of the same-host micro-benchmarks: bench/h100/microbench.sh with
# kit A, then kit B, ROUNDS times alternating (each run has its own native
# column), then the median over rounds of each kit's cumux/native ratio.
# Run from the repository root on the GPU machine:
#   A=device-kit/main B=device-kit/new ROUNDS=3 OUT=$OUT bench/h100/probes/micro_ab.sh
set -u
A=${A:?kit A}
B=${B:?kit B}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-/tmp/micro-ab}
mkdir -p "$OUT"
for r in $(seq "$ROUNDS"); do
    for side in A B; do
        kit=${!side}
        echo "== round $r kit $side ($kit, $(cat "$kit/COMMIT" 2>/dev/null))"
        KIT=$kit OUT=$OUT/r$r-$side bench/h100/microbench.sh >"$OUT/r$r-$side.log" 2>&1
        grep -E "^(launch_sync|launch_rate|htod_pinned_64k|dtoh_pinned_64k|graph_100_sync)" "$OUT/r$r-$side.log" | head -8
    done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import glob, json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
ratios = {}
for side in "AB":
    for r in range(1, rounds + 1):
        for f in glob.glob(f"{out}/r{r}-{side}/*.json"):
            for m in json.load(open(f))["metrics"]:
                if m.get("ratio") is not None:
                    ratios.setdefault(m["name"], {}).setdefault(side, []).append(m["ratio"])
print(f"{'metric':28} {'A median':>9} {'B median':>9}   per round A | B")
for name, by in ratios.items():
    a, b = by.get("A", []), by.get("B", [])
    med = lambda v: f"{statistics.median(v):9.3f}" if v else "        -"
    print(f"{name:28} {med(a)} {med(b)}   {[round(x, 3) for x in a]} | {[round(x, 3) for x in b]}")
PY
