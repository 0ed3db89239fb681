#!/usr/bin/env bash
# Every kernel of two GPT-2 training steps (remote_step.py) as Nsight Compute sees it
# launched, natively and in cumux's worker: name, grid, block, cluster, dynamic shared
# memory; prints the launches whose shape differs between the two (a library choosing
# other kernels through cumux than natively).
#   run(command="KIT=device-kit/main OUT=$OUT bash bench/h100/probes/kernel_census.sh", carry=["device-kit/main"])
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
KIT=${KIT:-$ROOT/device-kit/main}
OUT=${OUT:-/tmp/kernel-census}
NCU=${NCU:-/usr/local/cuda/bin/ncu}
mkdir -p "$OUT"
W=$(mktemp -d)
. "$ROOT/bench/h100/lib.sh"
STEP=(python3 "$ROOT/bench/h100/remote_step.py" 1 1)
SECTIONS=(--section LaunchStats)
timeout 250 "$NCU" "${SECTIONS[@]}" --csv --page details "${STEP[@]}" >"$W/native.csv" 2>"$OUT/native.err"
echo "native rc $?"
timeout 250 "$NCU" --target-processes all "${SECTIONS[@]}" -o "$W/cumux" -f \
    "$KIT/cumux" serve --device cuda --listen "unix:$W/s.sock" >"$W/serve.out" 2>"$OUT/serve.log" &
ncu_pid=$!
for _ in $(seq 900); do grep -q listening "$W/serve.out" 2>/dev/null && break; sleep 0.1; done
timeout 200 "$KIT/cumux" run --server "unix:$W/s.sock" -- "${STEP[@]}" >"$OUT/client.out" 2>"$OUT/client.err"
echo "cumux rc $?"
pkill -TERM -f "cumux serve --device cuda --listen unix:$W"; sleep 3
pkill -TERM -f "cumux worker"; wait "$ncu_pid"
for r in "$W"/cumux*.ncu-rep; do "$NCU" --import "$r" --csv --page details >>"$W/cumux.csv" 2>&1; done
python3 - "$W/native.csv" "$W/cumux.csv" "$OUT" <<'PY'
import collections, csv, sys
def launches(path):
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    if not rows:
        return []
    h = {k: i for i, k in enumerate(rows[0])}
    by = collections.OrderedDict()
    for r in rows[1:]:
        d = by.setdefault(r[h["ID"]], {"name": r[h["Kernel Name"]][:100], "grid": r[h["Grid Size"]],
                                         "block": r[h["Block Size"]]})
        if r[h["Metric Name"]] in ("Cluster Size", "Dynamic Shared Memory Per Block"):
            d[r[h["Metric Name"]]] = r[h["Metric Value"]].replace(",", "")
    return [f'{d["name"]} grid {d["grid"]} block {d["block"]} cluster {d.get("Cluster Size","?")} dyn {d.get("Dynamic Shared Memory Per Block","?")}' for d in by.values()]
n, c = launches(sys.argv[1]), launches(sys.argv[2])
out = sys.argv[3]
open(out + "/native-launches.txt", "w").write("\n".join(n) + "\n")
open(out + "/cumux-launches.txt", "w").write("\n".join(c) + "\n")
cn, cc = collections.Counter(n), collections.Counter(c)
print(f"launches: native {len(n)}, cumux {len(c)}; distinct shapes {len(cn)} / {len(cc)}")
print("only natively (count):")
for k, v in (cn - cc).most_common(25): print(f"  {v:4d} {k}")
print("only through cumux (count):")
for k, v in (cc - cn).most_common(25): print(f"  {v:4d} {k}")
PY
