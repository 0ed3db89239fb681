#!/usr/bin/env bash
# Event marks on the GPU (client::marks): runs crates/cli/tests/cuda's
# event_window (an event window whose every wait checks its kernel's stamp in
# mapped memory, then a faulting kernel whose event wait must fail) and
# event_printf (device printf before the host's next line), and sync_window
# (stream and context synchronizes and synchronous pinned copies, each
# checked, then a fault) through KIT under
# isolated fifo, isolated fair and shared fifo, and counts the event waits
# that reached the server (hop trace). Run from the repository root:
#   KIT=device-kit/marks bench/h100/probes/marks_check.sh
set -u
KIT=${KIT:-device-kit/main}
NVCC=${NVCC:-$(command -v nvcc)}
. bench/h100/lib.sh
T=$(mktemp -d)
for p in event_window event_printf sync_window stream_printf; do "$NVCC" -O2 -arch=sm_90 -o "$T/$p" "crates/cli/tests/cuda/$p.cu"; done
for mode in isolated:fifo isolated:fair shared:fifo; do
    "$KIT/cumux" serve --device cuda --sharing "${mode%%:*}" --policy "${mode##*:}" \
        --listen "unix:$T/s.sock" >"$T/server.log" 2>&1 &
    sp=$!
    for _ in $(seq 100); do [ -S "$T/s.sock" ] && break; sleep 0.1; done
    for p in event_window event_printf sync_window stream_printf; do
        echo "== $mode $p"
        CUMUX_HOP_TRACE=$T/tr-$p-${mode//:/-} timeout 60 "$KIT/cumux" run --server "unix:$T/s.sock" -- "$T/$p" >"$T/out" 2>&1
        tail -3 "$T/out"
        # Device lines must come before the host's of the same number.
        case $p in *printf) python3 -c "
import sys; l = open(sys.argv[1]).read().split(chr(10))
bad = [i for i in range(6) if 'device line %d' % i in l and l.index('device line %d' % i) > l.index('host line %d' % i)]
print('printf order:', 'ok' if not bad else 'OUT OF ORDER at %s' % bad)" "$T/out" ;; esac
    done
    kill "$sp"; wait "$sp" 2>/dev/null; rm -f "$T/s.sock"
    grep -a -E "WARN|ERROR" "$T/server.log" | head -5
done
for d in "$T"/tr-event_window-*; do
    echo "$d: $(python3 bench/hop_trace.py "$d" --call EventSynchronize --top 0 2>&1 | head -1)"
done
for d in "$T"/tr-sync_window-*; do
    echo "$d: $(python3 bench/hop_trace.py "$d" --call StreamSynchronize --top 0 2>&1 | head -1)"
done
echo "== sync_window natively"
"$T/sync_window" | tail -2
rm -rf "$T"
