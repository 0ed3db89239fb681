#!/usr/bin/env bash
# The launch rate against the run's length: bench/cuda/microbench.cu's
# launch_rate natively and through KIT at COUNTS launches (alternating, each
# in a fresh process), to tell a start-up transient from a steady rate.
#   KIT=device-kit/new bench/h100/probes/rate_length.sh
set -u
KIT=${KIT:-device-kit/main}
COUNTS=${COUNTS:-20000 200000 2000000}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
T=$(mktemp -d)
"$NVCC" -O2 -arch=sm_90 -o "$T/mb" bench/cuda/microbench.cu || exit 1
if [ -z "${CUMUX_REAL_LIBCUDA:-}" ]; then
    real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    [ -n "$real" ] && export CUMUX_REAL_LIBCUDA=$real
fi
"$KIT/cumux" serve --device cuda --listen "unix:$T/s.sock" >"$T/server.log" 2>&1 &
sp=$!
for _ in $(seq 100); do [ -S "$T/s.sock" ] && break; sleep 0.1; done
echo "kit $KIT ($(cat "$KIT/COMMIT" 2>/dev/null))"
for round in 1 2; do
    for n in $COUNTS; do
        nat=$("$T/mb" launch_rate "$n" | awk '/launch_rate/ {print $3}')
        cum=$(${EXTRA_ENV:-} "$KIT/cumux" run --server "unix:$T/s.sock" -- "$T/mb" launch_rate "$n" | awk '/launch_rate/ {print $3}')
        echo "round $round n=$n native $nat cumux $cum ratio $(python3 -c "print(round($cum/$nat,3))")"
    done
done
kill "$sp"; wait "$sp" 2>/dev/null
rm -rf "$T"
