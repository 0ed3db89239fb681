#!/usr/bin/env bash
# Finds which build or setting hangs PyTorch sessions: for each kit in KITS
# (folders that hold `cumux` and `libcumux_client.so`) and each SHARING:POLICY
# in MODES, ROUNDS rounds of 4 concurrent PyTorch sessions; with EXPANDABLE=1
# also one expandable-segments session under `isolated`. A session still
# running after LIMIT s is a hang: every process's threads (state, wchan,
# syscall) and their stacks (STACK, a command taking a pid; else gdb where it
# exists; else the kernel's stacks) are kept with the server's log. Writes
# $OUT/hang-probe.txt, and $OUT/logs.tgz with the dumps (hang-KIT.txt) and the
# server logs.
#
#   KITS="device-kit/main device-kit/vmm" OUT=/some/dir bench/h100/hang_probe.sh
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KITS=${KITS:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-hang}
ROUNDS=${ROUNDS:-3}
LIMIT=${LIMIT:-90}
MODES=${MODES:-shared:fair}
EXPANDABLE=${EXPANDABLE:-0}
STACK=${STACK:-}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-hang.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
REPORT=$OUT/hang-probe.txt
say() { echo "$*" | tee -a "$REPORT"; }

# dump PID...: threads and stacks of each process and its descendants.
dump() {
    local p t
    for p in "$@"; do
        for t in /proc/"$p"/task/*; do
            echo "  $p/$(basename "$t") $(awk '{print $2, $3}' "$t/stat" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null) syscall=$(cut -d' ' -f1 "$t/syscall" 2>/dev/null)"
        done
        if [ -n "$STACK" ]; then
            timeout 30 $STACK "$p" 2>&1 | head -600
        elif command -v gdb >/dev/null; then
            timeout 30 gdb -p "$p" -batch -ex "thread apply all bt 12" 2>/dev/null | grep -E '^(Thread|#)' | head -150
        elif [ -r /proc/"$p"/task ]; then
            for t in /proc/"$p"/task/*; do
                echo "  kernel stack of $(basename "$t"):"
                sed 's/^/    /' "$t/stack" 2>/dev/null | head -8
            done
        fi
    done
}

# session KIT SERVER_SOCK TENANT ENV... -- start one PyTorch session in the
# background; its pid goes to $W/pids.
session() {
    local kit=$1 sock=$2 tenant=$3
    shift 3
    env "$@" "$kit/cumux" run --server "unix:$sock" --tenant "$tenant" -- \
        python3 "$ROOT/bench/h100/pytorch_tenants.py" work 1 3 >"$W/$tenant.out" 2>&1 &
    echo $! >>"$W/pids"
}

# await LABEL DETAIL SERVER_PID: waits up to LIMIT s for $W/pids; on a hang
# dumps everything and kills it.
await() {
    local label=$1 detail=$2 server=$3 start=$SECONDS pid left
    while :; do
        left=0
        for pid in $(cat "$W/pids"); do kill -0 "$pid" 2>/dev/null && left=$((left + 1)); done
        [ "$left" = 0 ] && break
        if [ $((SECONDS - start)) -ge "$LIMIT" ]; then
            say "$label: HANG ($left of $(wc -l <"$W/pids") sessions still running after $LIMIT s)"
            {
                echo "== $label: process tree"
                ps -eo pid,ppid,stat,wchan:24,etimes,args --forest | grep -v ' ps -eo' | grep -E 'cumux|python' | head -80
                echo "== $label: the server ($server) and everything under it"
                dump "$server" $(pgrep -P "$server")
                echo "== $label: each stuck session"
                for pid in $(cat "$W/pids"); do
                    kill -0 "$pid" 2>/dev/null || continue
                    dump "$pid" $(pgrep -P "$pid")
                done
                for f in "$W"/*.out; do echo "== $f"; tail -5 "$f"; done
            } >>"$W/hang-$detail.txt" 2>&1
            for pid in $(cat "$W/pids"); do pkill -9 -P "$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null; done
            : >"$W/pids"
            return 1
        fi
        sleep 1
    done
    say "$label: ok in $((SECONDS - start)) s: $(cat "$W"/*.out | grep -cE '(work|quota): PASS') passed"
    : >"$W/pids"
}

for kit in $KITS; do
    name=$(basename "$kit")
    say "== kit $name ($(cat "$kit/COMMIT" 2>/dev/null))"
    for spec in $MODES; do
        mode=${spec%%:*}
        policy=${spec#*:}
        sock=$W/$name-$mode-$policy.sock
        log=$W/server-$name-$mode-$policy.log
        CUMUX_LOG=${CUMUX_LOG:-info} "$kit/cumux" serve --device cuda --sharing "$mode" --policy "$policy" --listen "unix:$sock" >"$log" 2>&1 &
        server=$!
        for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
        : >"$W/pids"
        for r in $(seq "$ROUNDS"); do
            rm -f "$W"/*.out
            for i in 1 2 3 4; do session "$kit" "$sock" "p$i"; done
            await "$name $mode $policy round $r" "$name" "$server" || break
        done
        if [ "$EXPANDABLE" = 1 ] && [ "$mode" = isolated ]; then
            rm -f "$W"/*.out
            session "$kit" "$sock" x PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
            await "$name $mode $policy expandable" "$name" "$server"
            tail -3 "$W/x.out" | sed 's/^/  /' | tee -a "$REPORT"
        fi
        kill "$server" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$server" 2>/dev/null
        wait "$server" 2>/dev/null
        grep -E 'ERROR|WARN|panick' "$log" | head -30 >>"$W/hang-$name.txt"
    done
done
tar -czf "$OUT/logs.tgz" -C "$W" $(cd "$W" && ls hang-*.txt server-*.log 2>/dev/null)
say done
