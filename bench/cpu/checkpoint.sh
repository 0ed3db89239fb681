#!/usr/bin/env bash
# `cumux checkpoint` and `cumux restore` of a CPU-device session holding
# MIB of device memory (tests/cuda/driver/migrate_loop.cu STOP MIB: a buffer
# set to 0x5a, launches running), A/B between builds, rounds alternating so
# that a busy machine spoils both alike. Each run: a fresh `cumux serve
# --device cpu --memory 3G` on a unix socket, the program, `cumux checkpoint 1
# FILE` (session 1) WAIT seconds after it started; the program stopped (it ends within
# 20,000 launches anyway) and started again (its own 1 GiB set), then
# `cumux restore FILE --session SESSION` into it WAIT seconds later (a rollback: the
# program then fails its own check, as it should, and is stopped).
#
#   KITS="old=/tmp/kit-a new=/tmp/kit-b" bench/cpu/checkpoint.sh
# A kit is a folder with `cumux` and `libcumux_client.so` of one build.
# Optional: ROUNDS= (3), MIB= (1024), WAIT= (3), PROGRAM= (a built
# migrate_loop; else nvcc from .venv builds it), OUT= (/tmp/cumux-ckpt-bench).
# Prints one line per run: seconds and GB/s (MIB MiB over the command's
# wall time) for each, and the file's size.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KITS=${KITS:?KITS="label=DIR label=DIR"}
ROUNDS=${ROUNDS:-3}
MIB=${MIB:-1024}
WAIT=${WAIT:-3}
OUT=${OUT:-/tmp/cumux-ckpt-bench}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-ckpt.XXXXXX)
if [ -n "${PROGRAM:-}" ]; then
    cp "$PROGRAM" "$W/migrate_loop"
else
    NVCC=$(ls "$ROOT"/.venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc | head -1)
    "$NVCC" -L"$(dirname "$NVCC")/../lib" -o "$W/migrate_loop" "$ROOT/tests/cuda/driver/migrate_loop.cu" || exit 1
fi
now() { date +%s.%N; }
run_one() { # label kit round
    local label=$1 kit=$2 round=$3 d="$W/$1-$3"
    mkdir -p "$d"
    "$kit/cumux" serve --device cpu --memory 3G --listen "unix:$d/s.sock" 2>"$d/server.log" &
    local server=$!
    for _ in $(seq 300); do [ -S "$d/s.sock" ] && break; sleep 0.05; done
    "$kit/cumux" run --server "unix:$d/s.sock" -- "$W/migrate_loop" "$d/stop" "$MIB" >"$d/program.log" 2>&1 &
    local program=$!
    sleep "$WAIT"
    local t0 t1 t2 t3 ok_c=ok ok_r=ok
    t0=$(now)
    "$kit/cumux" checkpoint 1 "$d/s.ckpt" --server "unix:$d/s.sock" >"$d/checkpoint.txt" 2>&1 || ok_c=FAILED
    t1=$(now)
    touch "$d/stop"
    wait "$program"
    rm -f "$d/stop"
    "$kit/cumux" run --server "unix:$d/s.sock" -- "$W/migrate_loop" "$d/stop" "$MIB" >"$d/program2.log" 2>&1 &
    program=$!
    sleep "$WAIT"
    local second
    second=$("$kit/cumux" status --json --server "unix:$d/s.sock" | python3 -c '
import json, sys
print([s["session"] for s in json.load(sys.stdin)["sessions"] if s["program"].endswith("migrate_loop")][0])')
    t2=$(now)
    "$kit/cumux" restore "$d/s.ckpt" --session "$second" --server "unix:$d/s.sock" >"$d/restore.txt" 2>&1 || ok_r=FAILED
    t3=$(now)
    touch "$d/stop"
    kill "$program" 2>/dev/null
    kill "$server" 2>/dev/null
    wait "$program" "$server" 2>/dev/null
    local size
    size=$(stat -c %s "$d/s.ckpt" 2>/dev/null || echo 0)
    awk -v l="$label" -v r="$round" -v a="$t0" -v b="$t1" -v c="$t2" -v e="$t3" -v m="$MIB" \
        -v s="$size" -v oc="$ok_c" -v or="$ok_r" 'BEGIN {
        gb = m * 1048576 / 1e9;
        printf "%s round %d: checkpoint %.2f s (%.2f GB/s, %s), restore %.2f s (%.2f GB/s, %s), file %d bytes\n",
            l, r, b - a, gb / (b - a), oc, e - c, gb / (e - c), or, s }' | tee -a "$OUT/runs.txt"
    cp "$d/checkpoint.txt" "$OUT/$label-$round-checkpoint.txt"
    cp "$d/restore.txt" "$OUT/$label-$round-restore.txt"
    cp "$d/server.log" "$OUT/$label-$round-server.log"
    rm -rf "$d"
}
for round in $(seq "$ROUNDS"); do
    for kit in $KITS; do
        run_one "${kit%%=*}" "${kit#*=}" "$round"
    done
done
rm -rf "$W"
