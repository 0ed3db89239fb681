#!/usr/bin/env bash
# The kernel watchdog and scheduled copies on the GPU machine, with real
# programs: a kernel that never ends (crates/cli/tests/cuda/endless_kernel.cu)
# under `--kernel-timeout` in `isolated` mode (its synchronize fails with 702,
# the next program passes) and in `shared` mode (its program killed mid-kernel,
# the context reset, a fresh one for the next program); and a program of copies
# and memsets only (copies_only.cu) under `fair` and `priority`, which the gate
# must see and charge. Writes $OUT/watchdog.txt.
#
#   OUT=/some/dir bench/h100/watchdog.sh
# Optional: KIT=, NVCC=, NVCC_FLAGS=, DEVICE= (default cuda; worker-cpu for a
# dry run, its kernels unbudgeted), TIMEOUT= (default 3s).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-watchdog}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
DEVICE=${DEVICE:-cuda}
TIMEOUT=${TIMEOUT:-3s}
NVCC_FLAGS=${NVCC_FLAGS:-}
EXTRA=()
[ "$DEVICE" = worker-cpu ] && EXTRA=(--launch-budget 0)
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-watchdog.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
for p in endless_kernel copies_only; do
    # shellcheck disable=SC2086 # a flag list
    "$NVCC" -O2 -arch=sm_90 $NVCC_FLAGS -o "$W/$p" "$ROOT/crates/cli/tests/cuda/$p.cu" || exit 1
done
# shellcheck disable=SC2086
"$NVCC" -O2 -arch=sm_90 $NVCC_FLAGS -o "$W/saxpy" "$ROOT/tests/cuda/corpus/saxpy.cu" || exit 1
REPORT=$OUT/watchdog.txt
: >"$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }
CUMUX=$KIT/cumux
SERVER=
serve() {
    local name=$1
    shift
    "$CUMUX" serve --device "$DEVICE" --listen "unix:$W/$name.sock" "${EXTRA[@]}" "$@" >"$OUT/server_$name.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 300); do [ -S "$W/$name.sock" ] && return 0; sleep 0.1; done
    say "server $name never listened"
    return 1
}
stop() { kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; }
run() { timeout 120 "$CUMUX" run --server "unix:$W/$1.sock" "${@:2}"; }
workers() { pgrep -f "cumux worker" | sort | tr '\n' ' '; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

say "# isolated, --kernel-timeout $TIMEOUT"
serve iso --kernel-timeout "$TIMEOUT"
t0=$(now)
run iso -- "$W/endless_kernel" wait >"$W/iso.out" 2>&1
rc=$?
say "endless_kernel wait: rc $rc after $(since "$t0") s: $(tr '\n' ' ' <"$W/iso.out")"
say "next program: $(run iso -- "$W/saxpy" 2>&1 | tail -1)"
say "server log: $(grep -c 'kernel watchdog' "$OUT/server_iso.log") watchdog line(s)"
stop

say "# shared, --kernel-timeout $TIMEOUT"
serve sh --sharing shared --kernel-timeout "$TIMEOUT"
say "first program: $(run sh -- "$W/saxpy" 2>&1 | tail -1); workers: $(workers)"
run sh -- "$W/endless_kernel" hold >"$W/hold.out" 2>&1 &
holder=$!
for _ in $(seq 300); do grep -q launched "$W/hold.out" && break; sleep 0.1; done
t0=$(now)
# The program itself, as a tenant's process is killed.
pkill -9 -f "^$W/endless_kernel hold"
wait "$holder" 2>/dev/null
for _ in $(seq 600); do grep -q 'kernel watchdog' "$OUT/server_sh.log" && break; sleep 0.1; done
say "holder killed mid-kernel; reset $(since "$t0") s later: $(grep -o 'kernel watchdog.*' "$OUT/server_sh.log" | head -1)"
say "next program: $(run sh -- "$W/saxpy" 2>&1 | tail -1); workers: $(workers)"
stop

for policy in fair priority; do
    say "# copies and memsets only, --policy $policy"
    serve "c$policy" --policy "$policy"
    run "c$policy" -- "$W/copies_only" hold >"$W/copies_$policy.out" 2>&1 &
    copier=$!
    for _ in $(seq 300); do grep -q holding "$W/copies_$policy.out" && break; sleep 0.1; done
    "$CUMUX" status --json --server "unix:$W/c$policy.sock" >"$W/status.json"
    pkill -9 -f "^$W/copies_only hold"
    wait "$copier" 2>/dev/null
    say "$(head -1 "$W/copies_$policy.out"); $(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
d, t = j["devices"][0], j["tenants"][0]
print("signalled_launches %d, tenant gpu_time_ms %.3f" % (d["signalled_launches"], t["gpu_time_ms"]))
' "$W/status.json")"
    stop
done
rm -rf "$W"
