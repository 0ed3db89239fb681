#!/usr/bin/env bash
# Device printf in `shared` mode on the GPU machine: programs printing at once
# into one CUDA context (crates/cli/tests/cuda/printf_tagged.cu, each its own
# tag, two launches per wait) must each get all their own lines and none of
# another's. Writes $OUT/shared_printf.txt.
#
#   OUT=/some/dir bench/h100/shared_printf.sh
# Optional: KIT=, NVCC=, N= (lines per program, default 200), COPIES= (default 4).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-shared-printf}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
N=${N:-200}
COPIES=${COPIES:-4}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-sp.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
"$NVCC" -O2 -arch=sm_90 -o "$W/pt" "$ROOT/crates/cli/tests/cuda/printf_tagged.cu" || exit 1
REPORT=$OUT/shared_printf.txt
: >"$REPORT"
"$KIT/cumux" serve --device cuda --sharing shared --listen "unix:$W/s.sock" >"$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
tags=(aaa bbb ccc ddd eee fff ggg hhh)
pids=()
t0=$(date +%s.%N)
for i in $(seq 0 $((COPIES - 1))); do
    timeout 120 "$KIT/cumux" run --server "unix:$W/s.sock" -- "$W/pt" "${tags[$i]}" "$N" >"$W/${tags[$i]}.out" 2>&1 &
    pids+=($!)
done
wait "${pids[@]}"
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
for i in $(seq 0 $((COPIES - 1))); do
    tag=${tags[$i]}
    own=$(grep -c "^tag $tag " "$W/$tag.out")
    all=$(grep -c "^tag " "$W/$tag.out")
    pass=$(grep -c "printf_tagged: PASS" "$W/$tag.out")
    verdict=FAIL
    [ "$own" = "$N" ] && [ "$all" = "$N" ] && [ "$pass" = 1 ] && verdict=PASS
    echo "$tag: $verdict: $own of its $N lines, $all device lines in all" | tee -a "$REPORT"
done
echo "$COPIES programs of $N printing launches at once: $secs s" | tee -a "$REPORT"
kill "$server"
wait "$server" 2>/dev/null
rm -rf "$W"
