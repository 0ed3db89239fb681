#!/usr/bin/env bash
# Issue 17 on GPUs: sessions moved between the GPUs of one `cumux serve
# --device cuda` while they run. tests/cuda/driver/migrate_loop.cu moved back
# and forth and drained (it checks its buffer all along); a deterministic
# PyTorch training run (bench/h100/migrate_train.py) moved every MOVE_EVERY
# seconds, its losses against an unmoved run through cumux and a native one;
# the pause of one move against the session's state (--state-mb); a
# checkpoint's time and size; checkpoint and restore of a CK_MB session to
# local disk (tests/cuda/driver/checkpoint_rollback.cu), and NVIDIA's
# cuda-checkpoint on the same program run natively where the machine has it;
# a program moved GPU -> CPU device (a second server) -> GPU. Writes
# $OUT/migrate.txt and $OUT/DATE-GPU-migrate.json.
#
#   OUT=/some/dir bench/h100/migrate.sh
# Optional: KIT=, NVCC=, STEPS= (training steps, default 300), MOVE_EVERY=
# (seconds, default 0.5), STATES= (extra state in MiB, default "0 1024 4096"),
# CK_MB= (the checkpointed session's memory in MiB, default 4096), PARTS=
# (default "loop train states ckpt disk cpu"; loop, train and states need two
# GPUs, the others one), CUDA_CHECKPOINT= (NVIDIA's cuda-checkpoint binary,
# where it is not installed).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-migrate}
NVCC=${NVCC:-nvcc}
STEPS=${STEPS:-300}
MOVE_EVERY=${MOVE_EVERY:-0.5}
STATES=${STATES:-0 1024 4096}
CK_MB=${CK_MB:-4096}
PARTS=${PARTS:-loop train states ckpt disk cpu}
part() { printf ' %s ' $PARTS | grep -qF " $1 "; }
loop_moves=null loop_result=none train_moves=null vs_still=none vs_native=none
pause_med="" pause_max="" ckpt_s=null disk_json="" cpu_json=""
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
# Moves between GPUs need two; checkpoints and the CPU device's round trip one.
if part loop || part train || part states; then
    [ "$N" -ge 2 ] || { say "needs 2 GPUs (PARTS=\"ckpt disk cpu\" runs on one)"; exit 1; }
fi
C=$KIT/cumux
S=(--server "unix:$W/s.sock")
"$C" serve --device cuda --listen "unix:$W/s.sock" >"$OUT/runs/server.log" 2>&1 &
server=$!
cpu_server=""
trap 'kill $server $cpu_server 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
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
moved_ms() { grep -ho 'to device [0-9]* in [0-9.]*m\?s (' "$1" | sed 's/.* in //; s/ (//' | awk '/ms$/ { sub("ms", ""); print; next } /s$/ { sub("s", ""); print $1 * 1000 }'; }
# Each move's time after its work drained (the program's own queued work
# runs on while it drains): the whole move less its drain, in ms.
stopped_ms() {
    python3 -c '
import re, sys
unit = {"ns": 1e-6, "µs": 1e-3, "ms": 1.0, "s": 1e3}
d = r"([0-9.]+)(ns|µs|ms|s)"
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    m = re.search(r"to device [0-9]+ in " + d + r" \(.*?drained in " + d, line)
    if m:
        print(round(float(m[1]) * unit[m[2]] - float(m[3]) * unit[m[4]], 3))' "$1"
}
median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
max() { sort -n | tail -1; }

# --- a CUDA program with __constant__ and __device__ globals ---
"$NVCC" -O2 -arch=sm_90 -o "$W/migrate_loop" "$ROOT/tests/cuda/driver/migrate_loop.cu" >"$W/nvcc.log" 2>&1 ||
    say "nvcc failed: $(cat "$W/nvcc.log")"
if part loop; then
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
grep -ho '([0-9]* bytes;.*' "$OUT/runs/loop-moves.txt" | head -2 | sed 's/^/  move: /' | tee -a "$REPORT"
fi

# --- PyTorch training, moved every MOVE_EVERY s ---
TRAIN=(python3 "$ROOT/bench/h100/migrate_train.py" --steps "$STEPS")
if part train; then
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
stopped_med=$(stopped_ms "$OUT/runs/train-moves.txt" | median)
say "training: $train_moves moves in $STEPS steps; losses vs unmoved cumux run $vs_still, vs native $vs_native; pause median ${pause_med:-?} ms, max ${pause_max:-?} ms; after the drain median ${stopped_med:-?} ms"
grep -v 'moved from' "$OUT/runs/train-moves.txt" | sort | uniq -c | head -3 | sed 's/^/  refused: /' | tee -a "$REPORT"
fi

# --- pause against state size ---
sizes_json=""
part states || STATES=""
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
    stopped=$(stopped_ms "$f.moves" | median)
    ok=$(grep -c '^PASS' "$f")
    say "state +$mb MiB: session ${bytes:-?} bytes, pause ${ms:-?} ms, after the drain ${stopped:-?} ms (medians of 2 moves), program PASS $ok; $(grep -h 'extra state' "$f")"
    grep -v 'moved from' "$f.moves" | head -2 | sed 's/^/  refused: /' | tee -a "$REPORT"
    grep -ho 'drained in.*' "$f.moves" | head -2 | sed 's/^/  move: /' | tee -a "$REPORT"
    sizes_json="$sizes_json{\"name\": \"move_pause_ms_state_${mb}mib\", \"unit\": \"ms\", \"better\": \"lower\", \"native\": null, \"cumux\": ${ms:-null}, \"ratio\": null, \"state_bytes\": ${bytes:-null}, \"after_drain_ms\": ${stopped:-null}},"
done

# --- checkpoint of a training session ---
if part ckpt; then
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
fi

secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
gbps() { awk -v m="$1" -v s="$2" 'BEGIN { if (s > 0) printf "%.2f", m * 1048576 / s / 1e9; else print "null" }'; }

# --- checkpoint and restore to local disk, CK_MB of state; cuda-checkpoint beside ---
if part disk; then
"$NVCC" -O2 -arch=sm_90 -o "$W/rollback" "$ROOT/tests/cuda/driver/checkpoint_rollback.cu" >"$W/nvcc2.log" 2>&1 ||
    say "nvcc failed: $(cat "$W/nvcc2.log")"
f=$OUT/runs/disk.txt
"$C" run "${S[@]}" -- "$W/rollback" "$W/rb" "$CK_MB" >"$f" 2>&1 &
p=$!
until_line "$f" "^ready" 120
sess=$(session_of rollback)
sync
t0=$(date +%s.%N)
"$C" checkpoint "$sess" "$W/disk.ckpt" "${S[@]}" >"$f.ckpt" 2>&1
sync
t1=$(date +%s.%N)
touch "$W/rb.taken"
until_line "$f" "^changed" 60
t2=$(date +%s.%N)
"$C" restore "$W/disk.ckpt" --session "$sess" "${S[@]}" >"$f.restore" 2>&1
t3=$(date +%s.%N)
touch "$W/rb.restored"
wait $p
ck=$(secs "$t0" "$t1") rs=$(secs "$t2" "$t3")
file_bytes=$(stat -c %s "$W/disk.ckpt" 2>/dev/null || echo 0)
rm -f "$W/disk.ckpt"
result=$(grep -hE '^(PASS|FAIL)' "$f" | tail -1)
say "disk: $CK_MB MiB session (half noise, half one value): checkpoint $ck s ($(gbps "$CK_MB" "$ck") GB/s, file $file_bytes bytes, synced), restore $rs s ($(gbps "$CK_MB" "$rs") GB/s); program says ${result:-nothing}"
sed 's/^/  checkpoint: /' "$f.ckpt" | head -2 | tee -a "$REPORT"
sed 's/^/  restore: /' "$f.restore" | head -2 | tee -a "$REPORT"
disk_json="{\"name\": \"checkpoint_disk_gbps_${CK_MB}mib\", \"unit\": \"GB/s\", \"better\": \"higher\", \"native\": null, \"cumux\": $(gbps "$CK_MB" "$ck"), \"ratio\": null}, {\"name\": \"restore_disk_gbps_${CK_MB}mib\", \"unit\": \"GB/s\", \"better\": \"higher\", \"native\": null, \"cumux\": $(gbps "$CK_MB" "$rs"), \"ratio\": null},"
# The server's stage split (from 2026-11-27's s22-ckpt2 on): seconds its
# writing thread waited on device reads and on packing, wrote, synced; the
# device side's and the pool's busy seconds; the pool's threads.
stages=$(grep -o '(waiting on device reads [^)]*)' "$f.ckpt" | head -1)
say "  checkpoint stage split: ${stages:-not printed by this build}"
if [ -n "$stages" ]; then
    disk_json="$disk_json$(echo "$stages" | tr '(),;' '    ' | awk '{
        n = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) v[++n] = $i
        split("wait_reads wait_packing writing syncing device_busy pool_busy", names, " ")
        for (i = 1; i <= 6; i++)
            printf " {\"name\": \"checkpoint_%s_s\", \"unit\": \"s\", \"better\": \"lower\", \"native\": null, \"cumux\": %s, \"ratio\": null},", names[i], v[i]
    }')"
fi
# NVIDIA's cuda-checkpoint: the same program run natively, its device
# memory suspended into the process's host memory and brought back.
# CUDA_CHECKPOINT= names the binary where it is not installed.
CC=${CUDA_CHECKPOINT:-$(command -v cuda-checkpoint || ls /usr/local/cuda/bin/cuda-checkpoint /usr/bin/cuda-checkpoint 2>/dev/null | head -1)}
if [ -n "$CC" ]; then
    rm -f "$W/rn.taken" "$W/rn.restored"
    "$W/rollback" "$W/rn" "$CK_MB" >"$OUT/runs/native-cc.txt" 2>&1 &
    p=$!
    until_line "$OUT/runs/native-cc.txt" "^ready" 120
    t0=$(date +%s.%N); "$CC" --toggle --pid $p >"$OUT/runs/cc.txt" 2>&1; t1=$(date +%s.%N)
    "$CC" --toggle --pid $p >>"$OUT/runs/cc.txt" 2>&1; t2=$(date +%s.%N)
    touch "$W/rn.taken"; until_line "$OUT/runs/native-cc.txt" "^changed" 60; touch "$W/rn.restored"
    wait $p
    say "cuda-checkpoint ($CC) on the native program: suspend $(secs "$t0" "$t1") s ($(gbps "$CK_MB" "$(secs "$t0" "$t1")") GB/s, into host memory, not a file), resume $(secs "$t1" "$t2") s; $(tr '\n' ' ' <"$OUT/runs/cc.txt" | cut -c1-200)"
else
    say "cuda-checkpoint: not on this machine (looked in PATH, /usr/local/cuda/bin, /usr/bin)"
fi
fi

# --- GPU -> CPU device (a second server) -> GPU ---
if part cpu; then
"$NVCC" -O2 -gencode arch=compute_75,code=compute_75 -gencode arch=compute_90,code=sm_90 \
    -o "$W/loop_ptx" "$ROOT/tests/cuda/driver/migrate_loop.cu" >"$W/nvcc3.log" 2>&1 ||
    say "nvcc failed: $(cat "$W/nvcc3.log")"
"$C" serve --device cpu --listen "unix:$W/cpu.sock" >"$OUT/runs/cpu-server.log" 2>&1 &
cpu_server=$!
for _ in $(seq 300); do [ -S "$W/cpu.sock" ] && break; sleep 0.1; done
f=$OUT/runs/gpu-cpu-gpu.txt
CUMUX_RESUME=1 "$C" run "${S[@]}" -- "$W/loop_ptx" "$W/stop3" >"$f" 2>&1 &
p=$!
until_line "$f" "progress 10" 60
sess=$(session_of loop_ptx)
: >"$f.moves"
"$C" migrate "$sess" --to "unix:$W/cpu.sock" "${S[@]}" >>"$f.moves" 2>&1
sleep 2
on_cpu=$("$C" status --server "unix:$W/cpu.sock" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(next((s["session"] for s in d.get("sessions", []) if "loop_ptx" in s.get("program", "")), ""))')
"$C" migrate "${on_cpu:-0}" --to "unix:$W/s.sock" --server "unix:$W/cpu.sock" >>"$f.moves" 2>&1
sleep 1
touch "$W/stop3"
wait $p
result=$(grep -hE '^(PASS|FAIL)' "$f" | tail -1)
moved=$(grep -c 'moved to the server' "$f.moves")
say "GPU -> CPU device -> GPU: $moved of 2 moves, session on the CPU server: ${on_cpu:-none}; program says ${result:-nothing}"
sed 's/^/  /' "$f.moves" | head -4 | tee -a "$REPORT"
grep -h 'FAIL' "$f" | head -2 | sed 's/^/  /' | tee -a "$REPORT"
cpu_json="{\"name\": \"gpu_cpu_gpu_moves\", \"unit\": \"moves\", \"better\": \"higher\", \"native\": 2, \"cumux\": $moved, \"ratio\": null, \"result\": \"${result:-none}\"},"
fi

cat >"$OUT/$(date -u +%F)-$(echo "$GPU" | tr ' ' '_' | tr -cd 'A-Za-z0-9_-')-migrate.json" <<JSON
{
  "suite": "migrate",
  "date": "$(date -u +%F)",
  "gpu": "$N x $GPU",
  "driver": "$DRIVER",
  "cuda": "$(nvidia-smi | grep -o 'CUDA Version: [0-9.]*' | awk '{ print $3 }')",
  "commit": "$(cat "$KIT/COMMIT" 2>/dev/null)",
  "metrics": [
    {"name": "migrate_loop_moves_done", "unit": "moves", "better": "higher", "native": 7, "cumux": ${loop_moves}, "ratio": null, "result": "${loop_result:-none}"},
    {"name": "training_moves", "unit": "moves", "better": "higher", "native": null, "cumux": $train_moves, "ratio": null},
    {"name": "training_losses_vs_unmoved", "unit": "", "better": "equal", "native": "reference", "cumux": "$vs_still", "ratio": null},
    {"name": "training_losses_vs_native", "unit": "", "better": "equal", "native": "reference", "cumux": "$vs_native", "ratio": null},
    {"name": "training_move_pause_ms_p50", "unit": "ms", "better": "lower", "native": null, "cumux": ${pause_med:-null}, "ratio": null},
    {"name": "training_move_pause_ms_max", "unit": "ms", "better": "lower", "native": null, "cumux": ${pause_max:-null}, "ratio": null},
    ${sizes_json}
    ${disk_json}
    ${cpu_json}
    {"name": "checkpoint_s", "unit": "s", "better": "lower", "native": null, "cumux": $ckpt_s, "ratio": null}
  ]
}
JSON
say "wrote $OUT/*-migrate.json"
