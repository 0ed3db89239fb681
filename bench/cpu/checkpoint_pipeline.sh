#!/usr/bin/env bash
# `cumux checkpoint` of a large session to a file on local disk, synced, A/B
# between builds, rounds alternating so that a busy machine spoils both alike:
# tests/cuda/driver/checkpoint_rollback.cu holding MIB of device memory (half
# noise, half one value, as bench/h100/migrate.sh's disk part), on each of
# DEVICES (cpu: the CPU device in the server; worker-cpu: in a worker
# process, its memory reached by requests as a GPU's is). Each run: a fresh
# `cumux serve --device D --memory M` on a unix socket, the program, `sync`,
# `cumux checkpoint SESSION FILE` (the CLI syncs the file), `sync`; the
# program and server stopped.
#
#   KITS="old=/tmp/kit-a new=/tmp/kit-b" bench/cpu/checkpoint_pipeline.sh
# A kit is a folder with `cumux` and `libcumux_client.so` of one build.
# Optional: ROUNDS= (3), MIB= (2048), DEVICES= ("cpu worker-cpu"), PROGRAM=
# (a built checkpoint_rollback; else nvcc from .venv builds it), DIR= (where
# the file goes, default /tmp), OUT= (/tmp/cumux-ckpt-pipeline).
# Prints one line per run: seconds and GB/s (MIB MiB over the command's wall
# time, sync included), the CPU time the server and its workers spent in it
# (user + system: on a busy machine the steadier figure), the file's size,
# and what the CLI printed (from 2026-11-27's s22-ckpt2 on: the stage split).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KITS=${KITS:?KITS="label=DIR label=DIR"}
ROUNDS=${ROUNDS:-3}
MIB=${MIB:-2048}
DEVICES=${DEVICES:-cpu worker-cpu}
DIR=${DIR:-/tmp}
OUT=${OUT:-/tmp/cumux-ckpt-pipeline}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-ckptp.XXXXXX)
F=$(mktemp -d "$DIR/cumux-ckptp-file.XXXXXX")
trap 'rm -rf "$W" "$F"' EXIT
if [ -n "${PROGRAM:-}" ]; then
    cp "$PROGRAM" "$W/rollback"
else
    NVCC=$(ls "$ROOT"/.venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc | head -1)
    "$NVCC" -L"$(dirname "$NVCC")/../lib" -o "$W/rollback" "$ROOT/tests/cuda/driver/checkpoint_rollback.cu" || exit 1
fi
now() { date +%s.%N; }
until_line() { # FILE PATTERN SECONDS
    for _ in $(seq $(($3 * 10))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}
TICK=$(getconf CLK_TCK)
cpu_ticks() { # PID: CPU ticks (user + system) of it and its children (the workers)
    local sum=0 p
    for p in "$1" $(pgrep -P "$1"); do
        sum=$((sum + $(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "$sum"
}
run_one() { # label kit device round
    local label=$1 kit=$2 device=$3 round=$4 d="$W/$1-$3-$4"
    mkdir -p "$d"
    "$kit/cumux" serve --device "$device" --memory "$((MIB + 512))M" --listen "unix:$d/s.sock" >"$d/server.log" 2>&1 &
    local server=$!
    for _ in $(seq 300); do [ -S "$d/s.sock" ] && break; sleep 0.05; done
    "$kit/cumux" run --server "unix:$d/s.sock" -- "$W/rollback" "$d/rb" "$MIB" >"$d/program.log" 2>&1 &
    local program=$!
    until_line "$d/program.log" "^ready" 300 || echo "$label $device round $round: the program never got ready"
    local session
    session=$("$kit/cumux" status --json --server "unix:$d/s.sock" | python3 -c '
import json, sys
print([s["session"] for s in json.load(sys.stdin)["sessions"] if s["program"].endswith("rollback")][0])')
    sync
    local t0 t1 c0 c1 ok=ok
    c0=$(cpu_ticks "$server")
    t0=$(now)
    "$kit/cumux" checkpoint "$session" "$F/s.ckpt" --server "unix:$d/s.sock" >"$d/checkpoint.txt" 2>&1 || ok=FAILED
    c1=$(cpu_ticks "$server")
    sync
    t1=$(now)
    kill "$program" "$server" 2>/dev/null
    wait "$program" "$server" 2>/dev/null
    local size
    size=$(stat -c %s "$F/s.ckpt" 2>/dev/null || echo 0)
    rm -f "$F/s.ckpt"
    awk -v l="$label" -v dev="$device" -v r="$round" -v a="$t0" -v b="$t1" -v m="$MIB" -v s="$size" \
        -v ok="$ok" -v load="$(cut -d' ' -f1 /proc/loadavg)" -v cpu="$(((c1 - c0) * 100 / TICK))" 'BEGIN {
        gb = m * 1048576 / 1e9;
        printf "%s %s round %d: checkpoint %.2f s (%.2f GB/s, %s), server and worker CPU %.2f s, file %d bytes, load %s\n",
            l, dev, r, b - a, gb / (b - a), ok, cpu / 100, s, load }' | tee -a "$OUT/runs.txt"
    sed 's/^/    /' "$d/checkpoint.txt" | head -3 | tee -a "$OUT/runs.txt"
    cp "$d/server.log" "$OUT/$label-$device-$round-server.log"
    rm -rf "$d"
}
for round in $(seq "$ROUNDS"); do
    for device in $DEVICES; do
        for kit in $KITS; do
            run_one "${kit%%=*}" "${kit#*=}" "$device" "$round"
        done
    done
done
