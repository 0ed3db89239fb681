#!/usr/bin/env bash
# Nsight Compute's launch and occupancy sections for mm_one.py's matmuls, natively and in
# cumux's worker (the server profiled with its children), and the client's debug log.
#   run(command="KIT=device-kit/main OUT=$OUT bash bench/h100/probes/kernel_ncu.sh", carry=["device-kit/main"])
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
KIT=${KIT:-$ROOT/device-kit/main}
OUT=${OUT:-/tmp/kernel-ncu}
NCU=${NCU:-/usr/local/cuda/bin/ncu}
mkdir -p "$OUT"
W=$(mktemp -d)
. "$ROOT/bench/h100/lib.sh"
SECTIONS=(--section LaunchStats --section Occupancy)
timeout 200 "$NCU" "${SECTIONS[@]}" --csv --page details python3 "$ROOT/bench/h100/probes/mm_one.py" 1 >"$OUT/native.csv" 2>"$OUT/native.err"
echo "native rc $?"
timeout 200 "$NCU" --target-processes all "${SECTIONS[@]}" -o "$W/cumux" -f \
    "$KIT/cumux" serve --device cuda --listen "unix:$W/s.sock" >"$W/serve.out" 2>"$OUT/serve.log" &
ncu_pid=$!
for _ in $(seq 900); do grep -q listening "$W/serve.out" 2>/dev/null && break; sleep 0.1; done
CUMUX_LOG=debug timeout 120 "$KIT/cumux" run --server "unix:$W/s.sock" -- \
    python3 "$ROOT/bench/h100/probes/mm_one.py" 1 >"$OUT/client.out" 2>"$OUT/client.log"
echo "cumux rc $?"
pkill -TERM -f "cumux serve --device cuda --listen unix:$W" ; sleep 3
pkill -TERM -f "cumux worker" ; wait "$ncu_pid"
ls -la "$W"
for r in "$W"/cumux*.ncu-rep; do "$NCU" --import "$r" --csv --page details >>"$OUT/cumux.csv" 2>&1; done
grep -c . "$OUT/native.csv" "$OUT/cumux.csv"
grep -i -E "attribute|carveout|cluster" "$OUT/client.log" | sort | uniq -c | head -20
