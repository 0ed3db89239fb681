#!/usr/bin/env bash
# cumux's NVML on a GPU machine (there by default): nvidia-smi, pynvml and
# PyTorch as a tenant with a 4 GiB quota, beside NVIDIA's own view.
#   1. under fifo, while the tenant holds 1 GiB: nvidia-smi's table, its
#      memory, utilization and compute-apps queries, pynvml, and PyTorch's
#      NVML-backed calls (c10's DriverAPI looks NVML entry points up by name;
#      the caching allocator's expandable segments use it), which must pass;
#   2. under fair, while the tenant keeps the GPU busy with matmuls: the
#      tenant's utilization through nvidia-smi, and NVIDIA's;
#   3. with two GPUs or more: a tenant given only the second sees that one,
#      as its GPU 0;
#   4. under fifo (isolated workers), while two tenants run matmuls on GPU 0:
#      each one's utilization through nvidia-smi (NVIDIA's per-process
#      samples of its worker, read by the server), and NVIDIA's for the GPU.
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
pids=()
trap stop_all EXIT
describe_machine
REPORT=$OUT/nvml-probe.txt
say() { echo "$*" | tee -a "$REPORT"; }
say "# cumux NVML probe: $DATE, $GPU, driver $DRIVER, CUDA $CUDA, cumux $COMMIT"

cat >"$W/cumux.toml" <<'CONFIG'
[tenants.probe]
memory_quota = "4G"
[tenants.left]
memory_quota = "8G"
[tenants.right]
memory_quota = "8G"
[tenants.second]
memory_quota = "2G"
devices = [1]
CONFIG
GPUS=$(nvidia-smi -L | grep -c '^GPU')
[ "$GPUS" -ge 2 ] || sed -i '/^\[tenants.second\]/,$d' "$W/cumux.toml"
serve() { # policy [log name]
    "$KIT/cumux" serve --device cuda --policy "$1" --config "$W/cumux.toml" \
        --listen "unix:$W/s.sock" >"$W/server-${2:-$1}.log" 2>&1 &
    server=$!
    pids+=("$server")
    for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
}
RUN=("$KIT/cumux" run --server "unix:$W/s.sock" --tenant probe --)
QUERY=(nvidia-smi --query-gpu=name,memory.total,memory.used,utilization.gpu --format=csv)
APPS=(nvidia-smi --query-compute-apps=pid,used_memory --format=csv)

serve fifo
say "== 1. fifo: nvidia-smi natively"
timeout 30 "${QUERY[@]}" 2>&1 | tee -a "$REPORT"
HOLD='import torch,time; x=torch.empty(1<<30,dtype=torch.uint8,device="cuda"); print("holding",flush=True); time.sleep(40)'
timeout 60 "${RUN[@]}" python3 -c "$HOLD" >"$W/hold.log" 2>&1 &
holder=$!
pids+=("$holder")
for _ in $(seq 300); do grep -q holding "$W/hold.log" 2>/dev/null && break; sleep 0.1; done
say "== nvidia-smi through cumux while the tenant holds 1 GiB (holder pid $holder)"
timeout 30 "${RUN[@]}" nvidia-smi >"$W/smi.txt" 2>&1
say "rc=$?"
tee -a "$REPORT" <"$W/smi.txt"
for q in QUERY APPS; do
    declare -n cmd=$q
    say "\$ ${cmd[*]}"
    timeout 30 "${RUN[@]}" "${cmd[@]}" 2>&1 | tee -a "$REPORT"
done
say "== nvidia-smi -q (memory and utilization sections) through cumux"
timeout 30 "${RUN[@]}" nvidia-smi -q -d MEMORY,UTILIZATION 2>&1 | grep -vE '^\s*$' | tee -a "$REPORT"
say "== NVIDIA's view meanwhile"
timeout 30 "${APPS[@]}" 2>&1 | tee -a "$REPORT"
say "== pynvml through cumux"
timeout 60 "${RUN[@]}" python3 -c '
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
m = n.nvmlDeviceGetMemoryInfo(h)
print("count", n.nvmlDeviceGetCount(), "name", n.nvmlDeviceGetName(h))
print("memory total/used/free MiB", m.total >> 20, m.used >> 20, m.free >> 20)
print("driver", n.nvmlSystemGetDriverVersion(), "temperature", n.nvmlDeviceGetTemperature(h, 0))
print("processes", [(p.pid, p.usedGpuMemory >> 20) for p in n.nvmlDeviceGetComputeRunningProcesses(h)])
try: print("utilization", n.nvmlDeviceGetUtilizationRates(h))
except n.NVMLError as e: print("utilization:", e)
' 2>&1 | tee -a "$REPORT"
say "== PyTorch through cumux"
timeout 120 "${RUN[@]}" python3 -c '
import torch
print("mem_get_info MiB", [v >> 20 for v in torch.cuda.mem_get_info()])
for f in ("utilization", "memory_usage", "device_memory_used", "list_gpu_processes"):
    try: print(f, getattr(torch.cuda, f)())
    except Exception as e: print(f, "ERR", type(e).__name__, e)
' 2>&1 | tee -a "$REPORT"
for conf in "" "expandable_segments:True"; do
    PYTORCH_CUDA_ALLOC_CONF=$conf timeout 120 "${RUN[@]}" \
        python3 "$ROOT/bench/h100/pytorch_tenants.py" quota 4 0 >"$W/pt.log" 2>&1
    say "pytorch_tenants quota, alloc conf '${conf}': rc=$? $(grep -E 'PASS|FAIL|Error' "$W/pt.log" | tail -2 | tr '\n' ' ')"
done
kill "$holder" "$server" 2>/dev/null
wait "$holder" "$server" 2>/dev/null
rm -f "$W/s.sock"

serve fair
say "== 2. fair: utilization while the tenant runs matmuls for 8 s"
BUSY='import torch,time; a=torch.randn(4096,4096,device="cuda"); print("busy",flush=True)
t=time.time()
while time.time()-t<8: a=(a@a).clamp(-1,1); torch.cuda.synchronize()'
timeout 60 "${RUN[@]}" python3 -c "$BUSY" >"$W/busy.log" 2>&1 &
busy=$!
pids+=("$busy")
for _ in $(seq 300); do grep -q busy "$W/busy.log" 2>/dev/null && break; sleep 0.1; done
sleep 3
say "through cumux:"
timeout 30 "${RUN[@]}" "${QUERY[@]}" 2>&1 | tee -a "$REPORT"
say "NVIDIA's:"
timeout 30 "${QUERY[@]}" 2>&1 | tee -a "$REPORT"
wait "$busy"
say "busy rc=$? $(tail -1 "$W/busy.log")"
sleep 1.5
say "through cumux after it ended:"
timeout 30 "${RUN[@]}" "${QUERY[@]}" 2>&1 | tee -a "$REPORT"
if [ "$GPUS" -ge 2 ]; then
    say "== 3. a tenant given only GPU 1 (of $GPUS)"
    say "NVIDIA's:"
    nvidia-smi -L | tee -a "$REPORT"
    say "through cumux:"
    timeout 30 "$KIT/cumux" run --server "unix:$W/s.sock" --tenant second -- nvidia-smi -L 2>&1 | tee -a "$REPORT"
    timeout 30 "$KIT/cumux" run --server "unix:$W/s.sock" --tenant second -- \
        nvidia-smi --query-gpu=index,pci.bus_id,memory.total --format=csv 2>&1 | tee -a "$REPORT"
fi
kill "$server" 2>/dev/null
wait "$server" 2>/dev/null
rm -f "$W/s.sock"

serve fifo fifo-two
say "== 4. fifo, isolated workers: two tenants run matmuls on GPU 0 for 10 s"
MATMUL='import torch,sys,time; n=int(sys.argv[1]); a=torch.randn(n,n,device="cuda"); print("busy",flush=True)
t=time.time()
while time.time()-t<10: a=(a@a).clamp(-1,1); torch.cuda.synchronize(); time.sleep(float(sys.argv[2]))'
two=()
for t in left:8192:0 right:2048:0.002; do
    IFS=: read -r name n pause <<<"$t"
    timeout 60 "$KIT/cumux" run --server "unix:$W/s.sock" --tenant "$name" -- \
        python3 -c "$MATMUL" "$n" "$pause" >"$W/busy-$name.log" 2>&1 &
    two+=("$!")
    pids+=("$!")
done
for name in left right; do
    for _ in $(seq 300); do grep -q busy "$W/busy-$name.log" 2>/dev/null && break; sleep 0.1; done
done
sleep 3
UTIL=(nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader)
for round in 1 2 3; do
    for name in left right; do
        say "round $round, tenant $name through cumux: $(timeout 30 "$KIT/cumux" run \
            --server "unix:$W/s.sock" --tenant "$name" -- "${UTIL[@]}" 2>&1 | head -1)"
    done
    say "round $round, NVIDIA's for the GPU: $(timeout 30 "${UTIL[@]}" 2>&1 | head -1)"
    say "round $round, NVIDIA's per process (pmon: pid, sm%):"
    timeout 30 nvidia-smi pmon -c 1 -s u -i 0 2>&1 | tee -a "$REPORT"
    sleep 1
done
wait "${two[@]}"
for name in left right; do say "busy $name: $(tail -1 "$W/busy-$name.log")"; done
say "== server logs (warnings)"
grep -hiE "warn|error" "$W"/server-*.log | head -20 | tee -a "$REPORT"
say done
