#!/usr/bin/env bash
# A hot function invocation's latency, A/B between builds, on a device with no
# GPU: `cumux serve --device worker-cpu` (the lanes' sessions in worker
# processes, as on a GPU) serving `vadd` over N floats (tests/functions/kernels.ptx),
# driven by bench/h100/fn_load.c (one keep-alive connection per client).
# Rounds alternate the builds, so that a busy machine spoils both alike.
#
#   KITS="before=/tmp/kit-a after=/tmp/kit-b" bench/cpu/fn_overhead.sh
# Optional: ROUNDS= (3), SECS= (3), WARM= (1), CLIENTS= ("1 16"), N= (1024),
# DEVICE= (worker-cpu; cuda on a GPU machine), FN_LOAD= (a built fn_load), HOPS=1 (each server with CUMUX_HOP_TRACE, split by
# bench/fn_hops.py), OUT= (/tmp/cumux-fn-overhead).
# Prints one line per run and the medians per build and client count (cpu:
# the server's and its workers' CPU time per invocation; sleeps: their
# threads' voluntary context switches per invocation, the hand-offs that slept),
# and each build's best round.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KITS=${KITS:?KITS="label=DIR label=DIR"}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-3}
WARM=${WARM:-1}
CLIENTS=${CLIENTS:-1 16}
N=${N:-1024}
DEVICE=${DEVICE:-worker-cpu}
OUT=${OUT:-/tmp/cumux-fn-overhead}
TOKEN=bench-token-0123456789abcdef
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-fn-overhead.XXXXXX)
if [ -n "${FN_LOAD:-}" ]; then
    cp "$FN_LOAD" "$W/fn_load"
else
    cc -O2 -pthread -o "$W/fn_load" "$ROOT/bench/h100/fn_load.c" || exit 1
fi
# On a GPU machine: the system's libcuda.so.1.
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
memory=()
case $DEVICE in cpu | worker-cpu) memory=(--memory 2G) ;; esac
python3 "$ROOT/bench/h100/fn_bench.py" body vadd "$N" "$W/vadd.st" || exit 1
printf '[tenants.bench]\ntoken = "%s"\n' "$TOKEN" >"$W/cumux.toml"
RESULTS=$OUT/runs.txt
: >"$RESULTS"
server=
# CPU seconds (user + system) of process $1 and its children.
tree_cpu() {
    local pids
    pids="$1 $(pgrep -P "$1" | tr '\n' ' ')"
    for p in $pids; do cat "/proc/$p/stat" 2>/dev/null; done |
        awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); t += $12 + $13 } END { printf "%.4f", t / hz }'
}
# Voluntary context switches (sleeps) of process $1's threads and its children's.
tree_sleeps() {
    local pids
    pids="$1 $(pgrep -P "$1" | tr '\n' ' ')"
    for p in $pids; do cat /proc/"$p"/task/*/status 2>/dev/null; done |
        awk '$1 == "voluntary_ctxt_switches:" { n += $2 } END { print n + 0 }'
}
stop() { [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null; server=; }
trap 'stop; rm -rf "$W"' EXIT

for round in $(seq "$ROUNDS"); do
    for kit in $KITS; do
        label=${kit%%=*}
        dir=${kit#*=}
        run=$W/$label-$round
        mkdir -p "$run"
        trace=()
        [ "${HOPS:-0}" = 1 ] && trace=(env "CUMUX_HOP_TRACE=$OUT/hops-$label-$round")
        rm -rf "$OUT/hops-$label-$round"
        "${trace[@]}" "$dir/cumux" serve --device "$DEVICE" "${memory[@]}" --functions 127.0.0.1:0 \
            --config "$W/cumux.toml" --listen "unix:$run/s.sock" >"$run/server.out" 2>"$run/server.log" &
        server=$!
        for _ in $(seq 300); do grep -q listening "$run/server.out" 2>/dev/null && break; sleep 0.1; done
        url=$(head -1 "$run/server.out" | grep -o 'functions on http://[^/]*' | awk '{ print $3 }')
        [ -n "$url" ] || { echo "FATAL: $label did not listen: $(tail -3 "$run/server.log")"; exit 1; }
        python3 "$ROOT/bench/h100/fn_bench.py" register "$url" "$TOKEN" vadd \
            "$ROOT/tests/functions/kernels.ptx" vadd >/dev/null || exit 1
        for c in $CLIENTS; do
            cpu0=$(tree_cpu "$server")
            sleeps0=$(tree_sleeps "$server")
            "$W/fn_load" 127.0.0.1 "${url##*:}" /v1/functions/vadd/invoke "$W/vadd.st" \
                application/x-safetensors "$TOKEN" "$c" "$SECS" "$WARM" >"$run/load-c$c.txt" 2>&1
            cpu1=$(tree_cpu "$server")
            sleeps1=$(tree_sleeps "$server")
            requests=$(awk '$1 == "requests" { print $2 }' "$run/load-c$c.txt")
            # Server and worker CPU time per invocation (warm-up included in both).
            cpu_us=$(awk -v a="$cpu0" -v b="$cpu1" -v n="${requests:-0}" -v s="$SECS" -v w="$WARM" \
                'BEGIN { if (n > 0) printf "%.1f", (b - a) * 1e6 / (n * (s + w) / s) }')
            sleeps=$(awk -v a="$sleeps0" -v b="$sleeps1" -v n="${requests:-0}" -v s="$SECS" -v w="$WARM" \
                'BEGIN { if (n > 0) printf "%.2f", (b - a) / (n * (s + w) / s) }')
            figures="$(grep -E '^(rps|p50_us|p99_us|errors)' "$run/load-c$c.txt" | tr '\n' ' ')cpu_us ${cpu_us:-0} sleeps ${sleeps:-0}"
            echo "$label round $round clients $c: $figures" | tee -a "$RESULTS"
        done
        stop
    done
done

echo "medians over $ROUNDS rounds (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
python3 - "$RESULTS" <<'EOF'
import collections, statistics, sys
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    head, _, figures = line.partition(":")
    words = head.split()
    key = (words[0], int(words[4]))
    f = figures.split()
    for k, v in zip(f[::2], f[1::2]):
        runs[key][k].append(float(v))
for (label, c), f in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    med = {k: statistics.median(v) for k, v in f.items()}
    print(f"{label:>10} {c:3} clients: p50 {med['p50_us']:8.1f} us  p99 {med['p99_us']:8.1f} us  "
          f"{med['rps']:9.1f}/s  cpu {med.get('cpu_us', 0):6.1f} us/inv  sleeps {med.get('sleeps', 0):5.2f}/inv  "
          f"errors {int(sum(f['errors']))}")
    print(f"{'':>10} {'':3}          best round p50 {min(f['p50_us']):8.1f} us  p99 {min(f['p99_us']):8.1f} us")
EOF
