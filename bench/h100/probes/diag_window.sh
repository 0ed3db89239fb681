#!/usr/bin/env bash
# Where a tenant of the fair mix waits: four window-paced tenants (and a pair) through a
# `--policy fair` server of device-kit/turns, with `cumux status` 0.5-2 s into the window.
# Writes $OUT/diag.txt and $OUT/server.log. Run from the repository root on the GPU machine.
set -u
. bench/h100/lib.sh
W=$(mktemp -d); export TENANT_BLOCKS_PER_SM=8
"${NVCC:-nvcc}" -O2 -arch=sm_90 -o $W/tb bench/cuda/tenant_bench.cu
K=${KIT:-device-kit/turns}
$K/cumux serve --device cuda --policy fair --listen unix:$W/s.sock > $OUT/server.log 2>&1 &
srv=$!; for _ in $(seq 100); do [ -S $W/s.sock ] && break; sleep 0.1; done
declare -A IT=([20]=785 [200]=16755 [2000]=176817 [5]=1)
for set in "2000 5" "20 200 2000 5"; do
  echo "== mix $set" >> $OUT/diag.txt
  start_together 3
  tp=(); for us in $set; do $K/cumux run --server unix:$W/s.sock --tenant t$us -- $W/tb paced window ${IT[$us]} 3 > $W/o$us 2>&1 & tp+=($!); done
  sleep 3.5; for i in 1 2 3; do $K/cumux status --server unix:$W/s.sock >> $OUT/diag.txt 2>&1; sleep 0.7; done
  wait "${tp[@]}"
  for us in $set; do echo "t$us $(grep kernels_per_s $W/o$us)" >> $OUT/diag.txt; done
done
kill $srv
