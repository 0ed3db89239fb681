#!/usr/bin/env bash
# kernel_speed.py natively and through cumux (unix socket, shared memory) in alternating
# rounds, and whether Nsight Systems is there to trace the worker's kernels.
#   run(command="KIT=device-kit/main OUT=$OUT bash bench/h100/probes/kernel_speed.sh", carry=["device-kit/main"])
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
KIT=${KIT:-$ROOT/device-kit/main}
OUT=${OUT:-/tmp/kernel-speed}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
W=$(mktemp -d)
. "$ROOT/bench/h100/lib.sh"
pids=()
trap stop_all EXIT
{ command -v nsys; command -v ncu; ls /usr/local/cuda/bin 2>/dev/null | tr '\n' ' '; echo; } >"$OUT/tools.txt" 2>&1
"$KIT/cumux" serve --device cuda --listen "unix:$W/s.sock" >"$W/serve.out" 2>"$OUT/serve.log" &
pids+=($!)
for _ in $(seq 600); do grep -q listening "$W/serve.out" 2>/dev/null && break; sleep 0.1; done
for r in $(seq "$ROUNDS"); do
    python3 "$ROOT/bench/h100/probes/kernel_speed.py" >"$OUT/native-$r.txt" 2>&1
    "$KIT/cumux" run --server "unix:$W/s.sock" -- python3 "$ROOT/bench/h100/probes/kernel_speed.py" >"$OUT/cumux-$r.txt" 2>&1
done
paste "$OUT/native-1.txt" "$OUT/cumux-1.txt" | awk '{ print }'
for r in $(seq 2 "$ROUNDS"); do paste "$OUT/native-$r.txt" "$OUT/cumux-$r.txt"; done
cat "$OUT/tools.txt"
