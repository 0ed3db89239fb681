#!/usr/bin/env bash
# Soak on the GPU machine: TENANTS tenants (default 8) run programs through one
# `cumux serve` for SECS seconds, half of them stock PyTorch
# (pytorch_tenants.py work: matrix products in 2 GiB), half the CUDA corpus
# programs one after another; every KILL_EVERY seconds one running client is
# killed with SIGKILL. Every 10 s it samples the server's memory (RSS, and
# by kind: RssAnon, RssFile, RssShmem), its mappings, open fds and threads,
# its worker processes (how many, their RSS together), its sessions and the
# device's used memory (`cumux status`), and the GPU's used memory
# (nvidia-smi). Quiet points (no sessions, no device memory, the workers
# back to their number at the start) are taken before the first client, at
# half time (the tenants pause for it; QUIET_AT_HALF=0 leaves it out) and at
# the end; `soak_summary.py` then judges each kind: the mean of each half, a
# least-squares slope over the second half, the quiet points against each
# other.
#
# A soak longer than one command outlives the calls that watch it: SEGMENT=start
# builds the programs, starts the server and a driver (both detached, their
# state in $STATE) and watches for WATCH seconds; SEGMENT=watch watches the
# same soak again, up to WATCH seconds or until it ends. The driver runs the
# tenants for SECS seconds in all, then stops them, waits for no sessions and
# no device memory, writes the report and stops the server. Each watch copies
# the report, the samples and the quiet points to $OUT, and the server log's
# tail and the workers' memory at the quiet points in soak-more.tar.xz. SEGMENT=all
# (default) starts and watches until the end.
#
#   OUT=/some/dir SECS=1800 WATCH=560 SEGMENT=start bench/h100/soak.sh
#   OUT=/some/dir WATCH=590 SEGMENT=watch bench/h100/soak.sh
# Optional: KIT=, NVCC=, NVCC_FLAGS=, TENANTS=, KILL_EVERY= (default 20), SERVE_ARGS=
# (default "--sharing shared --policy fair"), STATE= (default /tmp/cumux-soak),
# DEVICE= (default cuda; cpu with SERVE_ARGS="" and PYTORCH=0 for a dry run
# without a GPU, or worker-cpu to run it through worker processes), PYTORCH=
# (default 1: even tenants run PyTorch), PROGRAMS= (the .cu sources to run,
# paths under the checkout; default every corpus program but out_of_bounds;
# e.g. the pinned-memory users of tests/cuda/driver), GPU_INDEX= (serve and sample
# only that GPU, in PCI order, so that other work can use the machine's others).
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
WATCH=${WATCH:-$((SECS + 300))}
QUIET_AT_HALF=${QUIET_AT_HALF:-1}
PROGRAMS=${PROGRAMS:-$(cd "$ROOT" && ls tests/cuda/corpus/*.cu | grep -v '/out_of_bounds\.cu$' | tr '\n' ' ')}
export ROOT KIT NVCC SECS TENANTS KILL_EVERY SERVE_ARGS STATE DEVICE PYTORCH QUIET_AT_HALF PROGRAMS
GPU_INDEX=${GPU_INDEX:-0}
export GPU_INDEX CUDA_DEVICE_ORDER=PCI_BUS_ID
gpu_used() { nvidia-smi -i "$GPU_INDEX" --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; }
mkdir -p "$OUT" "$STATE/bin"
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
SOCK=$STATE/s.sock
REPORT=$STATE/soak.txt
SAMPLES=$STATE/soak-samples.csv
QUIET=$STATE/soak-quiet.csv
say() { echo "$*" | tee -a "$REPORT"; }
# A process's resident memory by kind (KiB): RssAnon,RssFile,RssShmem.
rss_kinds() {
    awk '/^RssAnon:/ { a = $2 } /^RssFile:/ { f = $2 } /^RssShmem:/ { s = $2 }
        END { print a "," f "," s }' "/proc/$1/status" 2>/dev/null
}
# The server's kinds of memory, its mappings and open fds, and its worker
# processes (its children): RssAnon,RssFile,RssShmem,maps,fds,workers, and
# the workers' VmRSS, RssAnon and RssFile summed.
server_kinds() {
    local pid=$1 w n=0 wrss=0 wanon=0 wfile=0 r a f
    for w in $(pgrep -P "$pid"); do
        read -r r a f < <(awk '/^VmRSS:/ { r = $2 } /^RssAnon:/ { a = $2 } /^RssFile:/ { f = $2 }
            END { print r + 0, a + 0, f + 0 }' "/proc/$w/status" 2>/dev/null)
        n=$((n + 1)); wrss=$((wrss + ${r:-0})); wanon=$((wanon + ${a:-0})); wfile=$((wfile + ${f:-0}))
    done
    echo "$(rss_kinds "$pid"),$(wc -l <"/proc/$pid/maps" 2>/dev/null),$(ls "/proc/$pid/fd" 2>/dev/null | wc -l),$n,$wrss,$wanon,$wfile"
}
# Each worker's memory at a quiet point (QUIET-LABEL): its smaps_rollup, and
# its resident memory per mapped file (anonymous ones together), largest first.
worker_maps() {
    local pid=$1 label=$2 w
    for w in $(pgrep -P "$pid"); do
        {
            tr '\0' ' ' <"/proc/$w/cmdline"; echo
            cat "/proc/$w/smaps_rollup"
            python3 -c 'import sys
name, rss = None, {}
for line in open(sys.argv[1]):
    f = line.split()
    if "-" in f[0] and len(f) >= 5:
        name = f[5] if len(f) > 5 else "[anon]"
    elif f[0] == "Rss:":
        rss[name] = rss.get(name, 0) + int(f[1])
for n, kib in sorted(rss.items(), key=lambda t: -t[1])[:25]:
    print(kib, "KiB resident", n)' "/proc/$w/smaps"
        } >"$STATE/quiet-$label-worker-$w.txt" 2>/dev/null
    done
}
# One sample's columns after elapsed_s (the samples' header says which).
sample_row() {
    local pid=$1 rss threads sessions used done_runs kinds
    # Read together, so the total is the sum of its kinds at one moment.
    kinds=$(server_kinds "$pid")
    rss=$(awk -F, '{ print $1 + $2 + $3 }' <<<"$kinds")
    threads=$(ls "/proc/$pid/task" 2>/dev/null | wc -l)
    sessions=$(status_field 'len(j["sessions"])')
    used=$(status_field 'j["devices"][0]["used_mem"]')
    done_runs=$(cat "$STATE"/t*.runs 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
    [ -d "/proc/$pid" ] || rss=gone
    echo "$rss,$threads,$sessions,$used,$(gpu_used),$done_runs,$kinds"
}
workers_of() { pgrep -P "$1" | wc -l; }
# Waits (up to 60 s) for no sessions, no device memory and the workers back
# to their number at the start, then 5 s more for what the server frees
# after; prints yes when it got there.
settle() {
    local pid=$1 want ok=no
    want=$(cat "$STATE/baseline_workers" 2>/dev/null || echo 0)
    for _ in $(seq 600); do
        if [ "$(status_field 'len(j["sessions"])')" = 0 ] &&
            [ "$(status_field 'j["devices"][0]["used_mem"]')" = 0 ] &&
            [ "$(workers_of "$pid")" -le "$want" ]; then
            ok=yes
            break
        fi
        sleep 0.1
    done
    sleep 5
    echo "$ok"
}
status_field() { # status_field PYTHON-EXPRESSION-OVER-j
    "$KIT/cumux" status --json --server "unix:$SOCK" 2>/dev/null |
        python3 -c "import json,sys; j=json.load(sys.stdin); print($1)" 2>/dev/null || echo "?"
}

# Builds the programs and starts the server, both for the driver.
setup() {
    rm -rf "$STATE"
    mkdir -p "$STATE/bin"
    {
        echo "soak, $(date -u +%FT%TZ), kit $(cat "$KIT/COMMIT" 2>/dev/null), $TENANTS tenants for $SECS s, a kill every ${KILL_EVERY} s, serve $SERVE_ARGS"
        nvidia-smi -i "$GPU_INDEX" --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    } >"$REPORT"
    echo "elapsed_s,server_rss_kib,server_threads,sessions,device_used_bytes,gpu_used_mib,runs_done,rss_anon_kib,rss_file_kib,rss_shmem_kib,maps,fds,workers,workers_rss_kib,workers_anon_kib,workers_file_kib" >"$SAMPLES"
    : >"$QUIET"
    # Built as smoke.sh builds them; on a GPU only programs that pass natively stay.
    for rel in $PROGRAMS; do
        src=$ROOT/$rel
        name=$(basename "$src" .cu)
        # shellcheck disable=SC2086 # NVCC_FLAGS is a list of words
        if ! "$NVCC" ${NVCC_FLAGS:-} -I"$(dirname "$src")" -o "$STATE/bin/$name" "$src" 2>/dev/null; then
            say "build failed: $name"
        elif [ "$DEVICE" = cuda ] && ! timeout 60 "$STATE/bin/$name" >/dev/null 2>&1; then
            say "left out (fails natively): $name"
            rm -f "$STATE/bin/$name"
        fi
    done
    say "programs: $(ls "$STATE/bin" | wc -l) CUDA programs$([ "$PYTORCH" = 1 ] && echo ", and PyTorch on even tenants")"
    if [ -z "$(ls "$STATE/bin")" ]; then
        say "no CUDA program built and passing: no soak"
        cp "$REPORT" "$OUT/"
        exit 1
    fi
    gpu_used >"$STATE/gpu_idle_mib"
    printf '[limits]\nsessions = 128\n' >"$STATE/soak.toml"
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=$GPU_INDEX setsid nohup "$KIT/cumux" serve --device "$DEVICE" --config "$STATE/soak.toml" $SERVE_ARGS \
        --listen "unix:$SOCK" >"$STATE/server.log" 2>&1 </dev/null &
    echo $! >"$STATE/server.pid"
    for _ in $(seq 300); do [ -S "$SOCK" ] && break; sleep 0.1; done
    # The server's own workers (a shared context, spares) hold memory too.
    sleep 2
    gpu_used >"$STATE/gpu_served_mib"
    # The baseline quiet point: before any client, the workers it keeps warm started.
    local server
    server=$(cat "$STATE/server.pid")
    sleep 3
    workers_of "$server" >"$STATE/baseline_workers"
    echo "baseline,$(sample_row "$server")" >>"$QUIET"
    worker_maps "$server" baseline
}

tenant() { # tenant I: runs programs until the stop file appears
    local i=$1 runs fails=0 killed=0 rc
    runs=$(cat "$STATE/t$i.runs" 2>/dev/null || echo 0)
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
                case $rc in
                    0) ;;
                    137) killed=$((killed + 1)) ;;
                    *) fails=$((fails + 1)); cp "$STATE/t$i.out" "$STATE/fail-t$i-$runs-$(basename "$b").out" ;;
                esac
                runs=$((runs + 1))
                echo "$runs" >"$STATE/t$i.runs"
            done
            continue
        fi
        runs=$((runs + 1))
        echo "$runs" >"$STATE/t$i.runs"
        case $rc in
            0) ;;
            137) killed=$((killed + 1)) ;;
            *) fails=$((fails + 1)); cp "$STATE/t$i.out" "$STATE/fail-t$i-$runs.out" ;;
        esac
    done
    # Runs counted from the tenant's start (its .runs file); fails and kills from this phase's.
    echo "$i $runs $fails $killed" >"$STATE/t$i.result"
    echo "$fails $killed" >>"$STATE/t$i.phases"
}

# The soak itself, detached from the call that started it: tenants, kills
# and samples for SECS seconds (with a quiet point at half time), then the
# settling, the last quiet point, the report and the server's stop;
# $STATE/done marks its end.
drive() {
    local server started end half kills=0 next_kill next_sample=0 now quiet_half=no
    server=$(cat "$STATE/server.pid")
    started=$(date +%s)
    echo "$started" >"$STATE/started"
    end=$((started + SECS))
    half=$((started + SECS / 2))
    [ "$QUIET_AT_HALF" = 1 ] || quiet_half=skip
    local tenant_pids=()
    start_tenants() {
        rm -f "$STATE/stop"
        tenant_pids=()
        for i in $(seq "$TENANTS"); do
            tenant "$i" &
            tenant_pids+=($!)
        done
    }
    start_tenants
    next_kill=$((started + KILL_EVERY))
    while [ "$(date +%s)" -lt "$end" ]; do
        now=$(date +%s)
        if [ "$now" -ge "$next_sample" ]; then
            echo "$((now - started)),$(sample_row "$server")" >>"$SAMPLES"
            next_sample=$((now + 10))
        fi
        if [ "$now" -ge "$next_kill" ]; then
            # The programs themselves (not `timeout` or `cumux run` around them).
            victim=$(pgrep -f "^python3 $ROOT/bench/h100/pytorch_tenants.py|^$STATE/bin/" | shuf -n 1)
            if [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null; then kills=$((kills + 1)); fi
            next_kill=$((now + KILL_EVERY))
        fi
        if [ "$quiet_half" = no ] && [ "$now" -ge "$half" ]; then
            # The tenants finish what they run, the server frees it, then on again.
            touch "$STATE/stop"
            wait "${tenant_pids[@]}"
            quiet_half=$(settle "$server")
            echo "half,$(sample_row "$server")" >>"$QUIET"
            worker_maps "$server" half
            say "quiet point at $(($(date +%s) - started)) s (settled: $quiet_half)"
            start_tenants
        fi
        kill -0 "$server" 2>/dev/null || break
        sleep 1
    done
    touch "$STATE/stop"
    # The tenants only: the server is not this process's child.
    wait "${tenant_pids[@]}"
    local alive=yes settled runs fails=0 killed=0
    kill -0 "$server" 2>/dev/null || alive=NO
    settled=$(settle "$server")
    echo "end,$(sample_row "$server")" >>"$QUIET"
    worker_maps "$server" end
    runs=$(cat "$STATE"/t*.runs 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
    while read -r f2 k; do
        fails=$((fails + f2)); killed=$((killed + k))
    done < <(cat "$STATE"/t*.phases 2>/dev/null)
    say "soak of $(($(date +%s) - started)) s: runs $runs, failed $fails, killed $killed (kills sent $kills); server alive: $alive, rss $(ps -o rss= -p "$server" 2>/dev/null | tr -d ' ') KiB, threads $(ls "/proc/$server/task" 2>/dev/null | wc -l); afterwards no sessions, no device memory, workers as at the start: $settled; GPU used $(gpu_used) MiB (before the server: $(cat "$STATE/gpu_idle_mib") MiB; served, no session: $(cat "$STATE/gpu_served_mib") MiB)"
    # The first ten failures, each with its last two lines.
    find "$STATE" -maxdepth 1 -name 'fail-*.out' | sort | head -10 | while read -r f; do
        say "  failure $(basename "$f"): $(tail -2 "$f" | tr '\n' ' ')"
    done
    grep -c -E "panicked|ERROR" "$STATE/server.log" | sed 's/^/server log ERROR or panic lines: /' | tee -a "$REPORT"
    python3 "$ROOT/bench/h100/soak_summary.py" "$SAMPLES" "$QUIET" 2>&1 | tee -a "$REPORT"
    kill "$server" 2>/dev/null
    sleep 1
    say "server stopped"
    touch "$STATE/done"
}

# Watches the soak for up to WATCH seconds, or until it ends, and copies
# what it has so far to $OUT.
watch() {
    local until=$(($(date +%s) + WATCH))
    while [ ! -e "$STATE/done" ] && [ "$(date +%s)" -lt "$until" ]; do sleep 2; done
    if [ ! -e "$STATE/done" ]; then
        local started
        started=$(cat "$STATE/started" 2>/dev/null || echo "$(date +%s)")
        echo "watched until the soak's $(($(date +%s) - started)) s; it goes on" | tee -a "$OUT/watch.txt"
        tail -1 "$SAMPLES" | tee -a "$OUT/watch.txt"
    fi
    # Few files (a GPU call brings back at most 8): the report, the samples,
    # the quiet points, and the rest in one archive.
    cp "$REPORT" "$SAMPLES" "$QUIET" "$OUT/" 2>/dev/null
    tail -c 200000 "$STATE/server.log" >"$STATE/soak-server-log-tail.txt" 2>/dev/null
    (cd "$STATE" && tar -cJf "$OUT/soak-more.tar.xz" soak-server-log-tail.txt quiet-*-worker-*.txt 2>/dev/null)
}

case $SEGMENT in
    drive) drive ;;
    start | all)
        setup
        SEGMENT=drive setsid nohup bash "$0" </dev/null >"$STATE/drive.log" 2>&1 &
        watch
        ;;
    watch)
        if [ ! -e "$STATE/started" ]; then
            echo "no soak under $STATE: start one with SEGMENT=start" | tee "$OUT/watch.txt"
            exit 1
        fi
        watch
        ;;
    *) echo "SEGMENT is start, watch, all or drive, not $SEGMENT" >&2; exit 2 ;;
esac
