"""What the CPU benchmarks share: building bench/cuda/microbench, starting a
`cumux serve` on a private unix socket, running microbench through `cumux run`
and reading its `metric` lines, comparing two columns by their median over the
rounds, and the facts about the run (commit, host) that go into the JSON."""

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NVCC_ROOT = os.path.join(ROOT, ".venv/lib/python3.11/site-packages/nvidia/cu13")


def build_microbench(out_dir):
    """bench/cuda/microbench.cu built by NVCC= (else the nvcc in .venv)."""
    exe = os.path.join(out_dir, "microbench")
    nvcc = os.environ.get("NVCC") or os.path.join(NVCC_ROOT, "bin/nvcc")
    libs = [] if os.environ.get("NVCC") else ["-L" + os.path.join(NVCC_ROOT, "lib")]
    subprocess.run(
        [nvcc, "-O2", "-arch=sm_90", *libs, "-o", exe,
         os.path.join(ROOT, "bench/cuda/microbench.cu")],
        check=True,
    )
    return exe


def start_server(cumux, work, name, device, env=None):
    """`cumux serve --device DEVICE --memory 2G` on `WORK/NAME.sock` (its log
    in `WORK/NAME-server.log`), once it listens: (process, address)."""
    sock = os.path.join(work, f"{name}.sock")
    server = subprocess.Popen(
        [cumux, "serve", "--device", device, "--memory", "2G", "--listen", f"unix:{sock}"],
        env=env, stdout=subprocess.DEVNULL,
        stderr=open(server_log(work, name), "w"),
    )
    deadline = time.time() + 30
    while not os.path.exists(sock):
        if time.time() > deadline or server.poll() is not None:
            server.kill()
            sys.exit(f"cumux serve ({name}) did not start")
        time.sleep(0.05)
    return server, f"unix:{sock}"


def server_log(work, name):
    return os.path.join(work, f"{name}-server.log")


def run_microbench(cumux, address, exe, args, env, timeout, what):
    """microbench ARGS through `cumux run` with `env`: its metrics by name.
    A failed run ends the benchmark, saying `microbench WHAT failed`."""
    out = subprocess.run(
        [cumux, "run", "--server", address, "--", exe, *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    if out.returncode != 0:
        sys.exit(f"microbench {what} failed:\n{out.stdout}\n{out.stderr}")
    metrics = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "metric":
            metrics[parts[1]] = float(parts[2])
    return metrics


def compare_medians(kept, samples, base, other, unit, skip_missing=False):
    """One row per kept metric (name -> which way is better): the median of
    the rounds in columns `base` and `other`, their ratio, and every round."""
    metrics = []
    for name, better in kept.items():
        if skip_missing and (name not in samples[base] or name not in samples[other]):
            continue
        first = statistics.median(samples[base][name])
        second = statistics.median(samples[other][name])
        metrics.append({
            "name": name,
            "unit": unit(name),
            "better": better,
            base: round(first, 4),
            other: round(second, 4),
            "ratio": round(second / first, 4) if first else None,
            f"{base}_rounds": samples[base][name],
            f"{other}_rounds": samples[other][name],
        })
    return metrics


def run_facts():
    """The commit benchmarked and the host it ran on."""
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), platform.processor())
    return {
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "host": f"{cpu}, {os.cpu_count()} cores",
    }


def write_result(result, out):
    """Prints the result as JSON, and writes it to `out` when given."""
    text = json.dumps(result, indent=2) + "\n"
    if out:
        with open(out, "w") as f:
            f.write(text)
    print(text)
