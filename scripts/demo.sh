#!/usr/bin/env bash
# make demo: the whole pipeline on the built-in tiny default (models/tiny-base), with the paper's table
# at small scale. Every number printed comes from this run; seeds are fixed, so reruns give the same
# table (same machine, same thread counts).
#
#   scripts/demo.sh            full run (about 10 minutes on 2 cores)
#   QUICK=1 scripts/demo.sh    the same wiring on tiny sizes (under a minute; CI checks the table's rows)
# Env: OUT (work dir, default runs/demo or runs/demo-quick), B (binaries dir, default build),
#      RESULTS (report, default docs/results.md; QUICK writes OUT/results.md).
#
# Stages: synthetic data → base eval (direct answers) → masked-LoRA SFT on verbose traces → GRPO with
# budgets → switcher + verifier heads → routed pipeline with N samples and voting → quantized bases
# (W4A16KV8 with transforms, W2 LUT) each with its QAMR adapter → TTFT and KV memory → report.
# Independent stages run two at a time, one thread each (the demo targets a 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh
if [ "$QUICK" = 1 ]; then
  OUT=${OUT:-runs/demo-quick}; RESULTS=${RESULTS:-$OUT/results.md}
  N_TRAIN=400 N_EVAL=24 SFT_STEPS=6 GRPO_STEPS=3 QAMR_STEPS=4 HEADS_N=24 HEADS_SAMPLES=4 CALIB_N=4
  # 6-step adapters rarely close their thinking, so no answer of theirs may be graded right: a wiring check
  # writes the one-class heads anyway.
  HEADS_FLAGS=--allow-one-class
else
  OUT=${OUT:-runs/demo}; RESULTS=${RESULTS:-docs/results.md}
  N_TRAIN=6000 N_EVAL=200 SFT_STEPS=150 GRPO_STEPS=250 QAMR_STEPS=150 HEADS_N=160 HEADS_SAMPLES=8 CALIB_N=16
fi
BUDGETS="32 64 128"
EVAL_BUDGET=64                       # the budget stated where a single one is needed
SYS() { echo "Think for at most $1 tokens."; }
mkdir -p "$OUT" "$(dirname "$RESULTS")"
# A rerun starts over: the training commands refuse to overwrite a finished run.
rm -rf "$OUT"/{sft,sft-unmasked,grpo,heads,base-w4,base-w2,qamr-w4,qamr-w2}
# Runs a command quietly into a log; on failure shows the log's tail and stops the demo.
run() {
  local log=$1; shift
  if ! "$@" > "$log" 2>&1; then
    echo "demo: failed: $*" >&2; tail -5 "$log" >&2; exit 1
  fi
}

[ -f "$BASE/model.safetensors" ] || { echo "demo: $BASE is missing (see $BASE/README.md)" >&2; exit 1; }

stage "1. synthetic reasoning data (ertrain synth chains)"
$B/ertrain synth chains --n "$N_TRAIN" --seed 11 --out "$OUT/train_chains.jsonl" --tokenizer "$BASE"
$B/ertrain synth chains --n "$N_EVAL" --seed 12 --out "$OUT/eval.jsonl" | head -1
# The routed pipeline's evaluation: half easy (k = 1) and half multi-step problems.
$B/ertrain synth chains --n $((N_EVAL / 2)) --seed 13 --max-steps 1 --out "$OUT/eval_easy.jsonl" | head -1
$B/ertrain synth chains --n $((N_EVAL / 2)) --seed 14 --min-steps 2 --out "$OUT/eval_hard.jsonl" | head -1
cat "$OUT/eval_easy.jsonl" "$OUT/eval_hard.jsonl" > "$OUT/eval_mix.jsonl"
# SFT records: each prompt states a budget (as GRPO's will), the response is the verbose trace.
$PY scripts/budget_records.py "$OUT/train_chains.jsonl" "$OUT/sft.jsonl" --key verbose --budgets ${BUDGETS// /,} \
  --seed 1

stage "2. the base model answers directly (erinfer eval, greedy)"
run "$OUT/eval-base.log" $B/erinfer eval --model "$BASE" --data "$OUT/eval.jsonl" --system "$(SYS $EVAL_BUDGET)" \
  --max-new 16 $T1 --output "$OUT/eval-base.jsonl"
grep -E '^(accuracy|mean generated tokens|tokens/s):' "$OUT/eval-base.log"

stage "3. masked-LoRA SFT on verbose traces (ertrain sft)"
run "$OUT/sft.log" $B/ertrain sft --model "$BASE" --data "$OUT/sft.jsonl" --out "$OUT/sft" --steps "$SFT_STEPS" \
  --batch 16 --lr 2e-3 --rank 16 --alpha 32 --seed 1 --threads 2
tail -1 "$OUT/sft.log"

stage "4. GRPO with budgets $BUDGETS (ertrain grpo), and the quantized bases (ertrain quantize) meanwhile"
grpo() {
  run "$OUT/grpo.log" $B/ertrain grpo --model "$BASE" --adapter "$OUT/sft" --data "$OUT/train_chains.jsonl" \
    --out "$OUT/grpo" --budgets "${BUDGETS// /,}" --group 8 --prompts 8 --steps "$GRPO_STEPS" --lr 5e-4 \
    --drop-flat --seq-len 512 --seed 1 $T1
}
quantize() {
  run "$OUT/quant-w4.log" $B/ertrain quantize --model "$BASE" --out "$OUT/base-w4" --weights q4 --embeddings int8 \
    --transforms fpt --calib "$OUT/train_chains.jsonl" --response-key verbose --calib-n "$CALIB_N" $T1
  run "$OUT/quant-w2.log" $B/ertrain quantize --model "$BASE" --out "$OUT/base-w2" --weights q2lut \
    --embeddings int8 --transforms fpt --calib "$OUT/train_chains.jsonl" --response-key verbose \
    --calib-n "$CALIB_N" $T1
  run "$OUT/qamr-w4.log" $B/ertrain sft --model "$OUT/base-w4" --data "$OUT/sft.jsonl" --out "$OUT/qamr-w4" \
    --steps "$QAMR_STEPS" --batch 16 --lr 2e-3 --rank 16 --alpha 32 --seed 1 $T1
}
both grpo quantize
tail -1 "$OUT/grpo.log"
grep -h "bits per weight\|NLL" "$OUT/quant-w4.log" "$OUT/quant-w2.log" | head -6 || true

stage "5. evaluation per budget: SFT vs GRPO (greedy), and QAMR on W2 meanwhile"
evals() {
  for b in $BUDGETS; do
    for a in sft grpo; do
      run "$OUT/eval-$a-b$b.log" $B/erinfer eval --model "$BASE" --adapter "$OUT/$a" --data "$OUT/eval.jsonl" \
        --system "$(SYS "$b")" --max-new 400 $T1 --output "$OUT/eval-$a-b$b.jsonl"
    done
  done
}
qamr_w2() {
  run "$OUT/qamr-w2.log" $B/ertrain sft --model "$OUT/base-w2" --data "$OUT/sft.jsonl" --out "$OUT/qamr-w2" \
    --steps "$QAMR_STEPS" --batch 16 --lr 2e-3 --rank 16 --alpha 32 --seed 1 $T1
}
both evals qamr_w2

stage "6. switcher and verifier heads (ertrain heads), and the quantized models' accuracy meanwhile"
# The heads' features on the int8 KV cache that stage 7 runs them on.
heads() {
  run "$OUT/heads.log" $B/ertrain heads --model "$BASE" --adapter "$OUT/grpo" --data "$OUT/train_chains.jsonl" \
    --limit "$HEADS_N" --system "$(SYS $EVAL_BUDGET)" --samples "$HEADS_SAMPLES" --max-new 160 \
    --switcher-out "$OUT/heads/switcher" --verifier-out "$OUT/heads/verifier" --kv int8 --seed 1 $T1 ${HEADS_FLAGS:-}
}
quant_evals() {
  # fp32 SFT adapter on fp32; the same fp32 adapter on the W4 base (no QAMR); QAMR adapters on their bases.
  local spec
  for spec in "fp32:$BASE:$OUT/sft:f32" "w4-noqamr:$OUT/base-w4:$OUT/sft:int8" "w4:$OUT/base-w4:$OUT/qamr-w4:int8" \
              "w2:$OUT/base-w2:$OUT/qamr-w2:int8"; do
    IFS=: read -r name model adapter kv <<< "$spec"
    run "$OUT/eval-q-$name.log" $B/erinfer eval --model "$model" --adapter "$adapter" --data "$OUT/eval.jsonl" \
      --system "$(SYS $EVAL_BUDGET)" --max-new 400 --kv "$kv" $T1 --output "$OUT/eval-q-$name.jsonl"
  done
}
both heads quant_evals
grep -h "ROC-AUC" "$OUT/heads.log" || true

stage "7. the routed pipeline: switcher, N samples sharing the prompt, verifier-weighted vote (erinfer eval)"
pipe_route() {
  run "$OUT/pipeline.log" $B/erinfer eval --model "$BASE" --adapter "$OUT/grpo" --switcher "$OUT/heads/switcher" \
    --verifier "$OUT/heads/verifier" --data "$OUT/eval_mix.jsonl" --system "$(SYS $EVAL_BUDGET)" --temperature 0.8 \
    --seed 1 --max-new 160 --vote-n 1,2,4,8 --kv int8 $T1 --output "$OUT/pipeline.jsonl"
}
pipe_always() {
  run "$OUT/pipeline-always.log" $B/erinfer eval --model "$BASE" --adapter "$OUT/grpo" \
    --verifier "$OUT/heads/verifier" --data "$OUT/eval_mix.jsonl" --system "$(SYS $EVAL_BUDGET)" --temperature 0.8 \
    --seed 1 --max-new 160 --vote-n 1,2,4,8 --kv int8 $T1 --output "$OUT/pipeline-always.jsonl"
}
both pipe_route pipe_always
sed -n '/^ *N /,/^accuracy/p' "$OUT/pipeline.log"

stage "8. speed: decode tokens/s per base, TTFT with the prompt KV reused, KV bytes (erinfer bench)"
for m in "fp32:$BASE" "w4:$OUT/base-w4" "w2:$OUT/base-w2"; do
  IFS=: read -r name model <<< "$m"
  $B/erinfer bench --model "$model" --adapter "$OUT/sft" --json --threads 1 > "$OUT/bench-$name.json"
done
# The same adapter weights marked unmasked: the runtime must recompute the prompt with the adapter on.
rm -rf "$OUT/sft-unmasked" && cp -r "$OUT/sft" "$OUT/sft-unmasked"
$PY - "$OUT/sft-unmasked/adapter_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["er_mask"] = "all"; json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
$B/erinfer bench --model "$BASE" --adapter "$OUT/sft-unmasked" --json --threads 1 > "$OUT/bench-unmasked.json"

stage "9. the report"
$PY scripts/demo_report.py --out "$OUT" --results "$RESULTS" --budgets ${BUDGETS// /,} --eval-budget "$EVAL_BUDGET" \
  --quick "$QUICK" --seconds "$(elapsed)"
echo "demo: finished in $(elapsed) s"
