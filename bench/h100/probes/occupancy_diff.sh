#!/usr/bin/env bash
# occupancy_diff.cu natively and through cumux; prints the lines that differ.
#   run(command="KIT=device-kit/main OUT=$OUT bash bench/h100/probes/occupancy_diff.sh", carry=["device-kit/main"])
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
KIT=${KIT:-$ROOT/device-kit/main}
OUT=${OUT:-/tmp/occupancy-diff}
mkdir -p "$OUT"
W=$(mktemp -d)
. "$ROOT/bench/h100/lib.sh"
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o "$W/occ" "$ROOT/bench/h100/probes/occupancy_diff.cu" || exit 1
"$W/occ" >"$OUT/native.txt" 2>&1
"$KIT/cumux" serve --device cuda --listen "unix:$W/s" >"$W/out" 2>"$W/serve.log" & sp=$!
for _ in $(seq 300); do grep -q listening "$W/out" 2>/dev/null && break; sleep 0.1; done
"$KIT/cumux" run --server "unix:$W/s" -- "$W/occ" >"$OUT/cumux.txt" 2>&1
kill $sp
echo "lines: $(wc -l <"$OUT/native.txt") native, $(wc -l <"$OUT/cumux.txt") cumux; differing:"
diff "$OUT/native.txt" "$OUT/cumux.txt" | head -60
