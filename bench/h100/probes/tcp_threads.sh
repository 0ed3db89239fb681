#!/usr/bin/env bash
# Which thread limits copies over loopback TCP: `cumux serve --device cuda`
# on a loopback port, bench/h100/probes/copy_loop.cu streaming 256 MiB
# copies through `cumux run` (CUMUX_LANES=LANES, default 4) for SECS seconds
# each way, while `top -H` samples every thread of the server, its worker and
# the client (their CPU % and names). Run from the repository root:
#   KIT=device-kit/new OUT=$OUT bench/h100/probes/tcp_threads.sh
set -u
KIT=${KIT:-device-kit/main}
OUT=${OUT:-/tmp/tcp-threads}
LANES=${LANES:-4}
SECS=${SECS:-6}
MIB=${MIB:-256}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p "$OUT"
T=$(mktemp -d)
"$NVCC" -O2 -arch=sm_90 -o "$T/copy_loop" bench/h100/probes/copy_loop.cu || exit 1
if [ -z "${CUMUX_REAL_LIBCUDA:-}" ]; then
    real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    [ -n "$real" ] && export CUMUX_REAL_LIBCUDA=$real
fi
echo "kit $KIT ($(cat "$KIT/COMMIT" 2>/dev/null)); lanes $LANES; $MIB MiB copies"
"$KIT/cumux" serve --device cuda --listen tcp:127.0.0.1:0 >"$T/server.out" 2>"$T/server.log" &
sp=$!
for _ in $(seq 100); do grep -q "tcp:" "$T/server.out" 2>/dev/null && break; sleep 0.1; done
addr=$(grep -o "tcp:[0-9.:]*" "$T/server.out" | head -1)
for dir in htod dtoh; do
    for mem in pinned pageable; do
        echo "== native $dir $mem: $("$T/copy_loop" "$dir" "$MIB" 2 "$mem")"
        CUMUX_LANES=$LANES "$KIT/cumux" run --server "$addr" -- "$T/copy_loop" "$dir" "$MIB" "$SECS" "$mem" >"$T/run.out" 2>&1 &
        rp=$!
        sleep $((SECS / 2))
        pids=$(pgrep -d, -f "cumux|copy_loop")
        top -H -b -d 1 -n 2 -p "$pids" | awk '/^top -/ { n++ } n == 2 && $9 + 0 > 3 { print "   ", $1, $9 "%", $12 }' | head -24 >"$T/top.txt"
        wait "$rp"
        echo "== cumux $dir $mem: $(cat "$T/run.out" | tail -1)"
        cat "$T/top.txt"
    done
done
kill "$sp"; wait "$sp" 2>/dev/null
rm -rf "$T"
