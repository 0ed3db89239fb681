# Shared by the GPU machine's scripts (sourced): points cumux at the system's
# NVIDIA libcuda.so.1 unless CUMUX_REAL_LIBCUDA already says which.
if [ -z "${CUMUX_REAL_LIBCUDA:-}" ]; then
    real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    [ -n "$real" ] && export CUMUX_REAL_LIBCUDA=$real
fi
