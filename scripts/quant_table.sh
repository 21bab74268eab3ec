#!/usr/bin/env bash
# The measured quantization table: every weight format of ertrain quantize / ertrain qat on one float
# base, with bits per weight, bytes, held-out NLL, reasoning accuracy with an adapter and decode speed;
# the W4 transforms (none / closed-form fpt / trained fpt) and the 2-bit rows again on the outlier test
# model (ertrain outliers: the same function with outlier channels), the W4 transforms' NLL also on its
# residual alignment alone (no norm-scale or MLP outliers, which folding undoes); then a speed/NLL-only
# part on a larger random model of 0.5B layer shapes (few layers).
#
#   scripts/quant_table.sh --model models/tiny-base --adapter-data SFT.jsonl --eval EVAL.jsonl --out DIR
#                          [--heldout-nll FILE.jsonl] [--steps N] [--eval-n N] [--threads T] [...]
#
# Inputs
#   --model DIR           the float base (fp32 HF dir with tokenizer), e.g. models/tiny-base
#   --adapter-data FILE   SFT conversations for the reasoning adapters (python3 scripts/budget_records.py
#                         CHAINS.jsonl OUT.jsonl); also QAT's training data unless --qat-data
#   --eval FILE           chains records (ertrain synth chains) graded by erinfer eval
#   --heldout-nll FILE    records erinfer score takes ({"text"} or {"prompt", "completion"}) whose NLL is
#                         measured; default: the --eval records as {"prompt": problem, "completion": verbose}
#   --out DIR             work dir; OUT/quant_table.md and OUT/quant_table.json are the results
# Options
#   --steps N             QAMR (SFT adapter) and QAT steps [40]
#   --eval-n N            eval records graded [100]      --heldout-n N   held-out records scored [200]
#   --sft-batch N [8]     --sft-lr X [2e-3]              --qat-lr X [5e-4]   --qat-batch N [8]
#   --outlier-sft-lr X    the learning rate of the outlier model's adapters [--sft-lr]
#   --qat-data FILE       QAT training records (loss on every position) [--adapter-data]
#   --recluster-every K   QAT codebook refresh [5]
#   --calib FILE          calibration records of every quantize row (Fisher, GPTQ codes, fpt-trained) [--adapter-data]
#   --calib-n N [16]      --fpt-steps N [200]          --fpt-local-steps N [100]
#   --sparse S            dense-and-sparse corrections per row of the "q2 LUT + S sparse" rows [2]
#   --no-outliers         skips the outlier-model sections (ertrain outliers --calib CALIB --seed 1: residual
#                         alignment + norm-scale and MLP outliers; and with --min 1 --max 1: the alignment alone)
#   --qamr-all            also train an adapter on every base (a column "acc, own adapter")
#   --large-config FILE   config of the larger random model [configs/qwen05b-2l.json]; --no-large skips it
#   --large-heldout-n N   held-out records scored on the larger model [40]
#   --threads T           threads of every command [1]
# Env: B (binaries, default build), PY (python3).
#
# Rows and adapters. The accuracy column uses the reasoning adapter named in the "adapter" column:
#   fp32                         an SFT adapter trained on the fp32 base (--steps steps)
#   bf16 .. q2 LUT               that same fp32 adapter on the quantized base (no re-training): what a
#                                format costs an adapter trained in float
#   X + QAMR                     an adapter trained on base X itself (quantization-aware multi-rank SFT:
#                                same recipe, frozen quantized base); the transformed bases need their own
#                                (an adapter trained before a transform does not fit the transformed weights)
#   q2 QAT + QAMR                ertrain qat (--steps, fake-quantized q2lut), then the same SFT recipe on it
# Eval: greedy, --system "Think for at most 64 tokens.", --max-new 400. NLL: erinfer score, token-weighted
# mean over the held-out records. Speed: erinfer bench --json --new-tokens 128, first row (KV f32, N = 1)
# tokens_per_s_seq.
# bits/weight: the layer projections, scales and codebooks included (quantization_config.bits_per_weight);
# bytes: the weights as loaded (erinfer bench weight_bytes). Every quantize row but bf16 runs with the same
# calibration (--calib, first --calib-n records: Fisher weighting; q2lut also GPTQ codes; fpt-trained its
# training), embeddings int8; the q4 rows keep an 8-bit lm_head (--lm-head q8), as the tied rows have it.
#
# Idempotent-ish: a step whose output is complete is skipped on a rerun (delete its dir to redo it); a
# half-written output dir is removed and redone.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
PY=${PY:-python3}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

MODEL="" ADAPTER_DATA="" EVAL="" HELDOUT="" OUT=""
STEPS=40 EVAL_N=100 HELDOUT_N=200 SFT_BATCH=8 SFT_LR=2e-3 OUTLIER_SFT_LR="" QAT_LR=5e-4 QAT_BATCH=8 QAT_DATA=""
RECLUSTER=5 QAMR_ALL=0 LARGE=1 LARGE_CONFIG=configs/qwen05b-2l.json LARGE_HELDOUT_N=40 THREADS=1
CALIB="" CALIB_N=16 FPT_STEPS=200 FPT_LOCAL=100 OUTLIERS=1 SPARSE=2
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "quant_table: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --adapter-data) ADAPTER_DATA=$2; shift 2 ;;
    --eval) EVAL=$2; shift 2 ;;
    --heldout-nll) HELDOUT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --eval-n) EVAL_N=$2; shift 2 ;;
    --heldout-n) HELDOUT_N=$2; shift 2 ;;
    --sft-batch) SFT_BATCH=$2; shift 2 ;;
    --sft-lr) SFT_LR=$2; shift 2 ;;
    --outlier-sft-lr) OUTLIER_SFT_LR=$2; shift 2 ;;
    --qat-lr) QAT_LR=$2; shift 2 ;;
    --qat-batch) QAT_BATCH=$2; shift 2 ;;
    --qat-data) QAT_DATA=$2; shift 2 ;;
    --recluster-every) RECLUSTER=$2; shift 2 ;;
    --qamr-all) QAMR_ALL=1; shift ;;
    --calib) CALIB=$2; shift 2 ;;
    --calib-n) CALIB_N=$2; shift 2 ;;
    --fpt-steps) FPT_STEPS=$2; shift 2 ;;
    --fpt-local-steps) FPT_LOCAL=$2; shift 2 ;;
    --no-outliers) OUTLIERS=0; shift ;;
    --sparse) SPARSE=$2; shift 2 ;;
    --large-config) LARGE_CONFIG=$2; shift 2 ;;
    --no-large) LARGE=0; shift ;;
    --large-heldout-n) LARGE_HELDOUT_N=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument \"$1\" (see --help)" ;;
  esac
done
[ -n "$MODEL" ] && [ -n "$ADAPTER_DATA" ] && [ -n "$EVAL" ] && [ -n "$OUT" ] \
  || die "--model, --adapter-data, --eval and --out are required (see --help)"
[ -f "$MODEL/config.json" ] || die "--model $MODEL: no config.json"
[ -f "$ADAPTER_DATA" ] || die "--adapter-data $ADAPTER_DATA: no such file"
[ -f "$EVAL" ] || die "--eval $EVAL: no such file"
[ -z "$HELDOUT" ] || [ -f "$HELDOUT" ] || die "--heldout-nll $HELDOUT: no such file"
[ "$LARGE" = 0 ] || [ -f "$LARGE_CONFIG" ] || die "--large-config $LARGE_CONFIG: no such file"
for n in "$STEPS" "$EVAL_N" "$HELDOUT_N" "$LARGE_HELDOUT_N" "$SFT_BATCH" "$QAT_BATCH" "$RECLUSTER" "$THREADS" \
         "$CALIB_N" "$SPARSE"; do
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || die "counts must be whole numbers >= 1 (got \"$n\")"
done
for n in "$FPT_STEPS" "$FPT_LOCAL"; do
  [[ "$n" =~ ^[0-9]+$ ]] || die "--fpt-steps and --fpt-local-steps must be whole numbers >= 0 (got \"$n\")"
done
for bin in "$B/ertrain" "$B/erinfer"; do [ -x "$bin" ] || die "$bin not found: run make (or set B)"; done
QAT_DATA=${QAT_DATA:-$ADAPTER_DATA}
OUTLIER_SFT_LR=${OUTLIER_SFT_LR:-$SFT_LR}
for x in "$SFT_LR" "$OUTLIER_SFT_LR"; do
  [[ "$x" =~ ^[0-9.]+(e-?[0-9]+)?$ ]] || die "learning rates must be positive numbers (got \"$x\")"
done
CALIB=${CALIB:-$ADAPTER_DATA}
[ -f "$CALIB" ] || die "--calib $CALIB: no such file"
CAL="--calib $CALIB --calib-n $CALIB_N"
FPT="--fpt-steps $FPT_STEPS --fpt-local-steps $FPT_LOCAL"
mkdir -p "$OUT"/{bases,adapters,nll,eval,bench,logs,large}
T="--threads $THREADS"
SYSTEM="Think for at most 64 tokens."
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
# Runs a command into a log; on failure shows the log's tail and stops.
run() {
  local log=$1; shift
  if ! "$@" > "$log" 2>&1; then
    echo "quant_table: failed: $*" >&2; tail -5 "$log" >&2; exit 1
  fi
}
# done_or_clear DIR FILE: 0 when DIR/FILE exists (the step is done); else removes a half-written DIR.
done_or_clear() {
  if [ -f "$1/$2" ]; then return 0; fi
  rm -rf "$1"
  return 1
}

# ---- inputs ----
heldout=$OUT/heldout.jsonl
if [ -n "$HELDOUT" ]; then
  head -n "$HELDOUT_N" "$HELDOUT" > "$heldout.tmp" && mv "$heldout.tmp" "$heldout"
else
  $PY - "$EVAL" "$heldout" "$HELDOUT_N" <<'PY'
import json, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = []
for line in open(src):
    if line.strip() and len(out) < n:
        r = json.loads(line)
        out.append(json.dumps({"prompt": r["problem"] + "\n", "completion": r["verbose"]}))
open(dst + ".tmp", "w").write("\n".join(out) + "\n")
import os; os.replace(dst + ".tmp", dst)
PY
fi

# ---- bases ----
# name|label|how: "fp" (the model itself), "quantize ARGS...", or "qat"
SMALL_ROWS=(
  "fp32|fp32|fp"
  "bf16|bf16|quantize --weights bf16"
  "q8|q8 per-channel|quantize --weights q8 $CAL"
  "q4|q4 per-channel|quantize --weights q4 --lm-head q8 $CAL"
  "q4fpt|q4 per-channel + fpt|quantize --weights q4 --lm-head q8 --transforms fpt $CAL"
  "q4fptt|q4 per-channel + fpt-trained|quantize --weights q4 --lm-head q8 --transforms fpt-trained $FPT $CAL"
  "q4g64|q4g64|quantize --weights q4g64 $CAL"
  "q2rtn|q2 RTN|quantize --weights q2rtn $CAL"
  "q2lut|q2 k-means LUT, GPTQ codes|quantize --weights q2lut $CAL"
  "q2lutfptt|q2 LUT + fpt-trained|quantize --weights q2lut --transforms fpt-trained $FPT $CAL"
  "q2luts|q2 LUT + $SPARSE sparse per row|quantize --weights q2lut --sparse $SPARSE $CAL"
  "q2qat|q2 QAT|qat"
)
# The outlier model: the rows the transforms and the 2-bit quantizers are compared on.
OUTLIER_ROWS=(
  "fp32|fp32|fp"
  "q4|q4 per-channel|quantize --weights q4 --lm-head q8 $CAL"
  "q4fpt|q4 per-channel + fpt|quantize --weights q4 --lm-head q8 --transforms fpt $CAL"
  "q4fptt|q4 per-channel + fpt-trained|quantize --weights q4 --lm-head q8 --transforms fpt-trained $FPT $CAL"
  "q2rtn|q2 RTN|quantize --weights q2rtn $CAL"
  "q2lut|q2 k-means LUT, GPTQ codes|quantize --weights q2lut $CAL"
  "q2lutfptt|q2 LUT + fpt-trained|quantize --weights q2lut --transforms fpt-trained $FPT $CAL"
  "q2luts|q2 LUT + $SPARSE sparse per row|quantize --weights q2lut --sparse $SPARSE $CAL"
  "q2qat|q2 QAT|qat"
)
base_dir() { if [ "$1" = fp32 ]; then echo "$2"; else echo "$3/bases/$1"; fi; }

make_base() { # name how src out_root
  local name=$1 how=$2 src=$3 root=$4 dir
  dir=$(base_dir "$name" "$src" "$root")
  [ "$how" = fp ] && return 0
  if done_or_clear "$dir" config.json && [ -f "$dir/run.json" ] && grep -q '"result"\|"bits_per_weight"' "$dir/run.json"; then
    return 0
  fi
  rm -rf "$dir"
  if [ "$how" = qat ]; then
    say "qat: $name ($STEPS steps)"
    run "$root/logs/base-$name.log" "$B/ertrain" qat --model "$src" --data "$QAT_DATA" --out "$dir" --weights q2lut \
      --steps "$STEPS" --batch "$QAT_BATCH" --lr "$QAT_LR" --recluster-every "$RECLUSTER" --seq-len 512 --seed 1 $T
  else
    say "quantize: $name"
    # shellcheck disable=SC2086
    run "$root/logs/base-$name.log" "$B/ertrain" ${how} --model "$src" --out "$dir" --seed 1 $T
  fi
}

# ---- adapters ----
train_adapter() { # base_name src out_root lr
  local name=$1 base dir
  base=$(base_dir "$name" "$2" "$3")
  dir=$3/adapters/$name
  done_or_clear "$dir" adapter_model.safetensors && return 0
  say "sft adapter on $name ($STEPS steps)"
  run "$3/logs/sft-$name.log" "$B/ertrain" sft --model "$base" --data "$ADAPTER_DATA" --out "$dir" --steps "$STEPS" \
    --batch "$SFT_BATCH" --lr "$4" --rank 16 --alpha 32 --seed 1 $T
}

# ---- measurements ----
measure_nll() { # key base out_root
  local f=$3/nll/$1.jsonl
  [ -f "$f" ] && return 0
  say "nll: $1"
  run "$3/logs/nll-$1.log" "$B/erinfer" score --model "$2" --input "$3/heldout.jsonl" --output "$f.tmp" $T
  mv "$f.tmp" "$f"
}
measure_bench() { # key base out_root extra...
  local key=$1 base=$2 root=$3 f
  shift 3
  f=$root/bench/$key.json
  [ -f "$f" ] && return 0
  say "bench: $key"
  "$B/erinfer" bench --model "$base" --json $T "$@" > "$f.tmp" 2> "$root/logs/bench-$key.log" \
    || { tail -3 "$root/logs/bench-$key.log" >&2; die "bench of $base failed"; }
  mv "$f.tmp" "$f"
}
measure_eval() { # key base adapter out_root
  local f=$4/eval/$1.jsonl
  [ -f "$f" ] && return 0
  say "eval: $1"
  run "$4/logs/eval-$1.log" "$B/erinfer" eval --model "$2" --adapter "$3" --data "$EVAL" --limit "$EVAL_N" \
    --system "$SYSTEM" --max-new 400 --output "$f.tmp" $T
  mv "$f.tmp" "$f"
}

# Table rows: key|label|base name|adapter name
TABLE_ROWS=(
  "fp32|fp32|fp32|fp32"
  "bf16|bf16|bf16|fp32"
  "q8|q8 per-channel|q8|fp32"
  "q4|q4 per-channel|q4|fp32"
  "q4_qamr|q4 per-channel + QAMR|q4|q4"
  "q4fpt_qamr|q4 + fpt + QAMR|q4fpt|q4fpt"
  "q4fptt_qamr|q4 + fpt-trained + QAMR|q4fptt|q4fptt"
  "q4g64|q4g64|q4g64|fp32"
  "q2rtn|q2 RTN|q2rtn|fp32"
  "q2lut|q2 LUT (GPTQ codes)|q2lut|fp32"
  "q2lut_qamr|q2 LUT + QAMR|q2lut|q2lut"
  "q2lutfptt_qamr|q2 LUT + fpt-trained + QAMR|q2lutfptt|q2lutfptt"
  "q2luts_qamr|q2 LUT + $SPARSE sparse per row + QAMR|q2luts|q2luts"
  "q2qat_qamr|q2 QAT + QAMR|q2qat|q2qat"
)
OUTLIER_TABLE_ROWS=(
  "fp32|fp32|fp32|fp32"
  "q4_qamr|q4 per-channel + QAMR|q4|q4"
  "q4fpt_qamr|q4 + fpt + QAMR|q4fpt|q4fpt"
  "q4fptt_qamr|q4 + fpt-trained + QAMR|q4fptt|q4fptt"
  "q2rtn|q2 RTN|q2rtn|fp32"
  "q2lut_qamr|q2 LUT + QAMR|q2lut|q2lut"
  "q2lutfptt_qamr|q2 LUT + fpt-trained + QAMR|q2lutfptt|q2lutfptt"
  "q2luts_qamr|q2 LUT + $SPARSE sparse per row + QAMR|q2luts|q2luts"
  "q2qat_qamr|q2 QAT + QAMR|q2qat|q2qat"
)

# section SRC ROOT BENCH LR OWN... -- BASE_ROWS... -- TABLE_ROWS...: bases, own adapters (at learning rate LR),
# NLL, evals (and benches).
section() {
  local src=$1 root=$2 bench=$3 lr=$4 row name label how key bname aname base
  shift 4
  local own=() bases=() rows=()
  while [ "$1" != -- ]; do own+=("$1"); shift; done; shift
  while [ "$1" != -- ]; do bases+=("$1"); shift; done; shift
  rows=("$@")
  mkdir -p "$root"/{bases,adapters,nll,eval,bench,logs}
  # A rerun reuses finished adapters and evals: refuse to mix learning rates in one table.
  if [ -f "$root/adapters/lr" ] && [ "$(cat "$root/adapters/lr")" != "$lr" ]; then
    die "$root/adapters were trained at lr $(cat "$root/adapters/lr"), not $lr:" \
        "delete $root/adapters and $root/eval, or use another --out"
  fi
  echo "$lr" > "$root/adapters/lr"
  [ "$root" = "$OUT" ] || cp "$OUT/heldout.jsonl" "$root/heldout.jsonl"
  for row in "${bases[@]}"; do
    IFS='|' read -r name label how <<< "$row"
    make_base "$name" "$how" "$src" "$root"
  done
  for name in "${own[@]}"; do train_adapter "$name" "$src" "$root" "$lr"; done
  for row in "${rows[@]}"; do
    IFS='|' read -r key label bname aname <<< "$row"
    base=$(base_dir "$bname" "$src" "$root")
    measure_nll "$bname" "$base" "$root"
    [ "$bench" = 1 ] && measure_bench "$bname" "$base" "$root" --new-tokens 128
    measure_eval "$key" "$base" "$root/adapters/$aname" "$root"
    if [ "$QAMR_ALL" = 1 ]; then
      train_adapter "$bname" "$src" "$root" "$lr"
      measure_eval "own-$bname" "$base" "$root/adapters/$bname" "$root"
    fi
  done
}

OWN=(fp32 q4 q4fpt q4fptt q2lut q2lutfptt q2luts q2qat)
section "$MODEL" "$OUT" 1 "$SFT_LR" "${OWN[@]}" -- "${SMALL_ROWS[@]}" -- "${TABLE_ROWS[@]}"
OMODEL=$OUT/outlier-model
if [ "$OUTLIERS" = 1 ]; then
  if ! done_or_clear "$OMODEL" run.json; then
    say "outliers: the outlier model of $MODEL"
    run "$OUT/logs/outliers.log" "$B/ertrain" outliers --model "$MODEL" --out "$OMODEL" --calib "$CALIB" \
      --calib-n "$CALIB_N" --seed 1
  fi
  section "$OMODEL" "$OUT/outliers" 0 "$OUTLIER_SFT_LR" "${OWN[@]}" -- "${OUTLIER_ROWS[@]}" -- \
    "${OUTLIER_TABLE_ROWS[@]}"
  # The residual alignment alone: the outliers no norm folding or closed-form scale undoes. NLL only.
  AMODEL=$OUT/aligned-model ALIGNED=$OUT/aligned
  if ! done_or_clear "$AMODEL" run.json; then
    say "outliers: the residual alignment alone"
    run "$OUT/logs/aligned.log" "$B/ertrain" outliers --model "$MODEL" --out "$AMODEL" --calib "$CALIB" \
      --calib-n "$CALIB_N" --min 1 --max 1 --seed 1
  fi
  mkdir -p "$ALIGNED"/{bases,nll,logs}
  cp "$OUT/heldout.jsonl" "$ALIGNED/heldout.jsonl"
  for row in "${OUTLIER_ROWS[@]:0:4}"; do
    IFS='|' read -r name label how <<< "$row"
    make_base "$name" "$how" "$AMODEL" "$ALIGNED"
    measure_nll "$name" "$(base_dir "$name" "$AMODEL" "$ALIGNED")" "$ALIGNED"
  done
fi

# ---- the larger random model ----
LARGE_ROWS=(
  "fp32|fp32|fp"
  "bf16|bf16|quantize --weights bf16"
  "q8|q8 per-channel|quantize --weights q8"
  "q4|q4 per-channel|quantize --weights q4"
  "q4g64|q4g64|quantize --weights q4g64"
  "q2rtn|q2 RTN|quantize --weights q2rtn"
  "q2lut|q2 k-means LUT|quantize --weights q2lut"
)
LOUT=$OUT/large
if [ "$LARGE" = 1 ]; then
  mkdir -p "$LOUT"/{bases,nll,bench,logs}
  head -n "$LARGE_HELDOUT_N" "$OUT/heldout.jsonl" > "$LOUT/heldout.jsonl"
  lfp=$LOUT/fp32
  if ! done_or_clear "$lfp" model.safetensors; then
    say "init: a random model of $LARGE_CONFIG"
    run "$LOUT/logs/init.log" "$B/ertrain" init --config "$LARGE_CONFIG" --out "$lfp" --tokenizer "$MODEL" --seed 1 $T
  fi
  for row in "${LARGE_ROWS[@]}"; do
    IFS='|' read -r name label how <<< "$row"
    make_base "$name" "$how" "$lfp" "$LOUT"
    base=$(base_dir "$name" "$lfp" "$LOUT")
    measure_nll "$name" "$base" "$LOUT"
    measure_bench "$name" "$base" "$LOUT" --prompt-tokens 32 --new-tokens 32
  done
fi

# ---- the table ----
say "table"
$PY - "$OUT" "$MODEL" "$LARGE" "$LARGE_CONFIG" "$QAMR_ALL" "$STEPS" "$EVAL_N" "$EVAL" "$ADAPTER_DATA" "$QAT_DATA" \
  "$OUTLIERS" "$CALIB" "$CALIB_N" "$FPT_STEPS" "$FPT_LOCAL" "$SFT_LR" "$OUTLIER_SFT_LR" "$THREADS" \
  "${TABLE_ROWS[@]}" -- "${OUTLIER_TABLE_ROWS[@]}" -- "${LARGE_ROWS[@]}" <<'PY'
import json, os, sys
(out, model, large, large_cfg, qamr_all, steps, eval_n, eval_path, adapter_data, qat_data, outliers, calib, calib_n,
 fpt_steps, fpt_local, sft_lr, outlier_sft_lr, threads) = sys.argv[1:19]
rest = sys.argv[19:]
def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()
cpu = cpu_name()
c1 = rest.index("--")
c2 = rest.index("--", c1 + 1)
rows = [r.split("|") for r in rest[:c1]]
orows = [r.split("|") for r in rest[c1 + 1:c2]]
lrows = [r.split("|") for r in rest[c2 + 1:]]

def base_dir(root, name, fp):
    return fp if name == "fp32" else os.path.join(root, "bases", name)

def nll(root, name):
    s = n = 0.0
    for line in open(os.path.join(root, "nll", name + ".jsonl")):
        r = json.loads(line)
        if r.get("n"):
            s += r["nll"] * r["n"]; n += r["n"]
    return s / n if n else float("nan")

def diff_se(root_a, a, root_b, b):
    """Token-weighted mean NLL of row a minus row b over the same held-out records, and the standard error of
    that paired difference (ratio estimator over the records)."""
    A = [json.loads(l) for l in open(os.path.join(root_a, "nll", a + ".jsonl"))]
    B = [json.loads(l) for l in open(os.path.join(root_b, "nll", b + ".jsonl"))]
    assert len(A) == len(B) and all(x["n"] == y["n"] for x, y in zip(A, B)), (a, b)
    tot = sum(x["n"] for x in A)
    d = [(x["nll"] - y["nll"]) * x["n"] for x, y in zip(A, B)]
    D = sum(d) / tot
    var = sum((di - x["n"] * D) ** 2 for di, x in zip(d, A)) * len(d) / (len(d) - 1)
    return D, var ** 0.5 / tot

def bench(root, name):
    b = json.load(open(os.path.join(root, "bench", name + ".json")))
    first = b["rows"][0]
    assert first["kv"] == "f32" and first["n"] == 1, first
    return first["tokens_per_s_seq"], b["weight_bytes"]

def bits(dirpath, name):
    if name == "fp32":
        return 32.0
    run = json.load(open(os.path.join(dirpath, "run.json")))
    if name == "bf16":
        return 16.0
    if "bits_per_weight" in run:
        return run["bits_per_weight"]
    return run["model"]["quantization"]["bits_per_weight"]  # ertrain qat

def acc(root, key):
    c = t = 0
    for line in open(os.path.join(root, "eval", key + ".jsonl")):
        r = json.loads(line); t += 1; c += bool(r["correct"])
    return c / t if t else float("nan"), t

def human(b):
    return "%.2f MiB" % (b / 1048576) if b >= 1048576 else "%.1f KiB" % (b / 1024)

adapter_label = {"fp32": "fp32 SFT", "q4": "QAMR on q4", "q4fpt": "QAMR on q4 + fpt", "q4fptt": "QAMR on q4 + fpt-trained",
                 "q2lut": "QAMR on q2 LUT", "q2lutfptt": "QAMR on q2 LUT + fpt-trained",
                 "q2luts": "QAMR on q2 LUT + sparse", "q2qat": "QAMR on q2 QAT"}

def section(root, fp, trows, with_bench):
    res = []
    for key, label, bname, aname in trows:
        d = base_dir(root, bname, fp)
        a, n_eval = acc(root, key)
        r = {"key": key, "format": label, "base": d, "bits_per_weight": round(bits(d, bname), 4),
             "heldout_nll": round(nll(root, bname), 5), "accuracy": a, "eval_n": n_eval,
             "adapter": os.path.join(root, "adapters", aname), "adapter_kind": adapter_label.get(aname, aname)}
        if with_bench:
            tps, wb = bench(root, bname)
            r["model_bytes"], r["decode_tokens_per_s"] = wb, round(tps, 1)
        if qamr_all == "1":
            r["accuracy_own_adapter"], _ = acc(root, "own-" + bname)
        res.append(r)
    fp_row = res[0]
    for r in res:
        r["nll_minus_fp32"] = round(r["heldout_nll"] - fp_row["heldout_nll"], 5)
        if with_bench:
            r["decode_speedup_vs_fp32"] = round(r["decode_tokens_per_s"] / fp_row["decode_tokens_per_s"], 2)
    return res

def w4_targets(root):
    """Of the NLL gap of q4 without a transform, the share closed-form and trained fpt close, each with the
    standard error of its paired difference to the no-transform row, and trained minus closed-form."""
    t = {}
    g0, _ = diff_se(root, "q4", root, "fp32")
    if g0 > 0:
        for key, name in (("fpt", "q4fpt"), ("fpt_trained", "q4fptt")):
            d, se = diff_se(root, name, root, "q4")
            t["w4_gap_closed_by_" + key] = round(-d / g0, 3)
            t["w4_gap_closed_by_%s_se" % key] = round(se / g0, 3)
        d, se = diff_se(root, "q4fptt", root, "q4fpt")
        t["w4_fpt_trained_minus_fpt"], t["w4_fpt_trained_minus_fpt_se"] = round(d, 5), round(se, 5)
    return t

def targets(res, root):
    """The issue's ratios from a section's rows (left out where a row they need is missing)."""
    g = {r["key"]: r["nll_minus_fp32"] for r in res}
    a = {r["key"]: r["accuracy"] for r in res}
    t = {}
    if "q4_qamr" in g and "q4fptt_qamr" in g:
        t.update(w4_targets(root))
    if all(k in g for k in ("q2rtn", "q2lut_qamr", "q2lutfptt_qamr", "q2qat_qamr")) and g["q2rtn"] > 0:
        t["w2_lut_over_rtn_gap"] = round(g["q2lut_qamr"] / g["q2rtn"], 3)
        t["w2_lut_fptt_over_rtn_gap"] = round(g["q2lutfptt_qamr"] / g["q2rtn"], 3)
        if "q2luts_qamr" in g:
            t["w2_lut_sparse_over_rtn_gap"] = round(g["q2luts_qamr"] / g["q2rtn"], 3)
    if "w2_lut_over_rtn_gap" in t and a["fp32"]:
        t["w2_lut_qamr_over_fp_accuracy"] = round(a["q2lut_qamr"] / a["fp32"], 3)
        t["w2_lut_fptt_qamr_over_fp_accuracy"] = round(a["q2lutfptt_qamr"] / a["fp32"], 3)
        t["w2_qat_qamr_over_fp_accuracy"] = round(a["q2qat_qamr"] / a["fp32"], 3)
        if "q2luts_qamr" in a:
            t["w2_lut_sparse_qamr_over_fp_accuracy"] = round(a["q2luts_qamr"] / a["fp32"], 3)
    return t

small = section(out, model, rows, True)
orows_res = section(os.path.join(out, "outliers"), os.path.join(out, "outlier-model"), orows, False) if outliers == "1" else []

large_rows = []
if large == "1":
    lroot = os.path.join(out, "large")
    lfp = os.path.join(lroot, "fp32")
    cfg = json.load(open(os.path.join(lfp, "config.json")))
    for name, label, how in lrows:
        d = base_dir(lroot, name, lfp)
        tps, wb = bench(lroot, name)
        large_rows.append({"key": name, "format": label, "bits_per_weight": round(bits(d, name), 4), "model_bytes": wb,
                           "heldout_nll": round(nll(lroot, name), 4), "decode_tokens_per_s": round(tps, 1)})
    for r in large_rows:
        r["nll_minus_fp32"] = round(r["heldout_nll"] - large_rows[0]["heldout_nll"], 4)
        r["decode_speedup_vs_fp32"] = round(r["decode_tokens_per_s"] / large_rows[0]["decode_tokens_per_s"], 2)

doc = {"cpu": cpu, "threads": int(threads), "model": model, "steps": int(steps), "sft_lr": float(sft_lr),
       "eval": eval_path, "eval_n": int(eval_n), "adapter_data": adapter_data, "qat_data": qat_data, "calib": calib,
       "calib_n": int(calib_n), "fpt_steps": int(fpt_steps), "fpt_local_steps": int(fpt_local), "system": "Think for at most 64 tokens.", "max_new": 400, "rows": small,
       "targets": targets(small, out)}
if orows_res:
    orun = json.load(open(os.path.join(out, "outlier-model", "run.json")))
    aroot, arun = os.path.join(out, "aligned"), json.load(open(os.path.join(out, "aligned-model", "run.json")))
    aligned = {"model": os.path.join(out, "aligned-model"), "norm_ratio": arun["norm_ratio"],
               "dominant_share": arun["dominant_share"], "targets": w4_targets(aroot),
               "nll_minus_fp32": {n: round(diff_se(aroot, n, aroot, "fp32")[0], 5) for n in ("q4", "q4fpt", "q4fptt")}}
    doc["outliers"] = {"model": os.path.join(out, "outlier-model"), "sft_lr": float(outlier_sft_lr),
                       "channels": orun["channels"], "min": orun["min"], "max": orun["max"], "seed": orun["seed"],
                       "calib_n": orun["calib_n"],
                       "residual_channels": orun["residual_channels"], "dominant_share": orun["dominant_share"],
                       "ratio_before": orun["ratio_before"], "norm_ratio": orun["norm_ratio"], "rows": orows_res,
                       "targets": targets(orows_res, os.path.join(out, "outliers")), "aligned_only": aligned}
if large == "1":
    doc["large"] = {"config": large_cfg, "parameters_note": "random init (std 0.02), tokenizer of --model",
                    "hidden_size": cfg["hidden_size"], "intermediate_size": cfg["intermediate_size"],
                    "num_hidden_layers": cfg["num_hidden_layers"], "vocab_size": cfg["vocab_size"],
                    "heldout_n": sum(1 for _ in open(os.path.join(out, "large", "heldout.jsonl"))), "rows": large_rows}
tmp = os.path.join(out, "quant_table.json.tmp")
json.dump(doc, open(tmp, "w"), indent=1)
os.replace(tmp, os.path.join(out, "quant_table.json"))

own = qamr_all == "1"
def table(res, with_bench):
    L = ["| format | bits/weight | %sheld-out NLL | NLL - fp32 | accuracy | adapter | %s%s" % (
        "model bytes | " if with_bench else "", "acc, own adapter | " if own else "",
        "decode tok/s | vs fp32 |" if with_bench else "")]
    L.append("|---|---:|%s---:|---:|---:|---|%s%s" % ("---:|" if with_bench else "", "---:|" if own else "",
                                                     "---:|---:|" if with_bench else ""))
    for r in res:
        L.append(("| %s | %.3f | %s%.4f | %+.4f | %.1f%% | %s | %s%s" % (
            r["format"], r["bits_per_weight"], (human(r["model_bytes"]) + " | ") if with_bench else "",
            r["heldout_nll"], r["nll_minus_fp32"], 100 * r["accuracy"], r["adapter_kind"],
            ("%.1f%% | " % (100 * r["accuracy_own_adapter"])) if own else "",
            ("%.0f | %.2fx |" % (r["decode_tokens_per_s"], r["decode_speedup_vs_fp32"])) if with_bench else "")).rstrip())
    return [l.rstrip() for l in L]

def target_lines(t):
    L = []
    if "w4_gap_closed_by_fpt_trained" in t:
        L.append("- W4: of the NLL gap of q4 with no transform, closed-form fpt closes %.0f%% ± %.0f%%, trained fpt "
                 "%.0f%% ± %.0f%%; trained minus closed-form %+.4f ± %.4f nats (target: trained >= 30%% and below "
                 "closed-form; ± the standard error of the paired per-record difference)" % (
                     100 * t["w4_gap_closed_by_fpt"], 100 * t["w4_gap_closed_by_fpt_se"],
                     100 * t["w4_gap_closed_by_fpt_trained"], 100 * t["w4_gap_closed_by_fpt_trained_se"],
                     t["w4_fpt_trained_minus_fpt"], t["w4_fpt_trained_minus_fpt_se"]))
    if "w2_lut_over_rtn_gap" in t:
        L.append("- W2: NLL gap of the LUT / that of RTN = %.3f (target <= 0.333); with fpt-trained %.3f%s" % (
            t["w2_lut_over_rtn_gap"], t["w2_lut_fptt_over_rtn_gap"],
            "; with sparse corrections %.3f" % t["w2_lut_sparse_over_rtn_gap"] if "w2_lut_sparse_over_rtn_gap" in t
            else ""))
    if "w2_lut_qamr_over_fp_accuracy" in t:
        sparse = ("LUT + sparse + QAMR %.0f%%, " % (100 * t["w2_lut_sparse_qamr_over_fp_accuracy"])
                  if "w2_lut_sparse_qamr_over_fp_accuracy" in t else "")
        L.append("- W2 accuracy / fp32 accuracy: LUT + QAMR %.0f%% (target >= 90%%), LUT + fpt-trained + QAMR %.0f%%, "
                 "%sQAT + QAMR %.0f%%" % (100 * t["w2_lut_qamr_over_fp_accuracy"],
                                          100 * t["w2_lut_fptt_qamr_over_fp_accuracy"], sparse,
                                          100 * t["w2_qat_qamr_over_fp_accuracy"]))
    return L

L = ["# Quantization table\n"]
L.append("Read this to compare the weight formats and transforms on one base: size, held-out NLL, accuracy with a "
         "reasoning adapter, decode speed; docs/quantization.md explains each row.\n")
L.append("Base `%s`; adapters: masked-LoRA SFT, %s steps at lr %s on `%s`; QAT: %s steps on `%s` (Fisher-weighted codebooks). "
         "Quantize rows: calibration `%s` (first %s records: Fisher weighting, GPTQ codes for q2lut, fpt-trained's "
         "%s local + %s end-to-end steps), int8 embeddings, 8-bit lm_head for the q4 rows. Accuracy: `erinfer eval`, "
         "greedy, system \"Think for at most 64 tokens.\", --max-new 400, first %d records of `%s`. NLL: `erinfer "
         "score`, token-weighted mean over `%s`. Speed: `erinfer bench --new-tokens 128`, KV f32, N = 1, one decode "
         "stream. Measured on %s, %s threads: a rerun on the same CPU and thread count gives the same numbers bit for "
         "bit; another CPU's kernels (OpenBLAS's, the SIMD dispatch) round differently, which moves the trained rows "
         "(adapters, QAT, fpt-trained) by about their noise.\n"
         % (model, steps, sft_lr, adapter_data, steps, qat_data, calib, calib_n, fpt_local, fpt_steps, small[0]["eval_n"],
            eval_path, os.path.join(out, "heldout.jsonl"), cpu, threads))
L += table(small, True)
L.append("")
L += target_lines(doc["targets"])
L.append("\nq2 QAT: its base was fine-tuned (every parameter, through fake quantization) on the adapter data before "
         "its adapter was trained on the same data, so it has seen more of the traces than the other rows; the fp32 "
         "and q2 LUT + QAMR rows are the controls for that. The q4 + fpt rows need their own (QAMR) adapters: an "
         "adapter trained before a transform does not fit the transformed weights.")
if orows_res:
    o = doc["outliers"]
    L.append("\n## Outlier model: transforms and 2-bit\n")
    L.append("`ertrain outliers --calib %s --calib-n %d --channels %d --min %g --max %g --seed %d` of the base: the "
             "same function (same float NLL). The norms are folded and the residual stream is rotated so that its %d "
             "dominant directions (%.1f%% of the normalised stream's energy on the calibration records) become "
             "channels %s, in every layer; the norm scales amplify those channels %g-%gx (their reading columns as much "
             "smaller) and per layer %d MLP channels are as loud at the down_proj input (up rows larger, down columns "
             "smaller). Loudest channel of the normalised stream a projection reads: %.0fx the median (%.1fx in the "
             "base). Same rows and measurements as above; the adapters at lr %s.\n"
             % (calib, o["calib_n"], o["channels"], o["min"], o["max"], o["seed"], o["channels"],
                100 * o["dominant_share"], ", ".join(map(str, o["residual_channels"])), o["min"], o["max"],
                o["channels"], o["norm_ratio"], o["ratio_before"], outlier_sft_lr))
    L += table(orows_res, False)
    L.append("")
    L += target_lines(o["targets"])
    a = o["aligned_only"]
    L.append("\nThe norm-scale and MLP outliers are the inverses of the norm folding and of the closed-form T_u that "
             "rotate / fpt / fpt-trained start with, so those undo them exactly; the residual alignment is not undone "
             "by anything: a rotation of the transforms' own has to spread it. On the alignment alone (`--min 1 --max "
             "1`, loudest normalised channel %.1fx the median), held-out NLL - fp32: q4 %+.4f, q4 + fpt %+.4f, q4 + "
             "fpt-trained %+.4f:\n" % (a["norm_ratio"], a["nll_minus_fp32"]["q4"], a["nll_minus_fp32"]["q4fpt"],
                                        a["nll_minus_fp32"]["q4fptt"]))
    L += target_lines(a["targets"])
if large_rows:
    lc = doc["large"]
    L.append("\n## Larger random model: speed and NLL only\n")
    L.append("`%s`: hidden %d, MLP %d, %d layers, vocab %d, random init (so NLL is near ln V for every row; what "
             "matters is the change against fp32). Speed: `erinfer bench --prompt-tokens 32 --new-tokens 32`, KV f32, "
             "N = 1. NLL over the first %d held-out records.\n" % (large_cfg, lc["hidden_size"], lc["intermediate_size"], lc["num_hidden_layers"], lc["vocab_size"], lc["heldout_n"]))
    L.append("| format | bits/weight | model bytes | held-out NLL | NLL - fp32 | decode tok/s | vs fp32 |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for r in large_rows:
        L.append("| %s | %.3f | %s | %.4f | %+.4f | %.1f | %.2fx |" % (
            r["format"], r["bits_per_weight"], human(r["model_bytes"]), r["heldout_nll"], r["nll_minus_fp32"],
            r["decode_tokens_per_s"], r["decode_speedup_vs_fp32"]))
tmp = os.path.join(out, "quant_table.md.tmp")
open(tmp, "w").write("\n".join(L) + "\n")
os.replace(tmp, os.path.join(out, "quant_table.md"))
print("\n".join(L))
PY
say "wrote $OUT/quant_table.md and $OUT/quant_table.json"
