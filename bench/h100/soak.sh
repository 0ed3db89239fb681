#!/usr/bin/env bash
# Soak on the GPU machine: TENANTS tenants (default 8) run programs through one
# `cumux serve` for SECS seconds, half of them stock PyTorch
# (pytorch_tenants.py work: matrix products in 2 GiB), half the CUDA corpus
# programs one after another; every KILL_EVERY seconds one running client is
# killed with SIGKILL. Every 10 s it samples the server's memory (RSS) and
# threads, its sessions and the device's used memory (`cumux status`), and
# the GPU's used memory (nvidia-smi). When the segment ends, the tenants stop
# and it waits for no sessions and no device memory.
#
# A soak longer than one command runs in segments over one server:
# SEGMENT=start starts the server (detached; its state in $STATE) and runs a
# segment, SEGMENT=continue runs another over the same server, SEGMENT=finish
# runs the last and stops it; SEGMENT=all (default) does start and finish in
# one. Each segment appends to $OUT/soak.txt and $OUT/soak-samples.csv (copy
# them between segments: each call's $OUT is fresh, so they also live in
# $STATE).
#
#   OUT=/some/dir SECS=540 SEGMENT=start bench/h100/soak.sh
# Optional: KIT=, NVCC=, TENANTS=, KILL_EVERY= (default 20), SERVE_ARGS=
# (default "--sharing shared --policy fair"), STATE= (default /tmp/cumux-soak),
# DEVICE= (default cuda; cpu with SERVE_ARGS="" and PYTORCH=0 for a dry run
# without a GPU), PYTORCH= (default 1: even tenants run PyTorch).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-soak-out}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
SECS=${SECS:-300}
TENANTS=${TENANTS:-8}
KILL_EVERY=${KILL_EVERY:-20}
SEGMENT=${SEGMENT:-all}
SERVE_ARGS=${SERVE_ARGS---sharing shared --policy fair}
STATE=${STATE:-/tmp/cumux-soak}
DEVICE=${DEVICE:-cuda}
PYTORCH=${PYTORCH:-1}
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; }
mkdir -p "$OUT" "$STATE/bin"
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
SOCK=$STATE/s.sock
REPORT=$STATE/soak.txt
SAMPLES=$STATE/soak-samples.csv
say() { echo "$*" | tee -a "$REPORT"; }
status_field() { # status_field PYTHON-EXPRESSION-OVER-j
    "$KIT/cumux" status --json --server "unix:$SOCK" 2>/dev/null |
        python3 -c "import json,sys; j=json.load(sys.stdin); print($1)" 2>/dev/null || echo "?"
}

if [ "$SEGMENT" = start ] || [ "$SEGMENT" = all ]; then
    rm -f "$REPORT" "$SAMPLES" "$STATE"/*.pid "$SOCK"
    {
        echo "soak, $(date -u +%FT%TZ), kit $(cat "$KIT/COMMIT" 2>/dev/null), $TENANTS tenants, a kill every ${KILL_EVERY} s, serve $SERVE_ARGS"
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    } >"$REPORT"
    echo "elapsed_s,segment,server_rss_kib,server_threads,sessions,device_used_bytes,gpu_used_mib" >"$SAMPLES"
    for src in "$ROOT"/tests/cuda/corpus/*.cu; do
        name=$(basename "$src" .cu)
        [ "$name" = out_of_bounds ] && continue
        "$NVCC" -O2 ${NVCC_ARCH:--arch=sm_90} -I"$ROOT/tests/cuda/corpus" -o "$STATE/bin/$name" "$src" 2>/dev/null ||
            say "build failed: $name"
    done
    printf '[limits]\nsessions = 128\n' >"$STATE/soak.toml"
    # shellcheck disable=SC2086
    setsid nohup "$KIT/cumux" serve --device "$DEVICE" --config "$STATE/soak.toml" $SERVE_ARGS \
        --listen "unix:$SOCK" >"$STATE/server.log" 2>&1 </dev/null &
    echo $! >"$STATE/server.pid"
    date +%s >"$STATE/started"
    for _ in $(seq 300); do [ -S "$SOCK" ] && break; sleep 0.1; done
    gpu_used >"$STATE/gpu_idle_mib"
fi
SERVER=$(cat "$STATE/server.pid")
STARTED=$(cat "$STATE/started")
if ! kill -0 "$SERVER" 2>/dev/null; then
    say "segment $SEGMENT: the server (pid $SERVER) is not running at the segment's start"
    cp "$REPORT" "$SAMPLES" "$OUT/" 2>/dev/null
    exit 1
fi

end=$(($(date +%s) + SECS))
rm -f "$STATE/stop"
tenant() { # tenant I: runs programs until the stop file appears
    local i=$1 runs=0 fails=0 killed=0 rc
    while [ ! -e "$STATE/stop" ]; do
        if [ "$PYTORCH" = 1 ] && [ $((i % 2)) = 0 ]; then
            timeout 120 "$KIT/cumux" run --server "unix:$SOCK" --tenant "t$i" -- \
                python3 "$ROOT/bench/h100/pytorch_tenants.py" work 2 15 >"$STATE/t$i.out" 2>&1
            rc=$?
        else
            rc=0
            for b in "$STATE"/bin/*; do
                [ -e "$STATE/stop" ] && break
                timeout 60 "$KIT/cumux" run --server "unix:$SOCK" --tenant "t$i" -- "$b" \
                    >"$STATE/t$i.out" 2>&1
                rc=$?
                [ $rc = 0 ] || break
            done
        fi
        runs=$((runs + 1))
        case $rc in
            0) ;;
            137) killed=$((killed + 1)) ;;
            *) fails=$((fails + 1)); cp "$STATE/t$i.out" "$STATE/fail-t$i-$runs.out" ;;
        esac
    done
    echo "$i $runs $fails $killed" >"$STATE/t$i.result"
}
tenant_pids=()
for i in $(seq "$TENANTS"); do
    tenant "$i" &
    tenant_pids+=($!)
done
kills=0
next_kill=$(($(date +%s) + KILL_EVERY))
next_sample=0
while [ "$(date +%s)" -lt "$end" ]; do
    now=$(date +%s)
    if [ "$now" -ge "$next_sample" ]; then
        rss=$(ps -o rss= -p "$SERVER" 2>/dev/null | tr -d ' ')
        threads=$(ls "/proc/$SERVER/task" 2>/dev/null | wc -l)
        sessions=$(status_field 'len(j["sessions"])')
        used=$(status_field 'j["devices"][0]["used_mem"]')
        gpu=$(gpu_used)
        echo "$((now - STARTED)),$SEGMENT,${rss:-gone},$threads,$sessions,$used,$gpu" >>"$SAMPLES"
        next_sample=$((now + 10))
    fi
    if [ "$now" -ge "$next_kill" ]; then
        # The programs themselves (not `timeout` or `cumux run` around them).
        victim=$(pgrep -f "^python3 $ROOT/bench/h100/pytorch_tenants.py|^$STATE/bin/" | shuf -n 1)
        if [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null; then kills=$((kills + 1)); fi
        next_kill=$((now + KILL_EVERY))
    fi
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 1
done
touch "$STATE/stop"
# The tenants only: the server is a child of the segment that started it.
wait "${tenant_pids[@]}"
alive=yes
kill -0 "$SERVER" 2>/dev/null || alive=NO
settled=no
for _ in $(seq 300); do
    if [ "$(status_field 'len(j["sessions"])')" = 0 ] && [ "$(status_field 'j["devices"][0]["used_mem"]')" = 0 ]; then
        settled=yes
        break
    fi
    sleep 0.1
done
runs=0 fails=0 killed=0
for f in "$STATE"/t*.result; do
    read -r _ r f2 k <"$f"
    runs=$((runs + r)); fails=$((fails + f2)); killed=$((killed + k))
done
rss=$(ps -o rss= -p "$SERVER" 2>/dev/null | tr -d ' ')
say "segment $SEGMENT, ${SECS} s (soak at $(($(date +%s) - STARTED)) s): runs $runs, failed $fails, killed $killed (kills sent $kills); server alive: $alive, rss ${rss:-?} KiB, threads $(ls "/proc/$SERVER/task" 2>/dev/null | wc -l); afterwards no sessions and no device memory: $settled; GPU used $(gpu_used) MiB (idle before: $(cat "$STATE/gpu_idle_mib") MiB)"
for f in "$STATE"/fail-*.out; do
    [ -e "$f" ] || continue
    say "  failure $(basename "$f"): $(tail -2 "$f" | tr '\n' ' ')"
done
rm -f "$STATE"/fail-*.out "$STATE"/t*.result
grep -c -E "panicked|ERROR" "$STATE/server.log" | sed 's/^/server log ERROR or panic lines: /' | tee -a "$REPORT"
if [ "$SEGMENT" = finish ] || [ "$SEGMENT" = all ]; then
    kill "$SERVER" 2>/dev/null
    sleep 1
    say "server stopped"
fi
cp "$REPORT" "$SAMPLES" "$OUT/"
tail -c 200000 "$STATE/server.log" >"$OUT/soak-server-log-tail.txt"
