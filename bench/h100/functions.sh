#!/usr/bin/env bash
# Issue 16's serverless-function benchmarks on one GPU: hot invocation against native launch+sync,
# invocations/s at 1/16/64 clients, registration, an MLP at batch 1 and 32, and FastAPI+CuPy doing the same.
#
# On the GPU machine (device tool), from the repo root, with the kit of this
# commit in device-kit/main and FastAPI's wheels in .whl (bench/README.md says
# how to fetch them), about 3 min:
#   run(command="KIT=device-kit/main OUT=$OUT bench/h100/functions.sh",
#       carry=["device-kit/main", ".whl"], timeout_s=600)
#
# What it does, each part skipped with a line saying why when it cannot run:
# - builds bench/h100/fn_kernels.cu into a fat binary (the functions' module
#   and CuPy's), fn_native.cu (the same kernels natively) and fn_load.c (the
#   HTTP client every side is driven by: one keep-alive connection per client);
# - starts `cumux serve --functions 127.0.0.1:0` with one tenant, registers
#   `vadd` (timed: the first registration is the cold one) and re-registers it
#   under new names, registers `mlp`, and checks each against numpy;
# - hot invocation of `vadd` (1024 floats) with one client against fn_native's
#   launch+sync of the same kernel (p50, p99, overhead); invocations/s and
#   p50/p99 at CLIENTS concurrent clients; `mlp` (1024-1024-128, fp32) at
#   batch 1 and 32 against the same launches natively, and at 16 clients;
# - the same requests to FastAPI + uvicorn + CuPy (bench/h100/fn_fastapi.py),
#   its packages installed from .whl into /tmp/site when not importable.
# Writes $OUT/functions.txt, $OUT/DATE-GPU-functions.json and
# $OUT/functions-runs.tgz. DEVICE=cpu runs the plumbing on cumux's CPU device
# (smaller MLP, no native column, the FastAPI server computing with numpy).
#
# Optional: KIT=, NVCC=, NVCC_FLAGS=, CC=, DEVICE=, SECS= (seconds per load
# run, 5), WARM= (1), CLIENTS= ("1 16 64"), N= (vadd floats, 1024),
# BATCHES= ("1 32"), ITERS= (native iterations, 5000), WHL= (.whl),
# FN_MLP_DIMS= ("1024,1024,128"), LANES= (`--functions-lanes`), CUMUX_REAL_LIBCUDA=.
set -u
START=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/bench/h100
if [ -z "${KIT:-}" ]; then
    KIT=$ROOT/device-kit/main
    [ -x "$KIT/cumux" ] || KIT=$ROOT/device-kit
fi
OUT=${OUT:-/tmp/cumux-functions}
DEVICE=${DEVICE:-cuda}
[ "$DEVICE" = cpu ] && SECS=${SECS:-3}
SECS=${SECS:-5}
WARM=${WARM:-1}
CLIENTS=${CLIENTS:-1 16 64}
N=${N:-1024}
BATCHES=${BATCHES:-1 32}
ITERS=${ITERS:-5000}
WHL=${WHL:-$ROOT/.whl}
if [ -z "${NVCC:-}" ]; then
    NVCC=nvcc
    [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
fi
NVCC_FLAGS=${NVCC_FLAGS:-}
if [ "$DEVICE" = cpu ]; then
    export FN_MLP_DIMS=${FN_MLP_DIMS:-64,64,16}
else
    export FN_MLP_DIMS=${FN_MLP_DIMS:-1024,1024,128}
fi
TOKEN=bench-token-0123456789abcdef

mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-functions.XXXXXX)
RUNS=$W/runs
mkdir -p "$RUNS"
REPORT=$OUT/functions.txt
: >"$REPORT"
: >"$RUNS/notes.txt"
: >"$RUNS/checks.txt"
: >"$RUNS/register.txt"
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
say() { echo "$*" | tee -a "$REPORT"; }
note() { say "note: $*"; echo "$*" >>"$RUNS/notes.txt"; }
elapsed() { echo $(($(date +%s) - START)); }
pids=()
trap stop_all EXIT
describe_machine
say "cumux functions benchmarks (issue 16), $(date -u +%FT%TZ): ${GPU:-unknown GPU}, driver ${DRIVER:-?}; kit $KIT ($COMMIT)"
say "vadd over $N floats; MLP $FN_MLP_DIMS at batches $BATCHES; clients $CLIENTS; $SECS s per load run (+$WARM s warm-up)"
[ -e "$KIT/cumux" ] || { say "FATAL: $KIT/cumux is missing"; exit 1; }

# --- builds ---
FATBIN=$W/fn_kernels.fatbin
# shellcheck disable=SC2086 # NVCC_FLAGS is a list of words
"$NVCC" $NVCC_FLAGS -fatbin -arch=sm_90 -o "$FATBIN" "$HERE/fn_kernels.cu" >"$RUNS/nvcc.txt" 2>&1 ||
    { say "FATAL: nvcc could not build fn_kernels.cu: $(tail -3 "$RUNS/nvcc.txt")"; exit 1; }
HAVE_NATIVE=0
if [ "$DEVICE" = cuda ]; then
    # shellcheck disable=SC2086
    if "$NVCC" $NVCC_FLAGS -O2 -arch=sm_90 -o "$W/fn_native" "$HERE/fn_native.cu" >>"$RUNS/nvcc.txt" 2>&1; then
        HAVE_NATIVE=1
    else
        note "nvcc could not build fn_native.cu ($(tail -1 "$RUNS/nvcc.txt")): no native column"
    fi
else
    note "DEVICE=$DEVICE: no native column"
fi
LOADER=
for cc in "${CC:-cc}" gcc clang; do
    if command -v "$cc" >/dev/null && "$cc" -O2 -pthread -o "$W/fn_load" "$HERE/fn_load.c" >"$RUNS/cc.txt" 2>&1; then
        LOADER=c; break
    fi
done
if [ -z "$LOADER" ]; then
    LOADER=python
    note "no C compiler built fn_load.c ($(tail -1 "$RUNS/cc.txt" 2>/dev/null)): the Python client (threads, one GIL) drives the load; its rates are the client's ceiling, not the servers'"
fi
python3 "$HERE/fn_bench.py" body vadd "$N" "$W/vadd.st"
for b in $BATCHES; do python3 "$HERE/fn_bench.py" body mlp "$b" "$W/mlp_b$b.st"; done

# load SIDE FN CLIENTS HOST PORT PATH BODY TOKEN: one load run, its figures in runs/.
load() {
    local side=$1 fn=$2 c=$3 host=$4 port=$5 path=$6 body=$7 token=$8 file
    file=$RUNS/load-$side-$fn-c$c.txt
    if [ "$LOADER" = c ]; then
        timeout $((SECS + WARM + 60)) "$W/fn_load" "$host" "$port" "$path" "$body" application/x-safetensors \
            "$token" "$c" "$SECS" "$WARM" >"$file" 2>&1
    else
        timeout $((SECS + WARM + 60)) python3 "$HERE/fn_bench.py" pyload "http://$host:$port" "$token" "$path" \
            "$body" "$c" "$SECS" "$WARM" >"$file" 2>&1
    fi
    say "$(printf '%-8s %-8s %3s clients: %s' "$side" "$fn" "$c" "$(grep -E '^(rps|p50_us|p99_us|errors|first_error)' "$file" | tr '\n' ' ' | cut -c1-240)")"
}

# --- cumux ---
printf '[tenants.bench]\ntoken = "%s"\n' "$TOKEN" >"$W/cumux.toml"
extra=()
[ "$DEVICE" = cpu ] && extra=(--memory 2G)
[ -n "${LANES:-}" ] && extra+=(--functions-lanes "$LANES")
"$KIT/cumux" serve --device "$DEVICE" "${extra[@]}" --functions 127.0.0.1:0 --config "$W/cumux.toml" \
    --listen "unix:$W/s.sock" >"$W/server.out" 2>"$RUNS/server.log" &
server_pid=$!
pids+=("$server_pid")
for _ in $(seq 600); do grep -q listening "$W/server.out" 2>/dev/null && break; sleep 0.1; done
line=$(head -1 "$W/server.out")
URL=$(echo "$line" | grep -o 'functions on http://[^/]*' | awk '{ print $3 }')
[ -n "$URL" ] || { say "FATAL: cumux serve --functions did not listen: ${line:-$(tail -3 "$RUNS/server.log")}"; exit 1; }
PORT=${URL##*:}
say "server: $line"
say ""
say "--- registrations ($(elapsed) s) ---"
dev=
[ "$DEVICE" = cpu ] && dev=cpu
for name in vadd vadd_r1 vadd_r2 vadd_r3 vadd_r4 vadd_r5; do
    python3 "$HERE/fn_bench.py" register "$URL" "$TOKEN" "$name" "$FATBIN" vadd $dev | sed "s/\$/ $name/" | tee -a "$RUNS/register.txt" "$REPORT"
done
python3 "$HERE/fn_bench.py" register "$URL" "$TOKEN" mlp "$FATBIN" mlp $dev | sed 's/$/ mlp/' | tee -a "$REPORT"
python3 "$HERE/fn_bench.py" check "$URL" "$TOKEN" /v1/functions/vadd/invoke "$W/vadd.st" 2>&1 |
    sed 's/^check [^:]*/check cumux vadd/' | tee -a "$RUNS/checks.txt" "$REPORT"
for b in $BATCHES; do
    python3 "$HERE/fn_bench.py" check "$URL" "$TOKEN" /v1/functions/mlp/invoke "$W/mlp_b$b.st" 2>&1 |
        sed "s/^check [^:]*/check cumux mlp batch $b/" | tee -a "$RUNS/checks.txt" "$REPORT"
done

if [ "$HAVE_NATIVE" = 1 ]; then
    say ""
    say "--- native ($(elapsed) s) ---"
    IFS=, read -r d_in d_hidden d_out <<<"$FN_MLP_DIMS"
    timeout 180 "$W/fn_native" "$N" "$(echo "$BATCHES" | tr ' ' ,)" "$ITERS" "$d_in" "$d_hidden" "$d_out" \
        >"$RUNS/native.txt" 2>&1 || note "fn_native failed: $(tail -2 "$RUNS/native.txt")"
    sed 's/^/    /' "$RUNS/native.txt" | tee -a "$REPORT"
fi

say ""
say "--- cumux invocations ($(elapsed) s) ---"
for c in $CLIENTS; do load cumux vadd "$c" 127.0.0.1 "$PORT" /v1/functions/vadd/invoke "$W/vadd.st" "$TOKEN"; done
for b in $BATCHES; do load cumux "mlp_b$b" 1 127.0.0.1 "$PORT" /v1/functions/mlp/invoke "$W/mlp_b$b.st" "$TOKEN"; done
last_batch=$(echo "$BATCHES" | awk '{ print $NF }')
load cumux "mlp_b$last_batch" 16 127.0.0.1 "$PORT" /v1/functions/mlp/invoke "$W/mlp_b$last_batch.st" "$TOKEN"
# The cumux server stops before the other is measured: nothing of it runs beside.
kill "$server_pid" 2>/dev/null
for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done

# --- FastAPI + CuPy ---
say ""
say "--- FastAPI + uvicorn + CuPy ($(elapsed) s) ---"
FA_PY=()
if PYTHONPATH=/tmp/site python3 -c 'import fastapi, uvicorn' 2>/dev/null; then
    FA_PY=(env PYTHONPATH=/tmp/site python3)
elif compgen -G "$WHL/*.whl" >/dev/null; then
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHL"/*.whl >"$RUNS/pip.txt" 2>&1 && PYTHONPATH=/tmp/site python3 -c 'import fastapi, uvicorn' 2>>"$RUNS/pip.txt"; then
        FA_PY=(env PYTHONPATH=/tmp/site python3)
    else
        note "FastAPI comparison skipped: the wheels in $WHL did not install or import: $(tail -2 "$RUNS/pip.txt" | tr '\n' ' ')"
    fi
else
    note "FastAPI comparison skipped: fastapi/uvicorn are not importable and $WHL holds no wheels (carry .whl)"
fi
backend=cupy
if [ "$DEVICE" != cuda ]; then
    backend=numpy
    [ ${#FA_PY[@]} -gt 0 ] && note "DEVICE=$DEVICE: the FastAPI server computes with numpy on the CPU (plumbing only, no comparison)"
elif [ ${#FA_PY[@]} -gt 0 ] && ! python3 -c 'import cupy' 2>/dev/null; then
    note "FastAPI comparison skipped: python3 cannot import cupy"
    FA_PY=()
fi
if [ ${#FA_PY[@]} -gt 0 ]; then
    FA_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "${FA_PY[@]}" "$HERE/fn_fastapi.py" "$FA_PORT" "$FATBIN" "$backend" >"$RUNS/fastapi.log" 2>&1 &
    fa_pid=$!
    pids+=("$fa_pid")
    if python3 "$HERE/fn_bench.py" wait "http://127.0.0.1:$FA_PORT/health" 60; then
        say "$(head -1 "$RUNS/fastapi.log")"
        python3 "$HERE/fn_bench.py" check "http://127.0.0.1:$FA_PORT" - /vadd "$W/vadd.st" 2>&1 |
            sed 's/^check [^:]*/check fastapi vadd/' | tee -a "$RUNS/checks.txt" "$REPORT"
        for b in $BATCHES; do
            python3 "$HERE/fn_bench.py" check "http://127.0.0.1:$FA_PORT" - /mlp "$W/mlp_b$b.st" 2>&1 |
                sed "s/^check [^:]*/check fastapi mlp batch $b/" | tee -a "$RUNS/checks.txt" "$REPORT"
        done
        for c in $CLIENTS; do load fastapi vadd "$c" 127.0.0.1 "$FA_PORT" /vadd "$W/vadd.st" -; done
        for b in $BATCHES; do load fastapi "mlp_b$b" 1 127.0.0.1 "$FA_PORT" /mlp "$W/mlp_b$b.st" -; done
        load fastapi "mlp_b$last_batch" 16 127.0.0.1 "$FA_PORT" /mlp "$W/mlp_b$last_batch.st" -
    else
        note "FastAPI comparison skipped: the server did not answer /health in 60 s: $(tail -3 "$RUNS/fastapi.log" | tr '\n' ' ')"
    fi
    kill "$fa_pid" 2>/dev/null
fi

say ""
say "--- result ($(elapsed) s) ---"
JSON=$OUT/$DATE-$SLUG-functions.json
python3 "$HERE/fn_json.py" "$RUNS" "$JSON" "$DATE" "$GPU" "$DRIVER" "$CUDA" "$COMMIT" 2>&1 | tee -a "$REPORT"
tar -C "$W" -czf "$OUT/functions-runs.tgz" runs 2>/dev/null || note "could not pack the runs"
say "done in $(elapsed) s; runs in $OUT/functions-runs.tgz"
