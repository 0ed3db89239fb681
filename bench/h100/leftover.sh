#!/usr/bin/env bash
# Memory one tenant freed, seen by the next (tests/cuda/tenants/leftover.cu): in
# `shared` mode every tenant allocates in one CUDA context, whose allocator gives
# freed memory out again as it is; cumux scrubs what a session frees. Runs
# `leave` then `find` as two tenants, ROUNDS times, in `shared` and `isolated`
# mode, with $KIT's cumux and, if present, $OLD_KIT's (a build before the scrub).
# Writes $OUT/leftover.txt.
#
#   OUT=/some/dir bench/h100/leftover.sh
# Optional: KIT=, OLD_KIT=, NVCC=, SIZES= (default "4K 64K 1M 2M 64M"), ROUNDS= (default 2).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OLD_KIT=${OLD_KIT:-}
OUT=${OUT:-/tmp/cumux-leftover}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
SIZES=${SIZES:-4K 64K 1M 2M 64M}
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-leftover.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
"$NVCC" -O2 -arch=sm_90 -o "$W/leftover" "$ROOT/tests/cuda/tenants/leftover.cu" || exit 1
REPORT=$OUT/leftover.txt
: >"$REPORT"
kits=("$KIT")
[ -n "$OLD_KIT" ] && kits+=("$OLD_KIT")
for kit in "${kits[@]}"; do
    for sharing in shared isolated; do
        "$kit/cumux" serve --device cuda --sharing "$sharing" --listen "unix:$W/s.sock" >"$W/server.log" 2>&1 &
        server=$!
        for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
        for size in $SIZES; do
            for r in $(seq "$ROUNDS"); do
                "$kit/cumux" run --server "unix:$W/s.sock" --tenant a -- "$W/leftover" leave "$size" >/dev/null 2>&1
                found=$("$kit/cumux" run --server "unix:$W/s.sock" --tenant b -- "$W/leftover" find "$size" 2>&1 | tail -1)
                echo "$(head -1 "$kit/COMMIT" 2>/dev/null) $sharing $size round $r: $found" | tee -a "$REPORT"
            done
        done
        kill "$server"
        wait "$server" 2>/dev/null
        rm -f "$W/s.sock"
    done
done
rm -rf "$W"
