#!/usr/bin/env bash
# Issue 24's copies over a network with lanes: 256 MiB host<->device copies
# (bench/cuda/microbench.cu `bandwidth`, pageable and pinned) natively and
# through cumux over TLS with CUMUX_LANES=0 (one connection) and each count in
# LANES, behind cumux-netem (0.5 ms at GBIT and SLOW_GBIT: one link that all
# of a relay's connections share) and over loopback with no relay (TLS and
# plain TCP), in alternating rounds; beside them the bare TCP streams on the
# same paths, one and as many as the lanes (bench/h100/link_probe.py).
#
# On the GPU machine (device tool), from the repo root, with the kit of this
# commit in device-kit/main (cumux, libcumux_client.so, cumux-netem), ~6 min:
#   run(command="KIT=device-kit/main OUT=$OUT bench/h100/lanes.sh",
#       carry=["device-kit/main"], timeout_s=600)
# Optional: LANES= ("4 8"), ROUNDS= (2), GBIT= (100), SLOW_GBIT= (10), SECONDS_EACH=
# (microbench seconds per size, 0.3), BW_MAX= (268435456), BUDGET= (480 s),
# NVCC=, NVCC_FLAGS=, DEVICE= (cuda; cpu runs the plumbing here, no native column).
# Writes $OUT/lanes.txt and $OUT/DATE-GPU-lanes.json.
set -u
START=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit/main}
OUT=${OUT:-/tmp/cumux-lanes}
LANES=${LANES:-4 8}
ROUNDS=${ROUNDS:-2}
GBIT=${GBIT:-100}
SLOW_GBIT=${SLOW_GBIT:-10}
SECONDS_EACH=${SECONDS_EACH:-0.3}
BW_MAX=${BW_MAX:-268435456}
BUDGET=${BUDGET:-480}
NVCC=${NVCC:-nvcc}
NVCC_FLAGS=${NVCC_FLAGS:-}
DEVICE=${DEVICE:-cuda}
SIZE=$((BW_MAX >> 20))m
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-lanes.XXXXXX)
RUNS=$W/runs
mkdir -p "$RUNS"
REPORT=$OUT/lanes.txt
: >"$REPORT"
MANIFEST=$W/manifest.tsv
: >"$MANIFEST"
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
say() { echo "$*" | tee -a "$REPORT"; }
elapsed() { echo $(($(date +%s) - START)); }
pids=()
trap stop_all EXIT
describe_machine
say "cumux copies over lanes (issue 24), $(date -u +%FT%TZ): ${GPU:-unknown GPU}, driver ${DRIVER:-?}; kit $KIT ($COMMIT)"
say "lanes: 0 (one connection) and $LANES; $ROUNDS rounds; 0.5 ms at $GBIT and $SLOW_GBIT Gbit/s; loopback TLS and plain"
# shellcheck disable=SC2086 # NVCC_FLAGS is a list of words
if ! "$NVCC" $NVCC_FLAGS -O2 -arch=sm_90 -o "$W/microbench" "$ROOT/bench/cuda/microbench.cu" >"$W/nvcc.log" 2>&1; then
    say "FATAL: nvcc failed: $(tail -2 "$W/nvcc.log")"; exit 1
fi

start_tcp_server tls tcp:0.0.0.0:0 --metrics 127.0.0.1:0 || exit 1
start_tcp_server plain tcp:127.0.0.1:0 --metrics 127.0.0.1:0 || exit 1
most=1
for l in $LANES; do [ "$l" -gt "$most" ] && most=$l; done

say ""
say "--- bare streams (1 and $most at once) ---"
probe() { # NAME NETEM RTT GBIT
    local file=$RUNS/link-$1.txt
    timeout 120 python3 "$ROOT/bench/h100/link_probe.py" "$2" "$3" "$4" 20 1024 "$most" >"$file" 2>&1
    printf 'link\t%s\t%s\n' "$1" "$file" >>"$MANIFEST"
    say "$(printf '%-14s %s' "$1" "$(tr '\n' ' ' <"$file")")"
}
probe loopback - 0 none
probe "0.5ms-${GBIT}g" "$KIT/cumux-netem" 0.5ms "$GBIT"
[ -n "$SLOW_GBIT" ] && probe "0.5ms-${SLOW_GBIT}g" "$KIT/cumux-netem" 0.5ms "$SLOW_GBIT"

# copies NAME LANES PATH: microbench's copies, PATH native | loop-tls |
# loop-plain | relay-GBIT.
copies() {
    local name=$1 lanes=$2 path=$3 rc
    if [ "$(elapsed)" -ge "$BUDGET" ]; then say "$name skipped: $(elapsed) s gone"; return; fi
    case $path in
    native)
        timeout 120 "$W/microbench" bandwidth "$SECONDS_EACH" "$BW_MAX" >"$RUNS/$name.txt" 2>&1 ;;
    loop-plain)
        CUMUX_LANES=$lanes timeout 120 "$KIT/cumux" run --server "tcp:127.0.0.1:$PORT_plain" -- \
            "$W/microbench" bandwidth "$SECONDS_EACH" "$BW_MAX" >"$RUNS/$name.txt" 2>&1 ;;
    loop-tls)
        CUMUX_LANES=$lanes CUMUX_TLS_FINGERPRINT=$PRINT_tls timeout 120 "$KIT/cumux" run \
            --server "tcp:127.0.0.1:$PORT_tls" -- \
            "$W/microbench" bandwidth "$SECONDS_EACH" "$BW_MAX" >"$RUNS/$name.txt" 2>&1 ;;
    relay-*)
        if ! start_relay "$PORT_tls" 0.5 "${path#relay-}"; then say "$name: no relay"; stop_relay; return; fi
        CUMUX_LANES=$lanes CUMUX_TLS_FINGERPRINT=$PRINT_tls timeout 120 "$KIT/cumux" run \
            --server "tcp:$relay_at" -- \
            "$W/microbench" bandwidth "$SECONDS_EACH" "$BW_MAX" >"$RUNS/$name.txt" 2>&1
        rc=$?
        stop_relay
        (exit $rc) ;;
    esac
    rc=$?
    printf 'copies\t%s\t%s\t%s\t%s\t%s\n' "$name" "$lanes" "$path" "$RUNS/$name.txt" "$rc" >>"$MANIFEST"
    say "$(printf '%-26s rc %-3s %s' "$name" "$rc" "$(awk -v s="_${SIZE}_" '$1 == "metric" && index($2, s) { printf "%s %s  ", $2, $3 }' "$RUNS/$name.txt")")"
}

for round in $(seq "$ROUNDS"); do
    say ""
    say "--- round $round ($(elapsed) s) ---"
    [ "$DEVICE" = cuda ] && copies "native-r$round" - native
    for lanes in 0 $LANES; do
        copies "relay${GBIT}-l$lanes-r$round" "$lanes" "relay-$GBIT"
        [ -n "$SLOW_GBIT" ] && copies "relay${SLOW_GBIT}-l$lanes-r$round" "$lanes" "relay-$SLOW_GBIT"
        copies "loop-tls-l$lanes-r$round" "$lanes" loop-tls
        copies "loop-plain-l$lanes-r$round" "$lanes" loop-plain
    done
done

# What the lanes carried, from each server's /metrics.
for name in tls plain; do
    at=$(grep -o 'metrics on http://[^ ;]*' "$W/server-$name.out" | head -1 | sed 's/^metrics on //')
    carried=$(python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "$at" 2>/dev/null |
        awk '/^cumux_lane_bytes_total/ { printf "%s %.3g GB  ", $1, $2 / 1e9 }')
    say "the $name server's lanes carried: ${carried:-nothing (no metrics)}"
done
say ""
python3 "$ROOT/bench/h100/lanes_json.py" "$MANIFEST" "$OUT" "$GPU" "$DRIVER" "$COMMIT" "$GBIT" "$SLOW_GBIT" "$SIZE" "${CUDA:-}" | tee -a "$REPORT"
tar czf "$OUT/lanes-runs.tgz" -C "$W" runs 2>/dev/null
say "done in $(elapsed) s"
