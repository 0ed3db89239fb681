#!/usr/bin/env bash
# Where a tenant of the fair mix waits: four tenants paced STYLE (default streamsync) at
# once through a `--policy fair` server of $KIT, with `cumux status` every 0.25 s from
# the common start. Writes $OUT/diag.txt and $OUT/server.log. Run from the repository root.
set -u
. bench/h100/lib.sh
W=$(mktemp -d); export TENANT_BLOCKS_PER_SM=8
STYLE=${STYLE:-streamsync}
"${NVCC:-nvcc}" -O2 -arch=sm_90 -o "$W/tb" bench/cuda/tenant_bench.cu
K=${KIT:-device-kit/turns}
RUST_LOG=${RUST_LOG:-info} "$K/cumux" serve --device cuda --policy fair --listen "unix:$W/s.sock" > "$OUT/server.log" 2>&1 &
srv=$!; for _ in $(seq 100); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
declare -A IT=([20]=785 [200]=16755 [2000]=176817 [5]=1)
for set in "20 200 2000 5"; do
  echo "== mix $set $STYLE" >> "$OUT/diag.txt"
  start_together 4
  tp=(); for us in $set; do "$K/cumux" run --server "unix:$W/s.sock" --tenant "t$us" -- "$W/tb" paced "$STYLE" "${IT[$us]}" 2 > "$W/o$us" 2>&1 & tp+=($!); done
  while awk -v t="$TENANT_START_AT" -v n="$(date +%s.%N)" 'BEGIN { exit !(n < t) }'; do sleep 0.05; done
  for i in $(seq 12); do echo "-- $(date +%s.%N)" >> "$OUT/diag.txt"; "$K/cumux" status --server "unix:$W/s.sock" 2>&1 | awk '/^SESSION/,0' >> "$OUT/diag.txt"; sleep 0.25; done
  wait "${tp[@]}"
  for us in $set; do echo "t$us $(grep kernels_per_s "$W/o$us")" >> "$OUT/diag.txt"; done
done
kill $srv
