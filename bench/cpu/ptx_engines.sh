#!/bin/sh
# The CPU device's two PTX engines side by side (issue 22): runs
# crates/ptx/examples/ptx_engines.rs, the corpus's 512x512 tiled matmul and
# 1M-element vector add kernels on the interpreter and on the compiler, and the
# same in plain Rust on every core, in one run, and prints the times and ratios (checking that both
# engines give the same bits and count the same instructions). With OUT, the
# table also goes there, under a header naming the commit and the machine.
# Needs NVIDIA's compiler (scripts/setup-nvcc puts it in .venv).
#
#   bench/cpu/ptx_engines.sh [OUT]
set -eu
cd "$(dirname "$0")/../.."
CUMUX_CUDA_HOME="${CUMUX_CUDA_HOME:-$(scripts/setup-nvcc)}"
export CUMUX_CUDA_HOME
cargo build -q -p cumux-ptx --example ptx_engines
run() {
    echo "# bench/cpu/ptx_engines.sh at $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d)"
    echo "# this machine, $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
    echo "# load average before the run: $(cut -d" " -f1-3 /proc/loadavg) (other builds share the machine)"
    cargo run -q -p cumux-ptx --example ptx_engines
}
if [ $# -ge 1 ]; then
    run | tee "$1"
else
    run
fi
