#!/usr/bin/env bash
# One hop of the shared-memory transport on this host: each kit's
# `ring_latency` example (crates/protocol/examples) with its two threads on
# several pairs of CPUs (siblings, same socket, far apart). A kit's
# ring_latency is `cargo build --release -p cumux-protocol --example
# ring_latency`'s, from target/release/examples. Run from the repository root:
#   KITS="device-kit/a device-kit/b" OUT=$OUT bench/h100/probes/ring_hops.sh
set -u
KITS=${KITS:?kits holding ring_latency}
OUT=${OUT:-/tmp/ring-hops}
ROUNDS_EACH=${ROUNDS_EACH:-200000}
mkdir -p "$OUT"
{
    lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node[0-9]* CPU)" || true
    echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
    n=$(nproc)
    # A CPU's hyperthread sibling, if any, then one of the same socket, then the last one.
    sib=$(cut -d, -f2 /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null | cut -d- -f2)
    pairs="0,1 0,2 0,$((n / 2)) 0,$((n - 1))"
    [ -n "$sib" ] && [ "$sib" != 0 ] && pairs="0,$sib $pairs"
    echo "cpu0 siblings: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null); pairs: $pairs"
    for pin in $pairs; do
        for kit in $KITS; do
            echo "== pin $pin kit $kit ($(cat "$kit/COMMIT" 2>/dev/null))"
            PIN=$pin "$kit/ring_latency" "$ROUNDS_EACH"
        done
    done
} 2>&1 | tee "$OUT/ring_hops.txt"
