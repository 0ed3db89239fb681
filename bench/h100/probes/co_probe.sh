#!/usr/bin/env bash
# tests/cuda/driver/cluster_occupancy.cu through cumux alone, with the client's debug log
# and the server's lines about clusters (from the repo root, KIT= the kit).
K=${KIT:-device-kit/main}; W=$(mktemp -d); . bench/h100/lib.sh
/usr/local/cuda/bin/nvcc -arch=sm_90 -Itests/cuda/driver -o $W/co tests/cuda/driver/cluster_occupancy.cu || exit 1
$K/cumux serve --device cuda --listen unix:$W/s >$W/out 2>$W/serve.log & sp=$!
for i in $(seq 300); do grep -q listening $W/out && break; sleep 0.1; done
CUMUX_LOG=debug $K/cumux run --server unix:$W/s -- $W/co >$W/c.out 2>$W/c.err; echo rc $?
cat $W/c.out | tail -3
grep -v GetProcAddress $W/c.err | grep -i -E "occupanc|cluster|error|invalid|400" | head -20
grep -i -E "cluster|occupanc|error|invalid" $W/serve.log | head -20
kill $sp
