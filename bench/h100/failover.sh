#!/usr/bin/env bash
# Issue 17 on GPUs: a device that fails while a program runs on it.
# `cumux serve --device cuda --on-device-failure migrate-to-cpu`:
# tests/cuda/driver/migrate_loop.cu (PTX and sm_90; it checks its buffer all
# along) runs on GPU 0, `cumux device fail 0` has the server move it to the
# CPU device it keeps in reserve, then a new program asks in; with two GPUs,
# `--on-device-failure migrate` too (the program goes to GPU 1). Writes
# $OUT/failover.txt and the servers' logs.
#
#   OUT=/some/dir bench/h100/failover.sh
# Optional: KIT=, NVCC=, DEVICE= (default cuda; worker-cpu with N=1 for a
# dry run without a GPU), N= (GPUs, default nvidia-smi's count).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-failover}
NVCC=${NVCC:-nvcc}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-failover.XXXXXX)
pids=()
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
trap stop_all EXIT
REPORT=$OUT/failover.txt
: >"$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }
C=$KIT/cumux
DEVICE=${DEVICE:-cuda}
N=${N:-$(nvidia-smi -L | wc -l)}
say "failover $(date -u +%FT%TZ) kit $(cat "$KIT/COMMIT" 2>/dev/null): $N x $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1) ($DEVICE)"
"$NVCC" -O2 -gencode arch=compute_75,code=compute_75 -gencode arch=compute_90,code=sm_90 \
    -o "$W/loop" "$ROOT/tests/cuda/driver/migrate_loop.cu" >"$W/nvcc.log" 2>&1 ||
    { say "nvcc failed: $(cat "$W/nvcc.log")"; exit 1; }
until_line() { # FILE PATTERN SECONDS
    for _ in $(seq $(($3 * 10))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}
progress() { grep -c '^progress' "$1"; }

# POLICY: the server's devices and where the program should land.
run_policy() {
    local policy=$1 want=$2 sock=$W/$1.sock
    "$C" serve --device "$DEVICE" --on-device-failure "$policy" --listen "unix:$sock" \
        >"$OUT/server-$policy.log" 2>&1 &
    local server=$!
    pids+=("$server")
    for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
    local f=$OUT/loop-$policy.txt
    "$C" run --server "unix:$sock" -- "$W/loop" "$W/stop-$policy" >"$f" 2>&1 &
    local p=$!
    until_line "$f" "progress 10" 60 || say "$policy: the program never reached progress 10"
    local t0 t1 where=""
    t0=$(date +%s.%N)
    "$C" device fail 0 --reason "failover.sh" --server "unix:$sock" >"$W/fail.txt" 2>&1
    say "$policy: cumux device fail 0: $(tr '\n' ' ' <"$W/fail.txt")"
    for _ in $(seq 600); do
        where=$("$C" status --server "unix:$sock" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(" ".join(str(s["device"]) for s in d["sessions"] if "loop" in s["program"]))')
        [ "$where" = "$want" ] && break
        sleep 0.1
    done
    t1=$(date +%s.%N)
    local before after
    before=$(progress "$f")
    sleep 3
    after=$(progress "$f")
    say "$policy: the program's session on device ${where:-none} (want $want) $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s after the failure; progress lines $before, 3 s later $after"
    grep -h 'off the failed device' "$OUT/server-$policy.log" | head -1 | sed 's/^.*off the failed device/  server: off the failed device/' | tee -a "$REPORT"
    "$C" status --server "unix:$sock" | grep -E '^(DEVICE|[0-9]+ |device )' | sed 's/^/  status: /' | tee -a "$REPORT"
    local rc
    timeout 120 "$C" run --server "unix:$sock" -- "$W/loop" "$W/stop-new" >"$W/new.txt" 2>&1 &
    local q=$!
    sleep 5
    touch "$W/stop-new"
    wait $q
    rc=$?
    say "$policy: a new program: rc $rc, $(grep -hE '^(PASS|FAIL)|refused|failed' "$W/new.txt" | head -1 | cut -c1-200)"
    touch "$W/stop-$policy"
    wait $p
    say "$policy: the moved program: rc $?, says $(grep -hE '^(PASS|FAIL)' "$f" | tail -1)"
    kill "$server" 2>/dev/null
    wait "$server" 2>/dev/null
    rm -f "$W/stop-new"
}

run_policy migrate-to-cpu "$N"
if [ "$N" -ge 2 ]; then
    run_policy migrate 1
fi
