#!/usr/bin/env bash
# Issue 23's framework suite on the GPU machine, natively and through `cumux
# run` in the same run: bench/h100/framework_suite.py's steps (JAX jit, grad,
# optax, FFT; CuPy cuBLAS, cuFFT, cuSOLVER, RawKernel, streams, pinned memory;
# numba-cuda; Triton; torch.fft and torch.linalg; a transformers GPT-2 forward
# and backward; PyTorch with expandable segments), a process per framework,
# compared within each step's tolerance by pytorch_suite.sh's machinery (run
# that too for cuDNN convolutions, CUDA graphs and torch.compile). Writes
# $OUT/framework-suite.txt and $OUT/DATE-GPU-framework.json.
#
#   OUT=/some/dir KIT=device-kit/main bench/h100/framework_suite.sh
# Optional: SERVE_ARGS= ("--sharing shared" for one shared context), and
# pytorch_suite.sh's KIT=, GROUP_TIMEOUT=, GPU_SLUG=.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
SUITE=$HERE/framework_suite.py SUITE_NAME=framework \
    GROUPS_OVERRIDE="jax_jit jax_grad jax_optax jax_fft;cupy_blas cupy_fft cupy_solve cupy_rawkernel cupy_streams cupy_pinned;numba_kernel;triton_kernel torch_fft torch_linalg;transformers_gpt2;expandable" \
    exec "$HERE/pytorch_suite.sh"
