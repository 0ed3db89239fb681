#!/usr/bin/env bash
# Issue 19's pool run: one cumux server per GPU of this host, each on TCP with
# TLS (a self-signed certificate of its own, pinned by the pool file) behind
# the network emulator (cumux-netem: RTT 0.5 ms, 100 Gbit/s by default), then
# - one program on all of them through `cumux run --pool --gpus N`
#   (bench/h100/pool_step.py: a layer per GPU, one loss.item() a step):
#   losses against native on the same GPUs, step time ratio;
# - 2N programs placed by `cumux run --pool --gpus 1`, started 2 s apart:
#   where each went (most and fewest per server), their median step time
#   against 2 native processes per GPU.
# DEVICE=cpu runs the same plumbing on CPU devices (N=2 by default) with
# CUDA programs instead of PyTorch, to check the script without a GPU.
# Writes $OUT/pool.txt and $OUT/DATE-GPU-pool.json.
#
#   OUT=/some/dir bench/h100/pool.sh
# Optional: KIT= (cumux, libcumux_client.so, cumux-netem), NVCC=, DEVICE=,
# N= (CPU mode), RTT=, GBIT=, STEPS=, SPLIT_SIZES= (matmul_split's N, "2048
# 4096 8192 16384"), PLACED=0 (skip the placed programs).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-pool}
SPLIT_SIZES=${SPLIT_SIZES:-2048 4096 8192 16384}
PLACED=${PLACED:-1}
NVCC=${NVCC:-nvcc}
DEVICE=${DEVICE:-cuda}
RTT=${RTT:-0.5ms}
GBIT=${GBIT:-100}
STEPS=${STEPS:-30}
mkdir -p "$OUT/runs"
W=$(mktemp -d /tmp/cumux-pool.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
REPORT=$OUT/pool.txt
: >"$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }
value() { grep -h "^$2:" "$1" | tail -1 | awk '{ print $2 }'; }
losses() { grep -h '^step [0-9]* loss' "$1"; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT

if [ "$DEVICE" = cuda ]; then
    N=$(nvidia-smi -L | wc -l)
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
else
    N=${N:-2}
    GPU="CPU device"
    DRIVER=none
    "$NVCC" -o "$W/two_devices" "$ROOT/tests/cuda/driver/two_devices.cu" >"$W/nvcc.log" 2>&1 &&
        "$NVCC" -o "$W/loop_launches" "$ROOT/crates/cli/tests/cuda/loop_launches.cu" >>"$W/nvcc.log" 2>&1 ||
        { say "nvcc failed: $(cat "$W/nvcc.log")"; exit 1; }
fi
say "pool $(date -u +%FT%TZ) kit $(cat "$KIT/COMMIT" 2>/dev/null): $N x $GPU, driver $DRIVER; link RTT $RTT, $GBIT Gbit/s"

# --- servers, each behind its emulated link ---
: >"$W/pool.toml"
for i in $(seq 0 $((N - 1))); do
    mkdir -p "$W/state$i"
    if [ "$DEVICE" = cuda ]; then
        CUDA_VISIBLE_DEVICES=$i XDG_STATE_HOME=$W/state$i "$KIT/cumux" serve --device cuda \
            --listen tcp:0.0.0.0:0 >"$W/server$i.out" 2>"$OUT/runs/server$i.log" &
    else
        XDG_STATE_HOME=$W/state$i "$KIT/cumux" serve --device cpu --memory 1G --cpu-window "$i" \
            --listen tcp:0.0.0.0:0 >"$W/server$i.out" 2>"$OUT/runs/server$i.log" &
    fi
    pids+=($!)
    for _ in $(seq 300); do grep -q listening "$W/server$i.out" 2>/dev/null && break; sleep 0.1; done
    line=$(head -1 "$W/server$i.out")
    port=$(echo "$line" | grep -o 'tcp:[^ ;]*' | head -1 | awk -F: '{ print $NF }')
    print=$(echo "$line" | grep -o 'sha256:[0-9A-F:]*' | head -1)
    [ -n "$port" ] && [ -n "$print" ] || { say "server $i did not listen with TLS: $line"; exit 1; }
    "$KIT/cumux-netem" --to "127.0.0.1:$port" --rtt "$RTT" --gbit "$GBIT" >"$W/relay$i.out" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do grep -q listening "$W/relay$i.out" 2>/dev/null && break; sleep 0.05; done
    relay=$(awk '{ print $4 }' "$W/relay$i.out")
    printf '[[servers]]\naddress = "tcp:%s"\nfingerprint = "%s"\n\n' "$relay" "$print" >>"$W/pool.toml"
    say "server $i: port $port behind $relay, certificate $print"
done
cp "$W/pool.toml" "$OUT/runs/pool.toml"

# --- one program on every server ---
if [ "$DEVICE" = cuda ]; then
    ONE=(python3 "$ROOT/bench/h100/pool_step.py" "$STEPS")
    python3 "$ROOT/bench/h100/pool_step.py" "$STEPS" >"$OUT/runs/one-native.txt" 2>&1
else
    ONE=("$W/two_devices")
fi
"$KIT/cumux" run --pool "$W/pool.toml" --gpus "$N" -- "${ONE[@]}" >"$OUT/runs/one-cumux.txt" 2>&1
one_ok=$(grep -cE 'PASS' "$OUT/runs/one-cumux.txt")
if [ "$DEVICE" = cuda ]; then
    if diff <(losses "$OUT/runs/one-native.txt") <(losses "$OUT/runs/one-cumux.txt") >/dev/null; then
        one_losses=equal
    else
        one_losses=DIFFER
    fi
    one_native=$(value "$OUT/runs/one-native.txt" step_ms)
    one_cumux=$(value "$OUT/runs/one-cumux.txt" step_ms)
    say "one program on $N servers: $(grep -c . "$OUT/runs/one-cumux.txt") lines, PASS $one_ok, losses $one_losses, step $one_native ms native, $one_cumux ms through the pool"
else
    one_losses=n/a; one_native=; one_cumux=
    say "one program on $N servers: PASS $one_ok ($(grep -h 'placed on' "$OUT/runs/one-cumux.txt"))"
fi

# --- activations crossing servers (pool_hops.cu), a matmul split over them (matmul_split.cu) ---
hop_native=; hop_cumux=; split_rows=()
if [ "$DEVICE" = cuda ]; then
    "$NVCC" -O2 -arch=sm_90 -o "$W/pool_hops" "$ROOT/bench/h100/pool_hops.cu" &&
        "$NVCC" -O2 -arch=sm_90 -o "$W/matmul_split" "$ROOT/bench/h100/matmul_split.cu" -lcublas ||
        say "nvcc failed for pool_hops or matmul_split"
    "$W/pool_hops" 30 >"$OUT/runs/hops-native.txt" 2>&1
    "$KIT/cumux" run --pool "$W/pool.toml" --gpus "$N" -- "$W/pool_hops" 30 >"$OUT/runs/hops-cumux.txt" 2>&1
    hop_native=$(value "$OUT/runs/hops-native.txt" hop_ms)
    hop_cumux=$(value "$OUT/runs/hops-cumux.txt" hop_ms)
    say "a 2 MiB activation from one GPU to the next (pool_hops, $N GPUs): $hop_native ms natively (peer copies), $hop_cumux ms across servers; $(grep -h 'pool_hops:' "$OUT/runs/hops-cumux.txt")"
    CUDA_VISIBLE_DEVICES=0 "$W/matmul_split" "$SPLIT_SIZES" >"$OUT/runs/split-local1.txt" 2>&1
    "$W/matmul_split" "$SPLIT_SIZES" >"$OUT/runs/split-native$N.txt" 2>&1
    "$KIT/cumux" run --pool "$W/pool.toml" --gpus "$N" -- "$W/matmul_split" "$SPLIT_SIZES" >"$OUT/runs/split-pool.txt" 2>&1
    for n in $SPLIT_SIZES; do
        one=$(awk -v n="$n" '$1 == "n" && $2 == n { print $6 }' "$OUT/runs/split-local1.txt")
        all=$(awk -v n="$n" '$1 == "n" && $2 == n { print $6 }' "$OUT/runs/split-native$N.txt")
        pool=$(awk -v n="$n" '$1 == "n" && $2 == n { print $6 }' "$OUT/runs/split-pool.txt")
        split_rows+=("$n ${one:-null} ${all:-null} ${pool:-null}")
        say "matmul n=$n from host memory: 1 local GPU ${one:-?} ms, $N local GPUs ${all:-?} ms, $N GPUs of $N servers ${pool:-?} ms"
    done
    say "matmul results: $(grep -h 'matmul_split:' "$OUT/runs/split-local1.txt" "$OUT/runs/split-pool.txt" | tr '\n' ' ')"
fi

# --- 2N programs placed by the pool ---
MANY=$((PLACED ? 2 * N : 0))
for j in $(seq 1 "$MANY"); do
    if [ "$DEVICE" = cuda ]; then
        "$KIT/cumux" run --pool "$W/pool.toml" --gpus 1 -- \
            python3 "$ROOT/bench/h100/pool_step.py" "$((STEPS * 3))" >"$OUT/runs/placed$j.txt" 2>&1 &
    else
        "$KIT/cumux" run --pool "$W/pool.toml" --gpus 1 -- "$W/loop_launches" 6 >"$OUT/runs/placed$j.txt" 2>&1 &
    fi
    pids+=($!)
    sleep 2
done
wait_placed() { for j in $(seq 1 "$MANY"); do while ! grep -qE 'PASS|passed|FAIL|failed|error' "$OUT/runs/placed$j.txt" 2>/dev/null; do sleep 0.5; done; done; }
timeout 600 bash -c "$(declare -f wait_placed); OUT=$OUT MANY=$MANY wait_placed"
declare -A per
for j in $(seq 1 "$MANY"); do
    at=$(grep -h 'placed on' "$OUT/runs/placed$j.txt" | grep -o 'tcp:[0-9.:]*' | head -1 | sed 's/:$//')
    per[$at]=$(( ${per[$at]:-0} + 1 ))
done
most=0; fewest=$MANY
for i in $(seq 0 $((N - 1))); do
    relay=$(awk '{ print $4 }' "$W/relay$i.out")
    c=${per[tcp:$relay]:-0}
    [ "$c" -gt "$most" ] && most=$c
    [ "$c" -lt "$fewest" ] && fewest=$c
    say "server $i (tcp:$relay): $c of $MANY programs"
done
many_ok=$(cat "$OUT"/runs/placed*.txt 2>/dev/null | grep -cE 'PASS|passed')
if [ "$DEVICE" = cuda ] && [ "$MANY" -gt 0 ]; then
    natives=()
    for i in $(seq 0 $((N - 1))); do
        for k in 1 2; do
            CUDA_VISIBLE_DEVICES=$i python3 "$ROOT/bench/h100/pool_step.py" "$((STEPS * 3))" \
                >"$OUT/runs/native$i-$k.txt" 2>&1 &
            natives+=($!)
        done
    done
    # Only these: the servers and relays run on until the end.
    wait "${natives[@]}"
    median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
    many_native=$(for f in "$OUT"/runs/native*.txt; do value "$f" step_ms; done | median)
    many_cumux=$(for f in "$OUT"/runs/placed*.txt; do value "$f" step_ms; done | median)
else
    many_native=; many_cumux=
fi
say "$MANY programs placed: most $most, fewest $fewest per server; passed $many_ok; median step ${many_native:-n/a} ms native (2 per GPU), ${many_cumux:-n/a} ms through the pool"

ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b / a }' || echo null; }
num() { [ -n "$1" ] && echo "$1" || echo null; }
cat >"$OUT/$(date -u +%F)-$(echo "$GPU" | tr ' ' '_' | tr -cd 'A-Za-z0-9_-')-pool.json" <<JSON
{
  "suite": "pool",
  "date": "$(date -u +%F)",
  "gpu": "$N x $GPU",
  "driver": "$DRIVER",
  "cuda": "$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | awk '{ print $3 }')",
  "commit": "$(cat "$KIT/COMMIT" 2>/dev/null)",
  "link": {"rtt": "$RTT", "gbit": $GBIT, "tls": true},
  "metrics": [
    {"name": "one_program_step_ms", "unit": "ms", "better": "lower", "native": $(num "$one_native"), "cumux": $(num "$one_cumux"), "ratio": $(ratio "$one_native" "$one_cumux")},
    {"name": "one_program_losses", "unit": "", "better": "equal", "native": "reference", "cumux": "$one_losses", "ratio": null},
    {"name": "placed_programs_step_ms", "unit": "ms", "better": "lower", "native": $(num "$many_native"), "cumux": $(num "$many_cumux"), "ratio": $(ratio "$many_native" "$many_cumux")},
    {"name": "placement_most_per_server", "unit": "programs", "better": "lower", "native": null, "cumux": $most, "ratio": null},
    {"name": "placement_fewest_per_server", "unit": "programs", "better": "higher", "native": null, "cumux": $fewest, "ratio": null},
    {"name": "placed_programs_passed", "unit": "programs", "better": "higher", "native": $MANY, "cumux": $many_ok, "ratio": null},
    {"name": "activation_hop_ms", "unit": "ms", "better": "lower", "native": $(num "$hop_native"), "cumux": $(num "$hop_cumux"), "ratio": $(ratio "$hop_native" "$hop_cumux")}$(for row in "${split_rows[@]}"; do set -- $row; printf ',\n    {"name": "matmul_%s_ms", "unit": "ms", "better": "lower", "native": %s, "native_all_local": %s, "cumux": %s, "ratio": %s, "note": "native: 1 local GPU; cumux: %s GPUs of %s servers"}' "$1" "$2" "$3" "$4" "$(ratio "${2/null/}" "${4/null/}")" "$N" "$N"; done)
  ]
}
JSON
say "wrote $OUT/*-pool.json"
