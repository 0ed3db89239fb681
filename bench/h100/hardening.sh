#!/usr/bin/env bash
# Hardening on the GPU machine: (1) tests/cuda/driver/exit_paths in each mode
# through `cumux run` on NVIDIA's driver: exit code 0, its PASS line, and an
# empty stderr (no panic, no AccessError, no error log); (2) a client killed
# in a synchronize on a kernel that never ends (crates/cli/tests/cuda/
# endless_kernel.cu, `wait-killed`): how long until `cumux status` shows its
# session gone and the GPU's memory back, in `isolated` mode (its worker is
# stopped) and, for the record, in `shared` mode; (3) a session flood held at
# the limits while a program still runs. Writes $OUT/hardening.txt.
#
#   OUT=/some/dir bench/h100/hardening.sh
# Optional: KIT=, NVCC=.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-hardening}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-hardening.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
REPORT=$OUT/hardening.txt
{
    echo "hardening, $(date -u +%FT%TZ), kit $(cat "$KIT/COMMIT" 2>/dev/null)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
} >"$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }

"$NVCC" -O2 -arch=sm_90 -o "$W/exit_paths" "$ROOT/tests/cuda/driver/exit_paths.cu" -lcuda ||
    say "exit_paths: BUILD FAILED"
"$NVCC" -O2 -arch=sm_90 -o "$W/exit_paths_shared" -cudart shared \
    "$ROOT/tests/cuda/driver/exit_paths.cu" -lcuda || say "exit_paths (shared runtime): BUILD FAILED"
"$NVCC" -O2 -arch=sm_90 -o "$W/endless" "$ROOT/crates/cli/tests/cuda/endless_kernel.cu" ||
    say "endless_kernel: BUILD FAILED"
"$NVCC" -O2 -arch=sm_90 -o "$W/vector_add" "$ROOT/tests/cuda/corpus/vector_add.cu" ||
    say "vector_add: BUILD FAILED"

serve() { # serve NAME ARGS...: starts a server on $W/NAME.sock
    local name=$1
    shift
    "$KIT/cumux" serve --device cuda --listen "unix:$W/$name.sock" "$@" >"$W/$name.log" 2>&1 &
    for _ in $(seq 300); do
        [ -S "$W/$name.sock" ] && return 0
        sleep 0.1
    done
    say "server $name did not start"
}
# run_at NAME -- PROGRAM ARGS…: `cumux run` against server NAME (a command
# line, so that `timeout` can run it).
at() { echo "$KIT/cumux run --server unix:$W/$1.sock"; }

# (1) exit paths on NVIDIA's driver, native and through cumux.
serve exit
for bin in exit_paths exit_paths_shared; do
    for mode in live atexit thread-exit key-dtor; do
        timeout 60 "$W/$bin" "$mode" >"$W/n.out" 2>"$W/n.err"
        nrc=$?
        CUMUX_LOG=warn RUST_BACKTRACE=1 timeout 60 $(at exit) -- "$W/$bin" "$mode" \
            >"$W/c.out" 2>"$W/c.err"
        crc=$?
        case $mode in
            live) line="live: queued" ;;
            thread-exit) line="thread-exit: exiting from the second thread" ;;
            atexit) line="atexit: PASS" ;;
            key-dtor) line="thread teardown: PASS" ;;
        esac
        verdict=PASS
        grep -qx "$line" "$W/c.out" || verdict=FAIL
        grep -q FAIL "$W/c.out" && verdict=FAIL
        [ "$crc" = 0 ] || verdict=FAIL
        [ -s "$W/c.err" ] && verdict=FAIL
        say "exit_paths $bin $mode: native rc=$nrc; cumux rc=$crc, stderr $(wc -c <"$W/c.err") bytes: $verdict"
        [ -s "$W/c.err" ] && head -5 "$W/c.err" | sed 's/^/    /' | tee -a "$REPORT"
    done
done
pkill -f "exit.sock" 2>/dev/null
wait 2>/dev/null

# (2) a client killed in a synchronize on an endless kernel.
# In `shared` mode a kernel cannot be stopped without resetting every
# session's context: there the watchdog (--kernel-timeout) frees it.
for sharing in isolated "shared --kernel-timeout 5s"; do
    name=${sharing%% *}
    # shellcheck disable=SC2086
    serve "kill-$name" --sharing $sharing
    $(at "kill-$name") -- "$W/endless" wait-killed >"$W/e.out" 2>&1 &
    for _ in $(seq 300); do
        grep -q launched "$W/e.out" && break
        sleep 0.1
    done
    sleep 0.5
    pid=$(pgrep -f "$W/endless wait-killed" | head -1)
    t0=$(date +%s.%N)
    kill -9 "$pid"
    gone=no
    for _ in $(seq 600); do
        s=$("$KIT/cumux" status --json --server "unix:$W/kill-$name.sock" 2>/dev/null)
        if echo "$s" | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if not d["sessions"] and d["devices"][0]["used_mem"]==0 else 1)'; then
            gone=yes
            break
        fi
        sleep 0.05
    done
    t1=$(date +%s.%N)
    secs=$(python3 -c "print(f'{$t1-$t0:.2f}')")
    stopped=$(grep -c "stopping the worker of a client that hung up" "$W/kill-$name.log")
    say "killed in a synchronize ($sharing): session gone and memory back: $gone after ${secs} s; worker-stop lines: $stopped"
    timeout 60 $(at "kill-$name") -- "$W/vector_add" >"$W/v.out" 2>&1
    say "  next program: rc=$? $(tail -1 "$W/v.out")"
    pkill -f "kill-$name.sock" 2>/dev/null
    sleep 1
done

# (3) a session flood held at the limits, a program still served.
printf '[limits]\nsessions = 64\nsessions_per_peer = 16\n' >"$W/limits.toml"
serve flood --config "$W/limits.toml"
cat >"$W/flood.py" <<'PY'
import socket, sys, time
held = []
for _ in range(200):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    held.append(s)
print(f"flood: {len(held)} silent connections from one process, held 8 s", flush=True)
time.sleep(8)
PY
python3 "$W/flood.py" "$W/flood.sock" >>"$REPORT" 2>&1 &
fpid=$!
sleep 2
"$KIT/cumux" status --server "unix:$W/flood.sock" 2>&1 | grep connections | tee -a "$REPORT"
timeout 120 $(at flood) -- "$W/vector_add" >"$W/v.out" 2>&1
say "flood: a program during the flood: rc=$? $(tail -1 "$W/v.out")"
wait $fpid
say "flood: refusal lines logged: $(grep -c 'connection refused' "$W/flood.log")"
pkill -f "flood.sock" 2>/dev/null
sleep 0.5
say "done"
