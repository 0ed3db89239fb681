#!/usr/bin/env bash
# Issue 17 on GPUs: sessions moved between the GPUs of one `cumux serve
# --device cuda` while they run. tests/cuda/driver/migrate_loop.cu moved back
# and forth and drained (it checks its buffer all along); a deterministic
# PyTorch training run (bench/h100/migrate_train.py) moved every MOVE_EVERY
# seconds, its losses against an unmoved run through cumux and a native one;
# the pause of one move against the session's state (--state-mb); a
# checkpoint's time and size. Writes $OUT/migrate.txt and
# $OUT/DATE-GPU-migrate.json.
#
#   OUT=/some/dir bench/h100/migrate.sh
# Optional: KIT=, NVCC=, STEPS= (training steps, default 300), MOVE_EVERY=
# (seconds, default 0.5), STATES= (extra state in MiB, default "0 1024 4096").
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-migrate}
NVCC=${NVCC:-nvcc}
STEPS=${STEPS:-300}
MOVE_EVERY=${MOVE_EVERY:-0.5}
STATES=${STATES:-0 1024 4096}
mkdir -p "$OUT/runs"
W=$(mktemp -d /tmp/cumux-migrate.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
REPORT=$OUT/migrate.txt
: >"$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }
N=$(nvidia-smi -L | wc -l)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
say "migrate $(date -u +%FT%TZ) kit $(cat "$KIT/COMMIT" 2>/dev/null): $N x $GPU, driver $DRIVER"
[ "$N" -ge 2 ] || { say "needs 2 GPUs"; exit 1; }
C=$KIT/cumux
S=(--server "unix:$W/s.sock")
"$C" serve --device cuda --listen "unix:$W/s.sock" >"$OUT/runs/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
session_of() {
    "$C" status "${S[@]}" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(next((s["session"] for s in d.get("sessions", []) if sys.argv[1] in s.get("program", "")), ""))' "$1"
}
until_line() { # FILE PATTERN SECONDS
    for _ in $(seq $(($3 * 10))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}
moved_ms() { grep -ho 'in [0-9.]*m\?s (' "$1" | sed 's/in //; s/ (//' | awk '/ms$/ { sub("ms", ""); print; next } /s$/ { sub("s", ""); print $1 * 1000 }'; }
median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
max() { sort -n | tail -1; }

# --- a CUDA program with __constant__ and __device__ globals ---
"$NVCC" -O2 -arch=sm_90 -o "$W/migrate_loop" "$ROOT/tests/cuda/driver/migrate_loop.cu" >"$W/nvcc.log" 2>&1 ||
    say "nvcc failed: $(cat "$W/nvcc.log")"
"$C" run "${S[@]}" -- "$W/migrate_loop" "$W/stop" >"$OUT/runs/loop.txt" 2>&1 &
loop=$!
until_line "$OUT/runs/loop.txt" "progress 10" 60
sess=$(session_of migrate_loop)
: >"$OUT/runs/loop-moves.txt"
for i in 1 2 3 4 5 6; do
    "$C" migrate "$sess" --to $((i % 2)) "${S[@]}" >>"$OUT/runs/loop-moves.txt" 2>&1
    sleep 0.2
done
"$C" drain 1 "${S[@]}" >>"$OUT/runs/loop-moves.txt" 2>&1
sleep 0.5
touch "$W/stop"
wait $loop
loop_moves=$(grep -c 'moved from' "$OUT/runs/loop-moves.txt")
loop_result=$(grep -hE '^(PASS|FAIL)' "$OUT/runs/loop.txt" | tail -1)
say "migrate_loop: $loop_moves of 7 moves done, program says ${loop_result:-nothing}"
grep -v 'moved from' "$OUT/runs/loop-moves.txt" | head -3 | sed 's/^/  refused: /' | tee -a "$REPORT"

# --- PyTorch training, moved every MOVE_EVERY s ---
TRAIN=(python3 "$ROOT/bench/h100/migrate_train.py" --steps "$STEPS")
losses() { grep -h '^step [0-9]* loss' "$1"; }
"${TRAIN[@]}" >"$OUT/runs/train-native.txt" 2>&1
"$C" run "${S[@]}" -- "${TRAIN[@]}" >"$OUT/runs/train-still.txt" 2>&1
"$C" run "${S[@]}" -- "${TRAIN[@]}" >"$OUT/runs/train-moved.txt" 2>&1 &
train=$!
until_line "$OUT/runs/train-moved.txt" "^ready" 120
sess=$(session_of python)
: >"$OUT/runs/train-moves.txt"
to=1
while kill -0 $train 2>/dev/null; do
    "$C" migrate "$sess" --to $to "${S[@]}" >>"$OUT/runs/train-moves.txt" 2>&1
    to=$((1 - to))
    sleep "$MOVE_EVERY"
done
wait $train
train_moves=$(grep -c 'moved from' "$OUT/runs/train-moves.txt")
same() { diff <(losses "$1") <(losses "$2") >/dev/null && [ "$(losses "$1" | wc -l)" -eq "$STEPS" ] && echo equal || echo DIFFER; }
vs_still=$(same "$OUT/runs/train-still.txt" "$OUT/runs/train-moved.txt")
vs_native=$(same "$OUT/runs/train-native.txt" "$OUT/runs/train-moved.txt")
pause_med=$(moved_ms "$OUT/runs/train-moves.txt" | median)
pause_max=$(moved_ms "$OUT/runs/train-moves.txt" | max)
say "training: $train_moves moves in $STEPS steps; losses vs unmoved cumux run $vs_still, vs native $vs_native; pause median ${pause_med:-?} ms, max ${pause_max:-?} ms"
grep -v 'moved from' "$OUT/runs/train-moves.txt" | sort | uniq -c | head -3 | sed 's/^/  refused: /' | tee -a "$REPORT"

# --- pause against state size ---
sizes_json=""
for mb in $STATES; do
    f=$OUT/runs/state-$mb.txt
    "$C" run "${S[@]}" -- "${TRAIN[@]}" --steps 400 --state-mb "$mb" >"$f" 2>&1 &
    p=$!
    until_line "$f" "^ready" 120
    sess=$(session_of python)
    sleep 0.3
    "$C" migrate "$sess" --to 1 "${S[@]}" >"$f.moves" 2>&1
    "$C" migrate "$sess" --to 0 "${S[@]}" >>"$f.moves" 2>&1
    wait $p
    bytes=$(grep -ho '([0-9]* bytes' "$f.moves" | head -1 | tr -cd 0-9)
    ms=$(moved_ms "$f.moves" | median)
    ok=$(grep -c '^PASS' "$f")
    say "state +$mb MiB: session ${bytes:-?} bytes, pause ${ms:-?} ms (2 moves), program PASS $ok; $(grep -h 'extra state' "$f")"
    grep -v 'moved from' "$f.moves" | head -2 | sed 's/^/  refused: /' | tee -a "$REPORT"
    sizes_json="$sizes_json{\"name\": \"move_pause_ms_state_${mb}mib\", \"unit\": \"ms\", \"better\": \"lower\", \"native\": null, \"cumux\": ${ms:-null}, \"ratio\": null, \"state_bytes\": ${bytes:-null}},"
done

# --- checkpoint of a training session ---
f=$OUT/runs/ckpt.txt
"$C" run "${S[@]}" -- "${TRAIN[@]}" --steps 200 >"$f" 2>&1 &
p=$!
until_line "$f" "^ready" 120
sess=$(session_of python)
t0=$(date +%s.%N)
"$C" checkpoint "$sess" "$W/train.ckpt" "${S[@]}" >"$f.ckpt" 2>&1
t1=$(date +%s.%N)
wait $p
ckpt_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
say "checkpoint: $(cat "$f.ckpt") ($ckpt_s s)"

cat >"$OUT/$(date -u +%F)-$(echo "$GPU" | tr ' ' '_' | tr -cd 'A-Za-z0-9_-')-migrate.json" <<JSON
{
  "suite": "migrate",
  "date": "$(date -u +%F)",
  "gpu": "$N x $GPU",
  "driver": "$DRIVER",
  "cuda": "$(nvidia-smi | grep -o 'CUDA Version: [0-9.]*' | awk '{ print $3 }')",
  "commit": "$(cat "$KIT/COMMIT" 2>/dev/null)",
  "metrics": [
    {"name": "migrate_loop_moves_done", "unit": "moves", "better": "higher", "native": 7, "cumux": $loop_moves, "ratio": null, "result": "${loop_result:-none}"},
    {"name": "training_moves", "unit": "moves", "better": "higher", "native": null, "cumux": $train_moves, "ratio": null},
    {"name": "training_losses_vs_unmoved", "unit": "", "better": "equal", "native": "reference", "cumux": "$vs_still", "ratio": null},
    {"name": "training_losses_vs_native", "unit": "", "better": "equal", "native": "reference", "cumux": "$vs_native", "ratio": null},
    {"name": "training_move_pause_ms_p50", "unit": "ms", "better": "lower", "native": null, "cumux": ${pause_med:-null}, "ratio": null},
    {"name": "training_move_pause_ms_max", "unit": "ms", "better": "lower", "native": null, "cumux": ${pause_max:-null}, "ratio": null},
    ${sizes_json}
    {"name": "checkpoint_s", "unit": "s", "better": "lower", "native": null, "cumux": $ckpt_s, "ratio": null}
  ]
}
JSON
say "wrote $OUT/*-migrate.json"
