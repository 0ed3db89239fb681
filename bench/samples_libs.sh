# Shared by bench/h100/samples.sh and bench/cpu/census.sh: which of NVIDIA's
# samples to build, and the link arguments each needs (sourced, not run).

# sample_libs DIR SAMPLES: prints the nvcc link arguments the sample in DIR
# needs; fails for a sample without CUDA sources, or one that needs graphics
# or a library these machines lack.
sample_libs() {
    local dir=$1 samples=$2 name libs src
    name=$(basename "$dir")
    ls "$dir"*.cu >/dev/null 2>&1 || return 1
    # -q -s: a match counts even where some of the globs name no file.
    if grep -q -s -E '#include *[<"](GL/|GLFW|helper_gl|cuda_gl_interop|EGL|vulkan|d3d|nvscisync|cudla|NvInfer|nvjpeg|npp|cudaEGL|X11|nvml|mpi\.h|cuda_egl)' "$dir"*.cu "$dir"*.cpp "$dir"*.h "$dir"*.cuh; then
        return 1
    fi
    libs=""
    src=$(cat "$dir"*.cu "$dir"*.cpp 2>/dev/null)
    grep -q -E '#include *<cuda\.h>|cuModule|cuCtx|cuLaunch|cuMem[A-Z]' <<<"$src" && libs+=" -lcuda"
    grep -q 'cublas' <<<"$src" && libs+=" -lcublas -lcublasLt"
    grep -q 'cufft' <<<"$src" && libs+=" -lcufft"
    grep -q 'curand' <<<"$src" && libs+=" -lcurand"
    grep -q 'cusolver' <<<"$src" && libs+=" -lcusolver"
    grep -q 'cusparse' <<<"$src" && libs+=" -lcusparse"
    grep -q 'nvrtc' <<<"$src" && libs+=" -lnvrtc"
    grep -q 'nvJitLink' <<<"$src" && libs+=" -lnvJitLink"
    grep -q -E '#include *<omp\.h>' <<<"$src" && libs+=" -Xcompiler -fopenmp -lgomp"
    grep -q 'helper_multiprocess\.h' <<<"$src" && libs+=" $samples/Common/helper_multiprocess.cpp -lrt"
    # Dynamic parallelism: relocatable device code and the device runtime.
    case $name in cdp*) libs+=" -rdc=true -lcudadevrt" ;; esac
    echo "$libs"
}
