#!/usr/bin/env bash
# make paper: the paper's effects measured at small scale on fresh held-out problems, with larger test
# sets and longer GRPO than make demo, written to docs/paper.md (table, commands, seeds, plots). Every
# number in the report comes from this run's files; seeds are fixed, so a rerun from a fresh clone gives
# the same numbers (same machine, same thread counts).
#
#   scripts/paper.sh           the full run (about half an hour on 2 idle cores)
#   QUICK=1 scripts/paper.sh   the same wiring on tiny sizes (a few minutes; not quality)
# Env: OUT (work dir, default runs/paper or runs/paper-quick), B (binaries dir, default build),
#      REPORT (default docs/paper.md; QUICK writes OUT/paper.md), PAPER_BASE (a candidate base instead of
#      models/tiny-cotbudget-21k).
# A stage whose output is already in OUT is not rerun (an interrupted run resumes); rm -rf OUT starts over.
#
# Seeds: training problems 11 (SFT, GRPO, heads); test problems 31 (k = 1..8), 33 (easy, k = 1), 34 (hard,
# k = 2..8); validation problems 36 (hard), used only to choose the sampling temperature.
# Each command line run is appended to OUT/commands.txt, which the report quotes.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh
if [ "$QUICK" = 1 ]; then
  OUT=${OUT:-runs/paper-quick}; REPORT=${REPORT:-$OUT/paper.md}
  N_TRAIN=400 N_TEST=24 N_EASY=18 N_HARD=12 N_VAL=8 SFT_STEPS=6 GRPO_STEPS=3 GRPO_PROMPTS=4 HEADS_N=24
else
  OUT=${OUT:-runs/paper}; REPORT=${REPORT:-docs/paper.md}
  N_TRAIN=6000 N_TEST=1000 N_EASY=600 N_HARD=400 N_VAL=100 SFT_STEPS=600 GRPO_STEPS=350 GRPO_PROMPTS=16 HEADS_N=1000
fi
# The base: models/tiny-cotbudget-21k, the tiny base pretrained with chat-format thinking that states a budget
# and follows it (MIX=cotbudget in scripts/build_tiny_base.sh, 14400 steps, then resumed to 21600: its README.md;
# terse trace at 32 tokens, concise above), so that a masked adapter can read the budget from the prompt states.
# Chosen on 1000 validation problems (seed 37, k = 1..8, greedy): of the tiny bases it gives masked SFT the
# smallest gap to --no-mask and GRPO the highest accuracy at every budget, while on models/tiny-cot GRPO gives one
# length at every budget (the numbers: docs/experiments.md "The tiny bases" and the models' README.md files).
BASE=${PAPER_BASE:-models/tiny-cotbudget-21k}
# Also chosen on that split (docs/experiments.md "Settings chosen on validation"): SFT_STEPS (masked SFT is still
# gaining at 600 steps; every SFT here runs as many) and the W4 base's transforms (none: fpt, closed-form or
# trained, gives QAMR no gain on the tiny base).
W4_TRANSFORMS=none
# And the SFT records' responses: verbose traces, 2% direct answers and 4% the budget's short form (terse at 32,
# concise at 64 and 128), so that the adapter holds the short forms GRPO can move to, each tied to the budget it
# serves: with no short forms GRPO shortens less, and short forms drawn at every budget make GRPO give one length
# for every budget (validation numbers: docs/experiments.md "Settings chosen on validation").
SFT_KEYS=terse@32:4,concise@64:4,concise@128:4,direct:2,verbose:94
BUDGETS="32 64 128"
EVAL_BUDGET=64                       # the budget stated where a single one is needed
SYS() { echo "Think for at most $1 tokens."; }
mkdir -p "$OUT" "$(dirname "$REPORT")"
# run LOG CMD...: runs CMD quietly into LOG unless LOG says it finished ("#done" last line); on failure
# shows the log's tail and stops the run.
run() {
  local log=$1; shift
  if [ -f "$log" ] && [ "$(tail -1 "$log")" = "#done" ]; then return 0; fi
  local a q=()
  for a in "$@"; do  # quoted for a shell where it needs it
    case $a in *\'*) q+=("$(printf '%q' "$a")") ;; *[!A-Za-z0-9_./,=:+-]*) q+=("'$a'") ;; *) q+=("$a") ;; esac
  done
  echo "${q[*]}" >> "$OUT/commands.txt"
  if ! "$@" > "$log" 2>&1; then
    echo "paper: failed: $*" >&2; tail -5 "$log" >&2; exit 1
  fi
  echo "#done" >> "$log"
}
# ev NAME MODEL DATA BUDGET [erinfer flags]: greedy evaluation of the test problems with the budget stated.
ev() {
  local name=$1 model=$2 b=$3; shift 3
  run "$OUT/$name.log" $B/erinfer eval --model "$model" --data "$OUT/test.jsonl" --system "$(SYS "$b")" \
    --max-new 400 $T1 --output "$OUT/$name.jsonl" "$@"
}

[ -f "$BASE/model.safetensors" ] || { echo "paper: $BASE is missing (see $BASE/README.md)" >&2; exit 1; }

stage "1. data: training, test and validation problems (ertrain synth chains)"
synth() { [ -f "$OUT/$2.jsonl" ] || $B/ertrain synth chains --seed "$1" --out "$OUT/$2.jsonl" "${@:3}" > /dev/null; }
synth 11 train_chains --n "$N_TRAIN" --tokenizer "$BASE"
synth 31 test --n "$N_TEST"
synth 33 test_easy --n "$N_EASY" --max-steps 1
synth 34 test_hard --n "$N_HARD" --min-steps 2
synth 36 val_hard --n "$N_VAL" --min-steps 2
# The switcher's mix: three easy problems to one hard one.
cat "$OUT/test_easy.jsonl" <(head -n $((N_EASY / 3)) "$OUT/test_hard.jsonl") > "$OUT/test_mix.jsonl"
run "$OUT/sft-records.log" $PY scripts/budget_records.py "$OUT/train_chains.jsonl" "$OUT/sft.jsonl" --key "$SFT_KEYS" \
  --budgets "${BUDGETS// /,}" --seed 1

stage "2. masked-LoRA SFT on verbose traces ($SFT_KEYS), and standard LoRA SFT (--no-mask) on the same records"
sft() {  # sft OUTNAME THREADS [flags]
  local name=$1 threads=$2; shift 2
  run "$OUT/$name.log" $B/ertrain sft --model "$BASE" --data "$OUT/sft.jsonl" --out "$OUT/$name" --steps "$SFT_STEPS" \
    --batch 16 --lr 2e-3 --rank 16 --alpha 32 --seed 1 --threads "$threads" "$@"
}
sft sft 2

stage "3. GRPO, budgets $BUDGETS ($GRPO_STEPS steps x $GRPO_PROMPTS prompts); meanwhile --no-mask SFT, W4 + QAMR, evals"
grpo() {
  run "$OUT/grpo.log" $B/ertrain grpo --model "$BASE" --adapter "$OUT/sft" --data "$OUT/train_chains.jsonl" \
    --out "$OUT/grpo" --budgets "${BUDGETS// /,}" --group 8 --prompts "$GRPO_PROMPTS" --steps "$GRPO_STEPS" \
    --lr 5e-4 --drop-flat --seq-len 512 --seed 1 $T1
}
side() {
  sft sft-nomask 1 --no-mask
  run "$OUT/quant-w4.log" $B/ertrain quantize --model "$BASE" --out "$OUT/base-w4" --weights q4 --embeddings int8 \
    --transforms "$W4_TRANSFORMS" --calib "$OUT/train_chains.jsonl" --response-key verbose --calib-n 16 $T1
  run "$OUT/qamr-w4.log" $B/ertrain sft --model "$OUT/base-w4" --data "$OUT/sft.jsonl" --out "$OUT/qamr-w4" \
    --steps "$SFT_STEPS" --batch 16 --lr 2e-3 --rank 16 --alpha 32 --seed 1 $T1
  ev eval-nomask "$BASE" $EVAL_BUDGET --adapter "$OUT/sft-nomask"
  ev eval-w4 "$OUT/base-w4" $EVAL_BUDGET --adapter "$OUT/qamr-w4" --kv int8
  for b in $BUDGETS; do ev "eval-sft-b$b" "$BASE" "$b" --adapter "$OUT/sft"; done
  ev eval-base "$BASE" $EVAL_BUDGET --max-new 16
  ev eval-base-think "$BASE" $EVAL_BUDGET --prefix '<think>\n'
}
both grpo side

stage "4. greedy evaluation of GRPO per stated budget, and with the budget also enforced (--budget)"
# Enforced: the answer suffix is forced after B tokens and the answer gets 14 more (suffix and number).
evals_a() {
  for b in $BUDGETS; do
    ev "eval-grpo-forced-b$b" "$BASE" "$b" --adapter "$OUT/grpo" --budget "$b" --answer-tokens 14
  done
}
evals_b() { for b in $BUDGETS; do ev "eval-grpo-b$b" "$BASE" "$b" --adapter "$OUT/grpo"; done; }
both evals_a evals_b

stage "5. switcher and verifier heads (ertrain heads; verifier on the adapter's states, correct and wrong samples)"
run "$OUT/heads.log" $B/ertrain heads --model "$BASE" --adapter "$OUT/grpo" --data "$OUT/train_chains.jsonl" \
  --limit "$HEADS_N" --system "$(SYS $EVAL_BUDGET)" --samples 8 --temperature 0.5 --max-new 160 \
  --verifier-adapter-on --switcher-out "$OUT/heads/switcher" --verifier-out "$OUT/heads/verifier" --seed 1 $T1

# pipe NAME DATA T [flags]: N = 1..8 samples sharing the prompt, majority and verifier-weighted votes.
pipe() {
  local name=$1 data=$2 t=$3; shift 3
  run "$OUT/$name.log" $B/erinfer eval --model "$BASE" --adapter "$OUT/grpo" --verifier "$OUT/heads/verifier" \
    --data "$data" --system "$(SYS $EVAL_BUDGET)" --temperature "$t" --seed 1 --max-new 160 --vote-n 1,2,4,8 \
    --kv int8 $T1 --output "$OUT/$name.jsonl" "$@"
}
stage "6. the sampling temperature, chosen on the validation problems by verifier-weighted accuracy at N = 8"
val_a() { pipe val-T0.3 "$OUT/val_hard.jsonl" 0.3; pipe val-T0.8 "$OUT/val_hard.jsonl" 0.8; }
val_b() { pipe val-T0.5 "$OUT/val_hard.jsonl" 0.5; }
both val_a val_b
T=$($PY - "$OUT" 0.3 0.5 0.8 <<'PY'
import sys
def weighted8(log):
    rows = [l.split() for l in open(log) if len(l.split()) == 6 and l.split()[0].isdigit()]
    return float(rows[-1][3])
out, temps = sys.argv[1], sys.argv[2:]
print(max(temps, key=lambda t: (weighted8(f"{out}/val-T{t}.log"), -float(t))))
PY
)
echo "temperature $T" | tee "$OUT/temperature.txt"

stage "7. test: votes on the hard problems; the switcher on the easy/hard mix against always reasoning (T = $T)"
pipe_votes() { pipe votes "$OUT/test_hard.jsonl" "$T"; }
pipe_mix() {
  pipe mix-route "$OUT/test_mix.jsonl" "$T" --switcher "$OUT/heads/switcher"
  pipe mix-always "$OUT/test_mix.jsonl" "$T"
}
both pipe_votes pipe_mix

stage "8. the report"
$PY scripts/paper_report.py --out "$OUT" --report "$REPORT" --base "$BASE" --sft-keys "$SFT_KEYS" \
  --budgets "${BUDGETS// /,}" --eval-budget "$EVAL_BUDGET" --quick "$QUICK" --seconds "$(elapsed)" \
  --load "$(cut -d' ' -f2 /proc/loadavg)"
echo "paper: finished in $(elapsed) s"
