#!/usr/bin/env bash
# Builds a tiny base model: a random configs/tiny.json model (or INIT's) pretrained on the synthetic
# "chains" task (data/synth.h) and, with GUESS_N, the guess-and-check family, deterministically, into a cache dir.
# The committed models/tiny-base is three runs of it (its README.md has the commands); the other mixes below are
# the experiments' bases (docs/experiments.md "The tiny bases").
#
# The pretraining data is a mixture made from one chains file:
#   - every record as a chat conversation with its "direct" completion ("Answer: 37"), so the base
#     answers directly in the chat format (and so fails long chains: k >= 4 steps in one go); half
#     of them with a system line stating a token budget ("Think for at most 64 tokens.", as GRPO and
#     the demo prompt). Masked LoRA cannot change how the base reads a prompt, so the base must have
#     seen every prompt form the adapter will be used with;
#   - as many one-step records again as chat with direct answers: single steps are what the base
#     should answer directly near-perfectly, and they are short, so cheap to add;
#   - every record again as raw text {"text": problem + "\n" + verbose trace} (no chat template), so
#     the base has seen the trace vocabulary and the step arithmetic ("19 * 5 = 95"). A base that
#     never sees those tokens leaves their tied embeddings at random, and masked-LoRA SFT on verbose
#     traces (adapter off on the prompt, embeddings frozen) stalls.
# MIX=budget (an experiment, docs/experiments.md "Does the length follow the stated budget?"): half of the raw
# texts state a budget after the problem and follow it (concise trace up to 64 tokens, verbose above), so the
# base passes the number on to its prompt states, where a masked adapter can read it.
# MIX=cot: every record once more as a chat conversation whose assistant turn opens the thinking
# ("<think>\n", the reasoning prefix SFT forces) and reasons briefly (the concise trace), as instruct
# models do when asked to think. The base's chat prompt states then serve step-by-step reading of the
# operands, which a masked adapter (off on the prompt) relies on; the verbose style stays the SFT's to
# teach. Direct answers stay twice as frequent, so the base still answers directly when nothing opens
# its thinking.
# MIX=cotbudget: as cot, but every thinking record states a budget and follows it: at 32 tokens the running
# values only (the terse trace, "27 21 26\nAnswer: 26"), above it the concise trace. The base's prompt states then
# carry the number, which a masked adapter reads to follow the budget (docs/experiments.md "Does the length
# follow the stated budget?"). Such a base answers one-step problems directly and opens its thinking on longer
# ones when a budget is stated.
# models/tiny-base starts from this mix at STEPS=14400, resumed to 21600.
# MIX=cotfit (an experiment, docs/experiments.md "The enforced-budget miss"): as cotbudget, but above 32 tokens
# the concise trace only where it fits the budget in tokens, else the terse one (at 64 the chains of 6-8 steps), so
# that the base's thinking fits an enforced budget too.
#
# GUESS_N=6000: the guess-and-check family (data/synth.h, `ertrain synth guess`) added to the mix, each record as the
# chains records are: a chat conversation with its direct answer (half with a budget system line), the problem with
# its verbose trace as raw text, and (MIX=cot*) the thinking opened with the concise trace (MIX=cotbudget: the terse
# one at 32 tokens).
#
# Usage: scripts/build_tiny_base.sh            MIX=direct at 3600 steps (~27 min on one core)
#        QUICK=1 scripts/build_tiny_base.sh    tiny variant for CI (seconds); cache runs/tiny-base-quick
# INIT=DIR: continued pretraining: the run starts from that fp32 model's weights (ertrain pretrain --init) instead
# of a random CONFIG model, with a fresh schedule; inputs.txt records the init model's hash.
#
# Env:   GUESS_N (guess-and-check records, default 0), INIT (a model dir to continue from), LR (peak learning rate,
#        default 2e-3), OUT (cache dir), THREADS (default 1: faster than 2 on a shared 2-core machine), B (binaries),
#        CONFIG (the model config, default configs/tiny.json), STEPS (pretraining steps, default 3600).
# The cache is reused when OUT/model holds a finished model whose recorded inputs (OUT/inputs.txt:
# every setting below and the hashes of the config, the tokenizer and the generated data) match.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=${QUICK:-0}
B=${B:-build}
THREADS=${THREADS:-1}
MIX=${MIX:-direct}
case $MIX in # the mix as inputs.txt names it
  direct) MIX_NAME=direct-chat+budget-system+verbose-text ;;
  budget) MIX_NAME=direct-chat+budget-system+budget-text ;;
  cot) MIX_NAME=direct-chat+budget-system+verbose-text+cot-chat ;;
  cotbudget) MIX_NAME=direct-chat+budget-system+verbose-text+cotbudget-chat ;;
  cotfit) MIX_NAME=direct-chat+budget-system+verbose-text+cotfit-chat ;;
  *) echo "build_tiny_base: MIX=$MIX is not direct, budget, cot, cotbudget or cotfit" >&2; exit 1 ;;
esac
GUESS_N=${GUESS_N:-0}
CONFIG=${CONFIG:-configs/tiny.json}
TOKENIZER=data/tiny_tokenizer
DATA_SEED=1
TRAIN_SEED=1
if [ "$QUICK" = 1 ]; then
  OUT=${OUT:-runs/tiny-base-quick}
  N=200 STEPS=20 BATCH=8 LR=2e-3
  [ "$GUESS_N" = 0 ] || GUESS_N=100
else
  OUT=${OUT:-runs/tiny-base}
  N=12000 STEPS=${STEPS:-3600} BATCH=16 LR=${LR:-2e-3}
fi
SEQ_LEN=640 # the longest raw trace (k = 8 with a recap) is ~560 tokens

for bin in "$B/ertrain"; do
  [ -x "$bin" ] || { echo "build_tiny_base: $bin not found; run make first" >&2; exit 1; }
done
mkdir -p "$OUT"
t_start=$(date +%s)

hash_of() { cat "$@" | sha256sum | cut -c1-16; }

# 1. Data: deterministic in (seed, n, ranges); cheap, so always regenerated and hashed.
chains="$OUT/chains.jsonl" one="$OUT/chains_k1.jsonl" mix="$OUT/pretrain_mix.jsonl"
$B/ertrain synth chains --n "$N" --seed "$DATA_SEED" --out "$chains" --tokenizer "$TOKENIZER" | sed 's/^/synth: /'
$B/ertrain synth chains --n "$N" --seed "$((DATA_SEED + 100))" --min-steps 1 --max-steps 1 --out "$one" \
  | sed 's/^/synth k=1: /'
guess="$OUT/guess.jsonl"
if [ "$GUESS_N" != 0 ]; then
  $B/ertrain synth guess --n "$GUESS_N" --seed "$((DATA_SEED + 200))" --out "$guess" --tokenizer "$TOKENIZER" \
    | sed 's/^/synth guess: /'
else
  : > "$guess"
fi
python3 - "$chains" "$one" "$mix.tmp" "$MIX" "$guess" <<'PY'
import json, random, sys
n_chat = n_one = n_text = 0
rng = random.Random(1)
budget_mix = sys.argv[4] == "budget"
cot_mix = sys.argv[4] in ("cot", "cotbudget", "cotfit")
cot_budget = sys.argv[4] in ("cotbudget", "cotfit")
cot_fit = sys.argv[4] == "cotfit"
n_cot = 0
def chat(line, reply=lambda r, b: r["direct"], always_budget=False):
    """A chat record answered by reply(record, budget or None) (default: the direct answer); half of them (all
    with always_budget) state a budget in a system line."""
    r = json.loads(line)
    b = rng.choice([32, 64, 128, 256]) if always_budget or rng.random() < 0.5 else None
    msgs = [{"role": "user", "content": r["problem"]}, {"role": "assistant", "content": reply(r, b)}]
    if b:
        msgs.insert(0, {"role": "system", "content": f"Think for at most {b} tokens."})
    return json.dumps({"messages": msgs, "answer": r["answer"]}) + "\n"
def cot(line):
    """The same problem in the chat format, the thinking opened and the concise trace after it; with
    MIX=cotbudget a budget is always stated, and at 32 tokens the trace is terse (running values only); with
    MIX=cotfit also where the concise trace is longer than the budget in tokens."""
    def terse(r, b):
        return b == 32 or (cot_fit and r["tokens"]["concise"] > b)
    if cot_budget:
        return chat(line, lambda r, b: "<think>\n" + (r["terse"] if terse(r, b) else r["concise"]), True)
    return chat(line, lambda r, b: "<think>\n" + r["concise"])
def text(r):
    """Problem and verbose trace; with MIX=budget half of them state a budget and follow it."""
    if budget_mix and rng.random() < 0.5:
        b = rng.choice([32, 64, 128, 256])
        return r["problem"] + f" Think for at most {b} tokens.\n" + (r["concise"] if b <= 64 else r["verbose"])
    return r["problem"] + "\n" + r["verbose"]
with open(sys.argv[1]) as f, open(sys.argv[2]) as one, open(sys.argv[3], "w") as g:
    for line, line1 in zip(f, one):
        r = json.loads(line)
        g.write(chat(line))
        g.write(chat(line1))
        g.write(json.dumps({"text": text(r)}) + "\n")
        if cot_mix:
            g.write(cot(line))
            n_cot += 1
        n_chat += 1
        n_one += 1
        n_text += 1
n_guess = 0
with open(sys.argv[5]) as f, open(sys.argv[3], "a") as g:
    for line in f:
        g.write(chat(line))
        g.write(json.dumps({"text": text(json.loads(line))}) + "\n")
        if cot_mix:
            g.write(cot(line))
        n_guess += 1
cot_what = ("budget stated, terse trace at 32 tokens" + (" and past the budget" if cot_fit else "") + ", concise above"
            if cot_budget else "concise trace")
print(f"mix: {n_chat} chat records (direct answers, k = 1..8, half with a budget system line) + "
      f"{n_one} chat records (direct, k = 1) + "
      f"{n_text} raw-text records "
      f"(problem + {'trace, half following a stated budget' if budget_mix else 'verbose trace'})"
      + (f" + {n_cot} chat records (thinking opened, "
         f"{cot_what})" if cot_mix else "")
      + (f"; guess-and-check: {n_guess} records, each as chat (direct), raw text (verbose)"
         f"{' and thinking chat' if cot_mix else ''}" if n_guess else ""))
PY
mv "$mix.tmp" "$mix"

inputs="config=$CONFIG:$(hash_of $CONFIG) tokenizer=$TOKENIZER:$(hash_of $TOKENIZER/tokenizer.json)
data=chains n=$N seed=$DATA_SEED$([ "$GUESS_N" = 0 ] || echo " guess n=$GUESS_N seed=$((DATA_SEED + 200))") mix=$MIX_NAME:$(hash_of "$mix")
pretrain steps=$STEPS batch=$BATCH lr=$LR seq_len=$SEQ_LEN seed=$TRAIN_SEED"
[ -z "${INIT:-}" ] || inputs="$inputs
init=$INIT:$(hash_of "$INIT/model.safetensors")"

# 2. The base: skipped when the cached model was built from the same inputs.
model="$OUT/model"
if [ -f "$model/model.safetensors" ] && [ -f "$OUT/inputs.txt" ] && [ "$(cat "$OUT/inputs.txt")" = "$inputs" ]; then
  echo "base: cached in $model (inputs match $OUT/inputs.txt); nothing to do"
  exit 0
fi
if [ -e "$model" ]; then
  echo "base: $model is stale or unfinished (inputs differ); rebuilding it"
  rm -rf "$model"
fi
rm -f "$OUT/inputs.txt"
echo "base: pretraining ${INIT:-$CONFIG} on $mix ($STEPS steps x $BATCH, lr $LR, $THREADS thread(s))"
start=(--config "$CONFIG")
[ -z "${INIT:-}" ] || start=(--init "$INIT")
cmd=($B/ertrain pretrain "${start[@]}" --tokenizer "$TOKENIZER" --data "$mix"
     --steps "$STEPS" --batch "$BATCH" --lr "$LR" --seq-len "$SEQ_LEN" --seed "$TRAIN_SEED" --threads "$THREADS"
     --eval-every $((STEPS / 4)) --out "$model")
echo "+ ${cmd[*]}"
"${cmd[@]}"
printf '%s\n' "$inputs" > "$OUT/inputs.txt"
echo "base: wrote $model in $(( $(date +%s) - t_start )) s; inputs recorded in $OUT/inputs.txt"
