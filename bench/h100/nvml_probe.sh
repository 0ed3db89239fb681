#!/usr/bin/env bash
# cumux's NVML on a GPU machine (CUMUX_NVML=on): nvidia-smi as a tenant with a
# 4 GiB quota while it holds memory (its devices, memory and processes should
# be its own), natively for comparison; and PyTorch through cumux with the
# NVML in front (c10's DriverAPI looks up NVML entry points by name, and the
# caching allocator's expandable segments use it), which must still pass.
# Writes $OUT/nvml-probe.txt.
#
#   OUT=/some/dir bench/h100/nvml_probe.sh
# Optional: KIT= (cumux, libcumux_client.so, libcumux_nvml.so).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-nvml}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-nvml.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
REPORT=$OUT/nvml-probe.txt
say() { echo "$*" | tee -a "$REPORT"; }

cat >"$W/cumux.toml" <<'CONFIG'
[tenants.probe]
memory_quota = "4G"
CONFIG
"$KIT/cumux" serve --device cuda --config "$W/cumux.toml" --listen "unix:$W/s.sock" >"$W/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
RUN=("$KIT/cumux" run --server "unix:$W/s.sock" --tenant probe --)

say "== nvidia-smi natively"
timeout 30 nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv 2>&1 | tee -a "$REPORT"
HOLD='import torch,time; x=torch.empty(1<<30,dtype=torch.uint8,device="cuda"); print("holding",flush=True); time.sleep(20)'
say "== nvidia-smi through cumux while the tenant holds 1 GiB"
CUMUX_NVML=on timeout 60 "${RUN[@]}" python3 -c "$HOLD" >"$W/hold.log" 2>&1 &
holder=$!
for _ in $(seq 300); do grep -q holding "$W/hold.log" 2>/dev/null && break; sleep 0.1; done
CUMUX_NVML=on timeout 30 "${RUN[@]}" nvidia-smi >"$W/smi.txt" 2>&1
say "rc=$?"
tee -a "$REPORT" <"$W/smi.txt"
CUMUX_NVML=on timeout 30 "${RUN[@]}" nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv 2>&1 | tee -a "$REPORT"
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null

say "== PyTorch through cumux with CUMUX_NVML=on"
for conf in "" "expandable_segments:True"; do
    PYTORCH_CUDA_ALLOC_CONF=$conf CUMUX_NVML=on timeout 120 "${RUN[@]}" \
        python3 "$ROOT/bench/h100/pytorch_tenants.py" quota 4 0 >"$W/pt.log" 2>&1
    say "alloc conf '${conf}': rc=$? $(grep -E 'PASS|FAIL|Error' "$W/pt.log" | tail -2 | tr '\n' ' ')"
done
kill "$server"
wait "$server" 2>/dev/null
say done
