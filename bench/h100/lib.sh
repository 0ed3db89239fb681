# shellcheck shell=bash
# Shared by the GPU machine's scripts (sourced): points cumux at the system's
# NVIDIA libcuda.so.1 unless CUMUX_REAL_LIBCUDA already says which.
if [ -z "${CUMUX_REAL_LIBCUDA:-}" ]; then
    real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    [ -n "$real" ] && export CUMUX_REAL_LIBCUDA=$real
fi

# Sets DATE, GPU, DRIVER, CUDA, SLUG (e.g. h100) and COMMIT (the kit's, else
# the checkout's) for a results file; DEVICE other than cuda names the CPU
# device instead of a GPU.
describe_machine() {
    DATE=$(date -u +%F)
    if [ "${DEVICE:-cuda}" = cuda ]; then
        GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
        DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
        CUDA=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | awk '{ print $3 }')
        SLUG=$(printf '%s\n' "$GPU" | tr ' ' '\n' | grep -m1 -E '^[A-Za-z]+[0-9]+' | tr '[:upper:]' '[:lower:]')
    else
        GPU="none (cumux $DEVICE device)"; DRIVER=none; CUDA=none; SLUG=$DEVICE
    fi
    SLUG=${SLUG:-gpu}
    COMMIT=$(head -1 "$KIT/COMMIT" 2>/dev/null | tr -d '[:space:]')
    [ -n "$COMMIT" ] || COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    export DATE GPU DRIVER CUDA SLUG COMMIT
}

# Kills the processes in the array `pids` and removes the work folder $W:
# the scripts' EXIT trap.
stop_all() {
    # shellcheck disable=SC2154 # the sourcing script's
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$W"
}

# start_relay PORT RTT_MS GBIT: a cumux-netem relay from a fresh loopback port
# to 127.0.0.1:PORT ($KIT's, its output in a file of its own under $W, never a
# stale line of the last one); sets relay_pid and relay_at (HOST:PORT), adds
# the pid to `pids`; fails, saying why on stderr, if it does not start.
relay_pid=
relay_at=
relays=0
start_relay() {
    relays=$((relays + 1))
    local out=$W/relay$relays.out
    "$KIT/cumux-netem" --to "127.0.0.1:$1" --rtt "${2}ms" --gbit "$3" >"$out" 2>&1 &
    relay_pid=$!
    pids+=("$relay_pid")
    relay_at=
    for _ in $(seq 100); do
        relay_at=$(awk '/listening/ { print $4 }' "$out" 2>/dev/null)
        [ -n "$relay_at" ] && break
        sleep 0.05
    done
    [ -n "$relay_at" ] || echo "cumux-netem did not start: $(cat "$out")" >&2
    [ -n "$relay_at" ]
}
# stop_relay: ends the relay start_relay started.
stop_relay() { [ -n "$relay_pid" ] && kill "$relay_pid" 2>/dev/null; wait "$relay_pid" 2>/dev/null; relay_pid=; }

# start_tcp_server NAME LISTEN [ARGS...]: `cumux serve --device $DEVICE` on
# LISTEN (the CPU device with 2G), its state under $W/state-NAME and its log in
# $RUNS/server-NAME.log; sets PORT_<NAME> and PRINT_<NAME> (its certificate's
# fingerprint, for TLS) from the line it prints once it listens (kept in
# $W/server-NAME.out), says that line, and fails if it never listened.
start_tcp_server() {
    local name=$1 listen=$2 extra=() line port print
    shift 2
    [ "${DEVICE:-cuda}" = cpu ] && extra=(--memory 2G)
    mkdir -p "$W/state-$name"
    XDG_STATE_HOME=$W/state-$name "$KIT/cumux" serve --device "${DEVICE:-cuda}" "${extra[@]}" \
        --listen "$listen" "$@" >"$W/server-$name.out" 2>"$RUNS/server-$name.log" &
    pids+=($!)
    for _ in $(seq 600); do grep -q listening "$W/server-$name.out" 2>/dev/null && break; sleep 0.1; done
    line=$(head -1 "$W/server-$name.out")
    port=$(echo "$line" | grep -o 'tcp:[^ ;]*' | head -1 | awk -F: '{ print $NF }')
    print=$(echo "$line" | grep -o 'sha256:[0-9A-F:]*' | head -1)
    printf -v "PORT_$name" '%s' "$port"
    printf -v "PRINT_$name" '%s' "$print"
    say "server $name: ${line:-did not start: $(tail -2 "$RUNS/server-$name.log")}"
    [ -n "$port" ]
}

# start_together [SECONDS]: exports TENANT_START_AT, SECONDS (default
# $START_DELAY, else 4) from now: the tenants of a mix started after it time
# the same window (bench/cuda/tenant_bench.cu), however long each takes to
# get its context (an isolated cumux tenant's worker is made at its first call).
start_together() {
    TENANT_START_AT=$(awk -v d="${1:-${START_DELAY:-4}}" -v now="$(date +%s.%N)" 'BEGIN { printf "%.3f", now + d }')
    export TENANT_START_AT
}
