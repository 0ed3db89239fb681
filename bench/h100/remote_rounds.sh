#!/usr/bin/env bash
# Where a remote GPT-2 step's time over native goes (issue 24): alternating rounds of the
# step natively, through cumux on the same host (unix socket, shared memory), over loopback TCP, and over TLS behind cumux-netem.
#
# On the GPU machine (device tool), from the repo root, with the kit of this
# commit in device-kit/main (cumux, libcumux_client.so, cumux-netem), about
# 5 min:
#   run(command="KIT=device-kit/main OUT=$OUT bench/h100/remote_rounds.sh",
#       carry=["device-kit/main"], timeout_s=600)
#
# Each run is bench/h100/remote_step.py with STEP_GPU_TIME=1, so besides the
# step's wall time it reports the GPU's time from the step's first call to its
# optimizer's last kernel (CUDA events) and the host's time to queue the step.
# A step whose GPU time is its wall time waits on the GPU; one whose GPU time
# is shorter waits on the host or the path. The configurations, in this order
# in every round:
#   native; shm (unix socket, shared memory); tcp (plain, loopback, no relay);
#   tls-RTT for each RTT in RTTS (TLS behind cumux-netem at GBIT).
# Writes $OUT/remote_rounds.txt (a line a run, then medians) and
# $OUT/DATE-GPU-remote-rounds.json.
#
# Optional: KIT=, ROUNDS= (3), STEPS= (40), WARMUP= (5), RTTS= ("0.05 0.5"),
# GBIT= (100), CONFIGS= (which of native shm tcp tls to run; all),
# BUDGET= (seconds after which no new run starts, 500).
set -u
START=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit/main}
OUT=${OUT:-/tmp/cumux-remote-rounds}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-40}
WARMUP=${WARMUP:-5}
RTTS=${RTTS:-0.05 0.5}
GBIT=${GBIT:-100}
CONFIGS=${CONFIGS:-native shm tcp tls}
BUDGET=${BUDGET:-500}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-rounds.XXXXXX)
REPORT=$OUT/remote_rounds.txt
: >"$REPORT"
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
say() { echo "$*" | tee -a "$REPORT"; }
elapsed() { echo $(($(date +%s) - START)); }
pids=()
trap stop_all EXIT
describe_machine
say "remote step rounds (issue 24), $(date -u +%FT%TZ): ${GPU:-unknown GPU}, driver ${DRIVER:-?}; kit $KIT ($COMMIT)"
say "rounds $ROUNDS, steps $STEPS (+$WARMUP warm-up), configurations: $CONFIGS (tls at ${RTTS} ms, $GBIT Gbit/s)"
for f in cumux libcumux_client.so cumux-netem; do
    [ -e "$KIT/$f" ] || { say "FATAL: $KIT/$f is missing"; exit 1; }
done
python3 -c 'import torch' 2>/dev/null || { say "FATAL: python3 cannot import torch"; exit 1; }

SOCK=$W/cumux.sock
"$KIT/cumux" serve --device cuda --listen "unix:$SOCK" >"$W/server-unix.out" 2>"$W/server-unix.log" &
pids+=($!)
"$KIT/cumux" serve --device cuda --listen tcp:0.0.0.0:0 >"$W/server-tls.out" 2>"$W/server-tls.log" &
pids+=($!)
"$KIT/cumux" serve --device cuda --listen tcp:127.0.0.1:0 >"$W/server-plain.out" 2>"$W/server-plain.log" &
pids+=($!)
for s in unix tls plain; do
    for _ in $(seq 600); do grep -q listening "$W/server-$s.out" 2>/dev/null && break; sleep 0.1; done
    say "server $s: $(head -1 "$W/server-$s.out")"
done
PORT_tls=$(grep -o 'tcp:[^ ;]*' "$W/server-tls.out" | head -1 | awk -F: '{ print $NF }')
PRINT_tls=$(grep -o 'sha256:[0-9A-F:]*' "$W/server-tls.out" | head -1)
PORT_plain=$(grep -o 'tcp:[^ ;]*' "$W/server-plain.out" | head -1 | awk -F: '{ print $NF }')


STEP=(python3 "$ROOT/bench/h100/remote_step.py" "$STEPS" "$WARMUP")
export STEP_GPU_TIME=1
# run NAME ROUND: one process; a line of its medians.
run() {
    local name=$1 round=$2 file=$W/$1-r$2.txt
    case $name in
    native) timeout 300 "${STEP[@]}" >"$file" 2>&1 ;;
    shm) timeout 300 "$KIT/cumux" run --server "unix:$SOCK" -- "${STEP[@]}" >"$file" 2>&1 ;;
    tcp) timeout 300 "$KIT/cumux" run --server "tcp:127.0.0.1:$PORT_plain" -- "${STEP[@]}" >"$file" 2>&1 ;;
    tls-*)
        start_relay "$PORT_tls" "${name#tls-}" "$GBIT" || { say "$name: no relay"; return; }
        CUMUX_TLS_FINGERPRINT=$PRINT_tls timeout 300 "$KIT/cumux" run --server "tcp:$relay_at" -- \
            "${STEP[@]}" >"$file" 2>&1
        stop_relay ;;
    esac
    cp "$file" "$OUT/"
    python3 - "$file" "$name" "$round" <<'EOF' | tee -a "$REPORT"
import statistics as st, sys
path, name, rnd = sys.argv[1:]
wall, gpu, issue = [], [], []
for line in open(path):
    w = line.split()
    if w[:1] == ["step"] and len(w) >= 6:
        wall.append(float(w[5]))
    if w[:1] == ["gpu"] and len(w) >= 12:
        gpu.append(float(w[9])); issue.append(float(w[11]))
if not wall:
    tail = " ".join(open(path).read().split("\n")[-3:])[:200]
    print(f"run {name} round {rnd} FAILED {tail}")
else:
    print(f"run {name} round {rnd} wall {st.median(wall):.3f} gpu {st.median(gpu) if gpu else 0:.3f} "
          f"issue {st.median(issue) if issue else 0:.3f}")
EOF
}

names=()
for c in $CONFIGS; do
    if [ "$c" = tls ]; then for r in $RTTS; do names+=("tls-$r"); done; else names+=("$c"); fi
done
for round in $(seq "$ROUNDS"); do
    for n in "${names[@]}"; do
        [ "$(elapsed)" -ge "$BUDGET" ] && { say "budget spent at $(elapsed) s: $n round $round skipped"; continue; }
        run "$n" "$round"
    done
done

say ""
say "medians over rounds (ms): wall, GPU, issue; wall against native"
python3 - "$REPORT" "$OUT/$DATE-$SLUG-remote-rounds.json" "$GPU" "$DRIVER" "$CUDA" "$COMMIT" "$DATE" <<'EOF' | tee -a "$REPORT"
import json, statistics as st, sys
report, out, gpu, driver, cuda, commit, date = sys.argv[1:]
runs = {}
for line in open(report):
    w = line.split()
    if w[:1] == ["run"] and len(w) == 10:
        runs.setdefault(w[1], []).append({"round": int(w[3]), "wall": float(w[5]),
                                          "gpu": float(w[7]), "issue": float(w[9])})
med = {n: {k: st.median(r[k] for r in rs) for k in ("wall", "gpu", "issue")} for n, rs in runs.items()}
nat = med.get("native")
metrics = []
for n, m in med.items():
    ratio = f"{m['wall'] / nat['wall']:.3f}" if nat else "-"
    print(f"{n:10s} wall {m['wall']:8.3f}  gpu {m['gpu']:8.3f}  issue {m['issue']:8.3f}  x native {ratio}")
    if n == "native":
        continue
    for k, label in (("wall", "step_ms_p50"), ("gpu", "step_gpu_span_ms_p50"), ("issue", "step_issue_ms_p50")):
        native = nat[k] if nat else None
        metrics.append({"name": f"{label}_{n}", "unit": "ms", "better": "lower", "native": native,
                        "cumux": m[k], "ratio": round(m[k] / native, 3) if native else None,
                        "runs": len(runs[n]), "statistic": "median over rounds of each run's median step"})
json.dump({"suite": "remote-rounds", "date": date, "gpu": gpu, "driver": driver, "cuda": cuda,
           "commit": commit, "metrics": metrics, "rounds": runs}, open(out, "w"), indent=1)
EOF
