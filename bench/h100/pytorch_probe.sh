#!/usr/bin/env bash
# First look at stock PyTorch through cumux on the GPU machine: runs a ladder of
# small PyTorch steps natively and through `cumux run`, and records how far each
# gets and which driver entry points cumux lacks. Needs device-kit/ (prebuilt
# cumux + libcumux_client.so) and writes $OUT/pytorch_probe.txt. Every step
# records its exit status; a step that prints nothing gets the last line of
# its stderr in the table, so a timeout or a crash says so.
# Optional: STEP_TIMEOUT= (seconds per step and side, default 100), STEPS=
# (which steps), REPORT= (where the table goes, written a line per step so a
# cut-short run keeps the steps done), PROBE_LOG= (CUMUX_LOG for the cumux
# side, e.g. debug; each step's stderr stays in $OUT/pt_STEP_{native,cumux}.err).
# Measured 2026-11-23: the whole ladder takes over 300 s on the H100 (a step
# through cumux 20-40 s, most of it cuBLAS/cuDNN loading libraries), so a
# device run with a 300 s limit takes a subset via STEPS.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KIT=${KIT:-$ROOT/device-kit}
OUT=${OUT:-/tmp/cumux-pytorch}
mkdir -p "$OUT"
REPORT=${REPORT:-$OUT/pytorch_probe.txt}
: >"$REPORT"
WORK=$(mktemp -d /tmp/cumux-pt.XXXXXX)
SOCK=$WORK/s.sock
if [ -z "${CUMUX_REAL_LIBCUDA:-}" ]; then
    real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ { print $NF; exit }')
    [ -n "$real" ] && export CUMUX_REAL_LIBCUDA=$real
fi
"$KIT/cumux" serve --device cuda --listen "unix:$SOCK" >"$OUT/pt_server.log" 2>&1 &
server=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done

cat >"$WORK/steps.py" <<'PY'
import faulthandler, sys, torch
faulthandler.enable()  # a crash leaves a stack in the step's stderr
step = sys.argv[1]
if step == "available":
    print(torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_device_name(0))
elif step == "tensor":
    x = torch.arange(16, device="cuda", dtype=torch.float32)
    print((x * 2 + 1).sum().item())
elif step == "matmul_fp32":
    torch.manual_seed(0)
    a = torch.randn(256, 256, device="cuda"); b = torch.randn(256, 256, device="cuda")
    print(float((a @ b).double().sum()))
elif step == "matmul_bf16":
    torch.manual_seed(0)
    a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16); b = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    print(float((a @ b).double().sum()))
elif step == "conv":
    torch.manual_seed(0)
    m = torch.nn.Conv2d(3, 8, 3).cuda(); x = torch.randn(2, 3, 32, 32, device="cuda")
    print(float(m(x).double().sum()))
elif step == "conv_notf32":
    # As conv, with TF32 off: cuDNN's algorithms then agree to fp32 rounding,
    # so a difference from native here is not an algorithm choice.
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    m = torch.nn.Conv2d(3, 8, 3).cuda(); x = torch.randn(2, 3, 32, 32, device="cuda")
    print(float(m(x).double().sum()))
elif step == "train":
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(32, 64, device="cuda"); y = torch.randint(0, 10, (32,), device="cuda")
    for _ in range(5):
        opt.zero_grad(); loss = torch.nn.functional.cross_entropy(m(x), y); loss.backward(); opt.step()
    print(float(loss))
elif step == "graph":
    x = torch.ones(1024, device="cuda"); s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * 2
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 2
    g.replay(); torch.cuda.synchronize(); print(float(y.sum()))
elif step == "autocast":
    # cuBLASLt's Hopper bf16 path: TMA descriptors built on the host.
    torch.manual_seed(0)
    a = torch.randn(1024, 1024, device="cuda"); b = torch.randn(1024, 1024, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        c = a @ b
    print(float(c.double().sum()))
elif step == "gpt":
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True, norm_first=True)
    m = torch.nn.Sequential(torch.nn.Embedding(256, 128), torch.nn.TransformerEncoder(layer, 2), torch.nn.Linear(128, 256)).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (8, 64), device="cuda")
    mask = torch.nn.Transformer.generate_square_subsequent_mask(64, device="cuda")
    for _ in range(5):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = m[1](m[0](x), mask=mask, is_causal=True)
            loss = torch.nn.functional.cross_entropy(m[2](h).float().view(-1, 256), x.view(-1))
        loss.backward(); opt.step()
    print(float(loss))
elif step == "compile":
    f = torch.compile(lambda a: torch.sin(a) * 2 + a)
    print(float(f(torch.ones(1024, device="cuda")).sum()))
PY
[ -n "${PROBE_LOG:-}" ] && export CUMUX_LOG=$PROBE_LOG
STEP_TIMEOUT=${STEP_TIMEOUT:-100}
STEPS=${STEPS:-available tensor matmul_fp32 matmul_bf16 autocast conv conv_notf32 train gpt graph compile}
# One side of one step: prints "OUTPUT" or "FAIL rc=N: last stderr line".
run_side() {
    local err=$1; shift
    local o rc
    timeout "$STEP_TIMEOUT" "$@" >"$err.out" 2>"$err"
    rc=$?
    o=$(tail -1 "$err.out")
    if [ -n "$o" ] && [ "$rc" = 0 ]; then
        printf '%s' "$o"
    else
        [ "$rc" = 124 ] && echo "timed out after ${STEP_TIMEOUT}s" >>"$err"
        [ "$rc" -gt 128 ] && [ "$rc" != 124 ] && echo "killed by signal $((rc - 128))" >>"$err"
        printf 'FAIL rc=%s: %s' "$rc" "$(grep -v '^\s*$' "$err" | tail -1 | cut -c1-100)"
    fi
}
printf '%-14s %-40s %s\n' step native cumux >>"$REPORT"
for step in $STEPS; do
    t0=$(date +%s)
    n=$(run_side "$OUT/pt_${step}_native.err" python3 "$WORK/steps.py" "$step")
    t1=$(date +%s)
    c=$(run_side "$OUT/pt_${step}_cumux.err" \
        "$KIT/cumux" run --server "unix:$SOCK" -- python3 "$WORK/steps.py" "$step")
    t2=$(date +%s)
    printf '%-14s %-40s %s   (%ss / %ss)\n' "$step" "$n" "$c" $((t1 - t0)) $((t2 - t1)) >>"$REPORT"
    grep -h "not implemented\|unknown table\|Error:\|error:" "$OUT/pt_${step}_cumux.err" \
        | sed 's/^[0-9T:.Z-]* *//' | sort | uniq -c | sort -rn | head -8 | sed 's/^/      /' >>"$REPORT"
done
kill $server 2>/dev/null
cat "$REPORT"
