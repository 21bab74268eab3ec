#!/usr/bin/env bash
# make bench: every benchmark, each printed as a ratio against a peer or a physical limit measured
# in the same run on the same machine and thread count.
set -euo pipefail
BUILD=${BUILD:-build}
PY=${PY:-/usr/bin/python3}
THREADS=${THREADS:-$(nproc)}
STEPS=${STEPS:-3}
LORA_R=${LORA_R:-16}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# Decode steps are many short parallel regions: whether OpenMP's threads spin or sleep between them moves the
# decode figures, so every run says which it had.
echo "OpenMP wait policy: ${OMP_WAIT_POLICY:-unset, the OpenMP default: threads spin briefly, then sleep}; load $(cut -d' ' -f1-3 /proc/loadavg)"

echo "== training step: ertrain vs PyTorch (threads $THREADS, batch 1 x 256 positions, fp32) =="
echo "   full: every parameter trained; lora: frozen base + rank-$LORA_R adapter on all seven linears"
"$BUILD/bench/train_step" --sgemm-peak --threads "$THREADS" | tee -a "$out"
has_torch=0
if "$PY" -c 'import torch' 2>/dev/null; then
  has_torch=1
else
  echo "WARNING: $PY has no torch: the PyTorch peer is SKIPPED (run scripts/deps.sh)"
fi
run_shape() { # name hidden layers heads kv ff [lora rank]
  local lora=${7:-0}
  "$BUILD/bench/train_step" --shape "$1" --batch 1 --seq 256 --steps "$STEPS" --threads "$THREADS" --lora "$lora" |
    tee -a "$out"
  if [ "$has_torch" = 1 ]; then
    "$PY" bench/train_step_torch.py --hidden "$2" --layers "$3" --heads "$4" --kv-heads "$5" --intermediate "$6" \
      --vocab 151936 --batch 1 --seq 256 --threads "$THREADS" --steps "$STEPS" --warmup 1 --lora "$lora" |
      sed "s/^{/{\"shape\": \"$1\", /" | tee -a "$out"
  fi
}
run_shape small 256 4 4 2 1024
run_shape 0.5b 896 24 14 2 4864
run_shape small 256 4 4 2 1024 "$LORA_R"
run_shape 0.5b 896 24 14 2 4864 "$LORA_R"

"$PY" - "$out" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
peak = next(r["gflops"] for r in rows if r["impl"] == "sgemm")
print()
print(f"sgemm peak: {peak:.1f} GFLOP/s")
def find(impl, shape, mode):
    return next((r for r in rows
                 if r["impl"] == impl and r.get("shape") == shape and r.get("mode", "full") == mode), None)
for mode, label in (("full", ""), ("lora", "LoRA step ")):
    for shape in ("small", "0.5b"):
        ours, torch = find("ertrain", shape, mode), find("pytorch", shape, mode)
        if not ours:
            continue
        name = shape if mode == "full" else f"{shape} LoRA r{ours['lora_r']}"
        line = (f"{name:14s} ertrain {ours['tokens_per_s']:8.1f} tok/s, {ours['gflops']:6.1f} GFLOP/s"
                f" = {ours['gflops'] / peak:5.1%} of sgemm peak")
        if torch:
            line += (f" | PyTorch {torch['tokens_per_s']:8.1f} tok/s"
                     f" | {label}ours/PyTorch = {ours['tokens_per_s'] / torch['tokens_per_s']:.2f}x")
        print(line)
PYEOF

for extra in bench/run_*.sh; do
  [ -f "$extra" ] && BUILD="$BUILD" PY="$PY" bash "$extra"
done
