"""cumux's NVML as pynvml (NVIDIA's Python bindings) reads it: a tenant's
program run by `cumux run` with CUMUX_NVML=on, against a real `cumux serve`
on the CPU device (CUMUX_BIN, or target/debug/cumux)."""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[4]
BINARY = os.environ.get("CUMUX_BIN", str(ROOT / "target/debug/cumux"))

# Runs inside the tenant's program: what pynvml says, as JSON.
PROBE = r"""
import json, pynvml as n
n.nvmlInit()
out = {"count": n.nvmlDeviceGetCount()}
h = n.nvmlDeviceGetHandleByIndex(0)
m = n.nvmlDeviceGetMemoryInfo(h)
out["memory"] = [m.total, m.used, m.free]
out["name"] = n.nvmlDeviceGetName(h)
out["uuid"] = n.nvmlDeviceGetUUID(h)
out["same_by_uuid"] = n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(out["uuid"])) == 0
u = n.nvmlDeviceGetUtilizationRates(h)
out["utilization"] = [u.gpu, u.memory]
out["processes"] = [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]
out["driver"] = n.nvmlSystemGetDriverVersion()
for call in ("nvmlDeviceGetTemperature", "nvmlDeviceGetHandleByIndex"):
    try:
        if call == "nvmlDeviceGetTemperature":
            n.nvmlDeviceGetTemperature(h, 0)
        else:
            n.nvmlDeviceGetHandleByIndex(1)
        out[call] = "ok"
    except n.NVMLError as e:
        out[call] = str(e)
n.nvmlShutdown()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def server():
    folder = tempfile.mkdtemp()
    config = pathlib.Path(folder, "cumux.toml")
    config.write_text('allow_unknown = false\n[tenants.alice]\nmemory_quota = "96M"\n')
    sock = f"{folder}/s.sock"
    proc = subprocess.Popen(
        [BINARY, "serve", "--device", "cpu", "--memory", "1G", "--config", str(config),
         "--listen", f"unix:{sock}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        if os.path.exists(sock):
            break
        time.sleep(0.1)
    yield sock
    proc.terminate()
    proc.wait(timeout=30)


def probe(sock, nvml="on"):
    env = dict(os.environ, CUMUX_NVML=nvml)
    env.pop("CUMUX_REAL_NVML", None)
    done = subprocess.run(
        [BINARY, "run", "--server", f"unix:{sock}", "--tenant", "alice", "--",
         sys.executable, "-c", PROBE],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_pynvml_sees_the_tenants_share(server):
    seen = probe(server)
    assert seen["count"] == 1
    total, used, free = seen["memory"]
    assert total == 96 << 20 and used == 0 and free == total, seen
    assert seen["uuid"].startswith("GPU-") and seen["same_by_uuid"], seen
    assert seen["utilization"] == [0, 0], seen
    assert seen["processes"] == [], seen
    assert seen["driver"].startswith("cumux-"), seen
    # No NVIDIA NVML on this machine: what only it could answer is not found.
    assert seen["nvmlDeviceGetTemperature"] == "Function Not Found", seen
    # The tenant has one device.
    assert seen["nvmlDeviceGetHandleByIndex"] == "Invalid Argument", seen
