#!/usr/bin/env bash
# Stock PyTorch as cumux tenants on the GPU machine, in `shared` mode under
# `fair`: a tenant with a 4 GiB quota (pytorch_tenants.py quota: what PyTorch
# sees, its out-of-memory error past the quota, memory given back) beside a
# tenant without one multiplying matrices in 16 GiB (pytorch_tenants.py work);
# `cumux status` while both run; the quota tenant killed mid-hold, and its
# memory back. Writes $OUT/pytorch-tenants.txt.
#
#   OUT=/some/dir bench/h100/pytorch_tenants.sh
# Optional: KIT=, DEVICE= (default cuda).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-pytorch-tenants}
DEVICE=${DEVICE:-cuda}
PY=$ROOT/bench/h100/pytorch_tenants.py
mkdir -p "$OUT"
W=$(mktemp -d /tmp/cumux-ptt.XXXXXX)
# shellcheck source=bench/h100/lib.sh
. "$ROOT/bench/h100/lib.sh"
REPORT=$OUT/pytorch-tenants.txt
: >"$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }
cat >"$W/tenants.toml" <<'TOML'
[tenants.small]
memory_quota = "4G"
[tenants.big]
weight = 1
TOML
CUMUX=$KIT/cumux
"$CUMUX" serve --device "$DEVICE" --sharing shared --policy fair --config "$W/tenants.toml" \
    --listen "unix:$W/s.sock" >"$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do [ -S "$W/s.sock" ] && break; sleep 0.1; done
run() { timeout 300 "$CUMUX" run --server "unix:$W/s.sock" --tenant "$@"; }
status() { "$CUMUX" status --json --server "unix:$W/s.sock" >"$W/status.json" 2>/dev/null; python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
rows = ["%s %.2f GiB (quota %s)" % (t["name"], t["mem_used"] / 2**30,
        "%.0f GiB" % (t["memory_quota"] / 2**30) if t["memory_quota"] else "none") for t in j["tenants"]]
print("; ".join(rows) or "no tenants", "| device used %.2f GiB" % (j["devices"][0]["used_mem"] / 2**30))
' "$W/status.json"; }

run big -- python3 "$PY" work 16 60 >"$W/big.out" 2>"$W/big.err" &
big=$!
sleep 3
run small -- python3 "$PY" quota 4 4 >"$W/small.out" 2>"$W/small.err" &
small=$!
for _ in $(seq 1200); do grep -q holding "$W/small.out" && break; sleep 0.1; done
say "while both run: $(status)"
wait "$small"
say "$(grep -E '^quota:' "$W/small.out" || (echo "quota: no result"; tail -5 "$W/small.err"))"

# Killed mid-hold: its memory comes back.
run small -- python3 "$PY" quota 4 120 >"$W/small2.out" 2>"$W/small2.err" &
for _ in $(seq 1200); do grep -q holding "$W/small2.out" && break; sleep 0.1; done
say "second quota tenant holding: $(status)"
t0=$(date +%s.%N)
pkill -9 -f "pytorch_tenants.py quota 4 120"
# Until the server has freed what it held.
for _ in $(seq 300); do status >/dev/null; grep -q '"small"' "$W/status.json" || break; sleep 0.05; done
say "after killing it ($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s): $(status)"
wait "$big"
say "$(grep -E '^work:' "$W/big.out" || (echo "work: no result"; tail -5 "$W/big.err"))"
for _ in $(seq 300); do status >/dev/null; grep -q '"big"' "$W/status.json" || break; sleep 0.05; done
say "after both: $(status)"
say "teardowns (launches, ms): $(sed 's/\x1b\[[0-9;]*m//g' "$OUT/server.log" | grep 'session closed' | grep -v 'launches=0 ' | sed -E 's/.*launches=([0-9]+).*teardown_ms=([0-9.]+).*/\1 \2;/' | tr '\n' ' ')"
kill "$server"
wait "$server" 2>/dev/null
rm -rf "$W"
