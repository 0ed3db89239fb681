#!/usr/bin/env bash
# Issue 24's remote-GPU benchmarks on one GPU: a GPT-2-small training step natively
# and through cumux over TLS behind cumux-netem at several RTTs, its round trips, start-up, copies, TLS cost.
#
# On the GPU machine (device tool), from the repo root, with the kit of this
# commit in device-kit/main (cumux, libcumux_client.so, cumux-netem), about 6 min:
#   run(command="KIT=device-kit/main OUT=$OUT bench/h100/remote.sh",
#       carry=["device-kit/main"], timeout_s=600)
# Trim with RTTS="0.5 30" (ms), STEPS_SLOW=6, TLS_ROUNDS=1, BW=0 if a run is tight.
#
# What it does, each part skipped with a line saying why when it cannot run:
# - link probes: each emulated link's real round trip (1-byte pings) and a bare
#   TCP stream's GB/s through it (bench/h100/link_probe.py);
# - the step (bench/h100/remote_step.py: 124 M parameters, batch 8 x 1024,
#   bf16 autocast, AdamW, one loss.item() a step) natively, then through
#   `cumux run` to a TLS server (`--listen tcp:0.0.0.0:0`, self-signed, pinned
#   by CUMUX_TLS_FINGERPRINT) behind cumux-netem at each RTT in RTTS and GBIT,
#   and at 0.5 ms and SLOW_GBIT; the client's hop trace (CUMUX_HOP_TRACE)
#   counts the round trips a step costs and those of start-up (`import torch`
#   to the first step's loss), by phase and by call;
# - TLS against plain TCP (a second server on loopback) at 0.5 ms, TLS_ROUNDS
#   alternating rounds;
# - 256 MiB host<->device copies (bench/cuda/microbench.cu `bandwidth`, pinned
#   and pageable) natively, over TLS at 0.5 ms and GBIT / SLOW_GBIT, and over
#   plain loopback TCP with no relay, against the link's rate and a bare
#   TCP stream on the same path.
# Writes $OUT/remote.txt, $OUT/DATE-GPU-remote.json, $OUT/remote-runs.tgz
# (each run's output). DEVICE=cpu runs the same plumbing on cumux's CPU device
# with bench/h100/remote_step.cu instead of PyTorch (no native column).
#
# Optional: KIT=, NVCC=, NVCC_FLAGS=, DEVICE=, RTTS= (ms, default "0.05 0.5 5 30"),
# GBIT= (100), SLOW_GBIT= (10; empty: skip), STEPS= (30), WARMUP= (5),
# STEPS_SLOW= / WARMUP_SLOW= (10 / 2, at RTTs over 5 ms), BATCH= (8), CTX= (1024),
# TLS_ROUNDS= (2), BW= (1; 0 skips the copies), BW_MAX= (bytes, 268435456),
# BUDGET= (seconds after which no new run starts, 450), HARD= (seconds by
# which every run has ended, 540), RUN_LIMIT= (seconds one run may take, 300),
# CUMUX_REAL_LIBCUDA=.
set -u
START=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ -z "${KIT:-}" ]; then
    KIT=$ROOT/device-kit/main
    [ -x "$KIT/cumux" ] || KIT=$ROOT/device-kit
fi
OUT=${OUT:-/tmp/cumux-remote}
DEVICE=${DEVICE:-cuda}
RTTS=${RTTS:-0.05 0.5 5 30}
GBIT=${GBIT:-100}
SLOW_GBIT=${SLOW_GBIT-10}
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-5}
STEPS_SLOW=${STEPS_SLOW:-10}
WARMUP_SLOW=${WARMUP_SLOW:-2}
BATCH=${BATCH:-8}
CTX=${CTX:-1024}
TLS_ROUNDS=${TLS_ROUNDS:-2}
BW=${BW:-1}
BUDGET=${BUDGET:-450}
HARD=${HARD:-540}
RUN_LIMIT=${RUN_LIMIT:-300}
if [ -z "${NVCC:-}" ]; then
    NVCC=nvcc
    [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
fi
NVCC_FLAGS=${NVCC_FLAGS:-}
if [ "$DEVICE" = cpu ]; then BW_MAX=${BW_MAX:-16777216}; else BW_MAX=${BW_MAX:-268435456}; fi

mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-remote.XXXXXX)
RUNS=$W/runs
mkdir -p "$RUNS"
REPORT=$OUT/remote.txt
MANIFEST=$W/manifest.tsv
: >"$REPORT"
: >"$MANIFEST"
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
say() { echo "$*" | tee -a "$REPORT"; }
note() { say "note: $*"; printf 'note\t%s\n' "$*" >>"$MANIFEST"; }
elapsed() { echo $(($(date +%s) - START)); }
# Seconds a run may take: what is left before HARD, less 20 for the report,
# and at most RUN_LIMIT.
left() {
    local l=$((HARD - $(elapsed) - 20))
    [ "$l" -gt "$RUN_LIMIT" ] && l=$RUN_LIMIT
    echo "$l"
}
pids=()
trap stop_all EXIT
describe_machine
say "cumux remote benchmarks (issue 24), $(date -u +%FT%TZ): ${GPU:-unknown GPU}, driver ${DRIVER:-?}; kit $KIT ($COMMIT)"
say "RTTs ${RTTS} ms at $GBIT Gbit/s (and 0.5 ms at ${SLOW_GBIT:-none}); steps $STEPS (+$WARMUP warm-up), $STEPS_SLOW over 5 ms; TLS rounds $TLS_ROUNDS; budget ${BUDGET}s"
for f in cumux libcumux_client.so cumux-netem; do
    [ -e "$KIT/$f" ] || { say "FATAL: $KIT/$f is missing"; exit 1; }
done

# --- the step program: PyTorch, or the CUDA stand-in ---
PROGRAM=gpt2
if [ "$DEVICE" = cuda ] && python3 -c 'import torch' 2>/dev/null; then
    step_cmd() { echo python3 "$ROOT/bench/h100/remote_step.py" "$1" "$2" "$BATCH" "$CTX"; }
else
    if [ "$DEVICE" = cuda ]; then
        note "python3 cannot import torch: the CUDA stand-in (remote_step.cu) replaces the GPT-2 step"
    else
        note "DEVICE=$DEVICE: the CUDA stand-in (remote_step.cu) replaces the GPT-2 step; no native runs"
    fi
    PROGRAM=cuda_step
    # shellcheck disable=SC2086 # NVCC_FLAGS is a list of words
    if ! "$NVCC" $NVCC_FLAGS -O2 -arch=sm_90 -o "$W/remote_step" "$ROOT/bench/h100/remote_step.cu" >"$W/nvcc.log" 2>&1; then
        say "FATAL: nvcc failed for remote_step.cu: $(tail -3 "$W/nvcc.log")"; exit 1
    fi
    step_cmd() { echo "$W/remote_step" "$1" "$2"; }
fi
HAVE_MICRO=0
if [ "$BW" = 1 ]; then
    # shellcheck disable=SC2086
    if "$NVCC" $NVCC_FLAGS -O2 -arch=sm_90 -o "$W/microbench" "$ROOT/bench/cuda/microbench.cu" >"$W/nvcc-micro.log" 2>&1; then
        HAVE_MICRO=1
    else
        note "nvcc failed for microbench.cu ($(tail -1 "$W/nvcc-micro.log")): no copy figures"
    fi
else
    note "BW=0: copies skipped"
fi

# --- servers: TLS on a non-loopback address, plain TCP on loopback ---
PORT_tls='' PRINT_tls='' PORT_plain=''
start_tcp_server tls tcp:0.0.0.0:0 || { say "FATAL: no TLS server"; exit 1; }
[ -n "$PRINT_tls" ] || { say "FATAL: the server on tcp:0.0.0.0 did not say its certificate (no TLS)"; exit 1; }
HAVE_PLAIN=1
start_tcp_server plain tcp:127.0.0.1:0 || { note "the plain-TCP server did not start: no TLS comparison"; HAVE_PLAIN=0; }


# run_step NAME RTT_MS GBIT TRANSPORT STEPS WARMUP: one process, natively or
# through cumux over a fresh relay; its line in the manifest.
run_step() {
    local name=$1 rtt=$2 gbit=$3 transport=$4 steps=$5 warmup=$6 trace=- rc limit
    limit=$(left)
    if [ "$(elapsed)" -ge "$BUDGET" ] || [ "$limit" -lt 30 ]; then
        note "$name skipped: $(elapsed) s gone of the ${BUDGET} s budget"; return
    fi
    # shellcheck disable=SC2046 # step_cmd gives a list of words
    if [ "$transport" = native ]; then
        timeout "$limit" $(step_cmd "$steps" "$warmup") >"$RUNS/$name.txt" 2>&1
        rc=$?
    else
        local port=$PORT_tls print=$PRINT_tls
        [ "$transport" = plain ] && { port=$PORT_plain; print=; }
        if ! start_relay "$port" "$rtt" "$gbit"; then
            note "$name: no relay"; stop_relay; return
        fi
        trace=$W/hop-$name
        CUMUX_HOP_TRACE=$trace CUMUX_TLS_FINGERPRINT=$print timeout "$limit" \
            "$KIT/cumux" run --server "tcp:$relay_at" -- $(step_cmd "$steps" "$warmup") >"$RUNS/$name.txt" 2>&1
        rc=$?
        stop_relay
    fi
    printf 'step\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rtt" "$gbit" "$transport" "$RUNS/$name.txt" "$trace" "$rc" >>"$MANIFEST"
    local p50 p99 st
    p50=$(awk '/^step_ms_p50:/ { print $2 }' "$RUNS/$name.txt")
    p99=$(awk '/^step_ms_p99:/ { print $2 }' "$RUNS/$name.txt")
    st=$(awk '$1 == "stamp" && $2 == "start" { a = $3 } $1 == "stamp" && $2 == "first_step" { b = $3 } END { if (a && b) printf "%.2f", (b - a) / 1e9 }' "$RUNS/$name.txt")
    if [ -n "$p50" ]; then
        say "$(printf '%-24s rc %-3s step p50 %9s ms  p99 %9s ms  start-up %6s s  (%s s in)' "$name" "$rc" "$p50" "$p99" "${st:-?}" "$(elapsed)")"
    else
        say "$(printf '%-24s rc %-3s FAILED: %s' "$name" "$rc" "$(grep -v '^\(stamp\|step\|pid\)' "$RUNS/$name.txt" | tail -2 | tr '\n' ' ' | cut -c1-220)")"
    fi
}

# run_bw NAME RTT_MS GBIT TRANSPORT: microbench's copies up to BW_MAX.
run_bw() {
    local name=$1 rtt=$2 gbit=$3 transport=$4 rc limit
    [ "$HAVE_MICRO" = 1 ] || return
    limit=$(left)
    if [ "$(elapsed)" -ge "$BUDGET" ] || [ "$limit" -lt 20 ]; then
        note "$name skipped: $(elapsed) s gone of the ${BUDGET} s budget"; return
    fi
    case $transport in
    native)
        timeout "$limit" "$W/microbench" bandwidth 1 "$BW_MAX" >"$RUNS/$name.txt" 2>&1
        rc=$? ;;
    plain-direct)
        timeout "$limit" "$KIT/cumux" run --server "tcp:127.0.0.1:$PORT_plain" -- \
            "$W/microbench" bandwidth 1 "$BW_MAX" >"$RUNS/$name.txt" 2>&1
        rc=$? ;;
    *)
        if ! start_relay "$PORT_tls" "$rtt" "$gbit"; then note "$name: no relay"; stop_relay; return; fi
        CUMUX_TLS_FINGERPRINT=$PRINT_tls timeout "$limit" "$KIT/cumux" run --server "tcp:$relay_at" -- \
            "$W/microbench" bandwidth 1 "$BW_MAX" >"$RUNS/$name.txt" 2>&1
        rc=$?
        stop_relay ;;
    esac
    printf 'bw\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rtt" "$gbit" "$transport" "$RUNS/$name.txt" "$rc" >>"$MANIFEST"
    say "$(printf '%-24s rc %-3s %s' "$name" "$rc" "$(awk '$1 == "metric" && $2 ~ /_(256m|16m)_/ { printf "%s %s  ", $2, $3 }' "$RUNS/$name.txt")")"
}

# run_link RTT_MS GBIT: the link's own round trip and stream.
run_link() {
    local rtt=$1 gbit=$2 pings file=$RUNS/link-$1ms-$2g.txt
    [ "$rtt" = 0 ] && file=$RUNS/link-loopback.txt
    pings=$(awk -v r="$rtt" 'BEGIN { p = int(2000 / (r + 0.01)); if (p > 200) p = 200; if (p < 10) p = 10; print p }')
    if [ "$rtt" = 0 ]; then
        timeout 120 python3 "$ROOT/bench/h100/link_probe.py" - 0 none 200 1024 >"$file" 2>&1
    else
        timeout 120 python3 "$ROOT/bench/h100/link_probe.py" "$KIT/cumux-netem" "${rtt}ms" "$gbit" "$pings" 512 >"$file" 2>&1
    fi
    printf 'link\tlink-%s-%s\t%s\t%s\t-\t%s\t%s\n' "$rtt" "$gbit" "$rtt" "$gbit" "$file" "$?" >>"$MANIFEST"
    say "link rtt $rtt ms, $gbit Gbit/s: $(tr '\n' ' ' <"$file")"
}

say ""
say "--- links ($(elapsed) s) ---"
for r in $RTTS; do run_link "$r" "$GBIT"; done
[ -n "$SLOW_GBIT" ] && run_link 0.5 "$SLOW_GBIT"
[ "$HAVE_PLAIN" = 1 ] && [ "$HAVE_MICRO" = 1 ] && run_link 0 none

say ""
say "--- steps ($(elapsed) s) ---"
if [ "$DEVICE" = cuda ]; then
    run_step native 0 none native "$STEPS" "$WARMUP"
fi
# Short RTTs first; those over 5 ms (start-up costs most there) come last,
# with whatever time is left.
slow=()
for r in $RTTS; do
    if awk -v r="$r" 'BEGIN { exit !(r > 5) }'; then
        slow+=("$r")
    else
        run_step "tls-${r}ms-${GBIT}g" "$r" "$GBIT" tls "$STEPS" "$WARMUP"
    fi
done
[ -n "$SLOW_GBIT" ] && run_step "tls-0.5ms-${SLOW_GBIT}g" 0.5 "$SLOW_GBIT" tls "$STEPS" "$WARMUP"

say ""
say "--- TLS against plain TCP at 0.5 ms, $GBIT Gbit/s ($(elapsed) s) ---"
if [ "$HAVE_PLAIN" = 1 ]; then
    for k in $(seq "$TLS_ROUNDS"); do
        run_step "plain-0.5ms-${GBIT}g-r$k" 0.5 "$GBIT" plain "$STEPS" "$WARMUP"
        # The TLS run of the RTT list above is the first round's, where it ran.
        if [ "$k" -gt 1 ] || ! awk -F'\t' -v n="tls-0.5ms-${GBIT}g" '$1 == "step" && $2 == n { f = 1 } END { exit !f }' "$MANIFEST"; then
            run_step "tls-0.5ms-${GBIT}g-r$k" 0.5 "$GBIT" tls "$STEPS" "$WARMUP"
        fi
    done
fi

say ""
say "--- copies up to $BW_MAX bytes ($(elapsed) s) ---"
if [ "$HAVE_MICRO" = 1 ]; then
    [ "$DEVICE" = cuda ] && run_bw bw-native 0 none native
    run_bw "bw-tls-0.5ms-${GBIT}g" 0.5 "$GBIT" tls
    [ -n "$SLOW_GBIT" ] && run_bw "bw-tls-0.5ms-${SLOW_GBIT}g" 0.5 "$SLOW_GBIT" tls
    [ "$HAVE_PLAIN" = 1 ] && run_bw bw-loopback-plain 0 none plain-direct
fi

say ""
say "--- RTTs over 5 ms: ${slow[*]:-none} ($(elapsed) s) ---"
for r in "${slow[@]}"; do
    run_step "tls-${r}ms-${GBIT}g" "$r" "$GBIT" tls "$STEPS_SLOW" "$WARMUP_SLOW"
done

say ""
say "--- result ($(elapsed) s) ---"
JSON=$OUT/$DATE-$SLUG-remote.json
python3 "$ROOT/bench/h100/remote_json.py" "$MANIFEST" "$JSON" "$DATE" "$GPU" "$DRIVER" "$CUDA" "$COMMIT" "$PROGRAM" 2>&1 | tee -a "$REPORT"
cp "$MANIFEST" "$RUNS/manifest.tsv"
tar -C "$W" -czf "$OUT/remote-runs.tgz" runs 2>/dev/null || note "could not pack the runs"
say "done in $(elapsed) s; runs in $OUT/remote-runs.tgz"
