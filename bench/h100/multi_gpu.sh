#!/usr/bin/env bash
# Two GPUs through cumux, natively and through `cumux run` in the same run:
# tests/cuda/driver/two_devices.cu (isolated and shared), one PyTorch
# process on both GPUs (bench/h100/multi_gpu.py), and 2-rank PyTorch DDP over
# NCCL under torchrun (bench/h100/ddp.py), with which GPUs each rank's
# contexts took (nvidia-smi) while it ran. Writes $OUT/multi_gpu.txt,
# $OUT/DATE-GPUx2-multi-gpu.json and the runs' logs to
# $OUT/multi_gpu-logs.tar.gz.
#
#   OUT=/some/dir bench/h100/multi_gpu.sh
# Optional: KIT=, LIMIT= (seconds per run, default 240), ONLY=frameworks (JAX
# and torch.multiprocessing on both GPUs, bench/h100/multi_probe.py), ONLY=ddp (the DDP
# runs alone).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-multi-gpu}
LIMIT=${LIMIT:-240}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-multi-gpu.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
REPORT=$OUT/multi_gpu.txt
say() { echo "$*" | tee -a "$REPORT"; }
say "multi_gpu $(date -u +%FT%TZ) kit $(cat "$KIT/COMMIT" 2>/dev/null)"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$REPORT"
nvidia-smi topo -m >>"$REPORT" 2>&1

nvcc -o "$W/two_devices" "$ROOT/tests/cuda/driver/two_devices.cu" >"$W/nvcc.log" 2>&1 || say "nvcc failed"

start_server() { # SHARING
    rm -f "$W/s.sock"
    "$KIT/cumux" serve --device cuda --sharing "$1" --listen "unix:$W/s.sock" >"$W/server-$1.log" 2>&1 &
    server=$!
    for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
}
stop_server() { kill "$server"; wait "$server" 2>/dev/null; }

# side NAME CMD...: one line: exit code, seconds, the last PASS/FAIL/error line.
side() {
    local name=$1 start=$SECONDS rc
    shift
    timeout "$LIMIT" "$@" >"$W/$name.log" 2>&1
    rc=$?
    say "$name: rc=$rc in $((SECONDS - start)) s: $(grep -E 'PASS|FAIL|SKIP|Error|error' "$W/$name.log" | tail -1)"
}
losses() { grep -E '^step [0-9]+ loss' "$W/$1.log" | md5sum | cut -c1-12; }
RUN=("$KIT/cumux" run --server "unix:$W/s.sock" --)

# Frameworks on both GPUs (bench/h100/multi_probe.py): JAX's pmap and psum
# (XLA's NCCL), and a CUDA tensor handed to a child by torch.multiprocessing.
if [ "${ONLY:-all}" = all ] || [ "${ONLY:-all}" = frameworks ]; then
    for probe in jax share; do
        side "$probe-native" python3 "$ROOT/bench/h100/multi_probe.py" "$probe"
        for sharing in isolated shared; do
            start_server "$sharing"
            CUMUX_LOG=info,cumux_client=debug side "$probe-cumux-$sharing" "${RUN[@]}" python3 "$ROOT/bench/h100/multi_probe.py" "$probe"
            grep -h '^check' "$W/$probe-cumux-$sharing.log" | sed 's/^/  /' | tee -a "$REPORT"
            grep -E -- '-> CUDA_ERROR|not supported|not implemented|WARN|panick' "$W/$probe-cumux-$sharing.log" |
                grep -v -E 'NOT_READY|cuGetProcAddress|context_storage|cuGetExportTable' | sed -E 's/^[0-9TZ:.-]+ +//' |
                sort | uniq -c | sort -rn | head -12 >>"$REPORT"
            stop_server
        done
    done
    [ "${ONLY:-all}" = frameworks ] && { say done; exit 0; }
fi

if [ "${ONLY:-all}" != ddp ]; then
side two-native "$W/two_devices"
grep -E "can_access_peer|peer_access" "$W/two-native.log" | sed 's/^/  native /' | tee -a "$REPORT"
for sharing in isolated shared; do
    start_server "$sharing"
    side "two-cumux-$sharing" "${RUN[@]}" "$W/two_devices"
    grep -E "can_access_peer|peer_access" "$W/two-cumux-$sharing.log" | sed 's/^/  cumux /' | tee -a "$REPORT"
    stop_server
done

side torch-native python3 "$ROOT/bench/h100/multi_gpu.py"
start_server isolated
side torch-cumux "${RUN[@]}" python3 "$ROOT/bench/h100/multi_gpu.py"
say "  losses native $(losses torch-native) cumux $(losses torch-cumux)"
else
start_server isolated
fi

DDP=(torchrun --standalone --nproc_per_node=2 "$ROOT/bench/h100/ddp.py")
NCCL_DEBUG=INFO side ddp-native "${DDP[@]}"
( sleep 25; nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv >"$W/ddp-apps.txt" 2>&1 ) &
NCCL_DEBUG=INFO CUMUX_LOG=info,cumux_client=debug side ddp-cumux "${RUN[@]}" "${DDP[@]}"
say "  losses native $(losses ddp-native) cumux $(losses ddp-cumux)"
grep -h allreduce_busbw "$W/ddp-native.log" "$W/ddp-cumux.log" | sed 's/^/  /' | tee -a "$REPORT"
grep -E 'via P2P|via SHM|via NET|NCCL WARN' "$W/ddp-cumux.log" | head -6 >>"$REPORT"
grep -E 'first used by' "$W/ddp-cumux.log" | head -8 >>"$REPORT"
grep -E -- '-> CUDA_ERROR|not supported|WARN' "$W/ddp-cumux.log" | sort | uniq -c | sort -rn | head -20 >>"$REPORT"
stop_server
# The results file (bench/README.md's shape): what both sides measured.
python3 - "$W" "$OUT" "$(cat "$KIT/COMMIT" 2>/dev/null)" <<'PY'
import datetime, hashlib, json, re, subprocess, sys
w, out, commit = sys.argv[1:]

def text(name):
    try:
        return open(f"{w}/{name}.log", errors="replace").read()
    except OSError:
        return ""

def number(name, key):
    m = re.search(rf"^{key}:\s*([0-9.]+)", text(name), re.M)
    return float(m.group(1)) if m else None

def losses(name):
    lines = [l for l in text(name).splitlines() if re.match(r"step \d+ loss", l)]
    return hashlib.md5("\n".join(lines).encode()).hexdigest() if lines else None

def figure(name, unit, better, native, cumux):
    ratio = cumux / native if native and cumux is not None else None
    return {"name": name, "unit": unit, "better": better, "native": native, "cumux": cumux, "ratio": ratio}

def same(a, b):
    return None if a is None or b is None else float(a == b)

gpu, driver = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.splitlines()[0].split(", ")
metrics = [
    figure("ddp_allreduce_busbw_gbs", "GB/s", "higher",
           number("ddp-native", "allreduce_busbw_gbs"), number("ddp-cumux", "allreduce_busbw_gbs")),
    figure("ddp_losses_equal", "bool", "higher", 1.0, same(losses("ddp-native"), losses("ddp-cumux"))),
    figure("torch_two_gpus_losses_equal", "bool", "higher", 1.0,
           same(losses("torch-native"), losses("torch-cumux"))),
    figure("can_access_peer", "bool", "higher",
           number("two-native", "can_access_peer"), number("two-cumux-isolated", "can_access_peer")),
]
result = {"suite": "multi-gpu", "date": datetime.date.today().isoformat(), "gpu": gpu, "gpus": 2,
          "driver": driver, "cuda": "13.0", "commit": commit, "metrics": metrics}
slug = re.sub(r"[^a-z0-9]+", "", gpu.lower().replace("nvidia", "").split()[0])
json.dump(result, open(f"{out}/{result['date']}-{slug}x2-multi-gpu.json", "w"), indent=1)
PY
cp "$W"/server-*.log "$W"/*.txt "$W"/*.log "$OUT/" 2>/dev/null
tar -C "$W" -czf "$OUT/multi_gpu-logs.tar.gz" . 2>/dev/null
rm -f "$OUT"/*.log
say done
