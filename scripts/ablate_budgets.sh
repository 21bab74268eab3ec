#!/usr/bin/env bash
# Budget ablation: GRPO for every (budget, m) of a grid from one starting adapter, each evaluated on
# held-out prompts that state the same budget. Writes ablation.csv, ablation.json, pareto.png (gnuplot: accuracy
# vs mean length, one point per run) and curves.png (`ertrain plot` over the runs: reward, accuracy, length per
# budget, KL, eval accuracy and loss over the steps, the runs overlaid).
#
#   scripts/ablate_budgets.sh --model DIR --adapter DIR --data TRAIN.jsonl --eval EVAL.jsonl --out DIR
#       [--budgets "32 64 128"] [--m "0.2"] [--steps 50] [--budget-in system|user] [--flags "extra ertrain grpo flags"]
# THREADS=N sets the threads of every run (default: all cores; 1 is faster for tiny models on a busy machine).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
budgets="32 64 128"; ms="0.2"; steps=50; extra=""; where=system
model=""; adapter=""; data=""; evaldata=""; out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --adapter) adapter=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --eval) evaldata=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --budgets) budgets=$2; shift 2 ;;
    --m) ms=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --budget-in) where=$2; shift 2 ;;
    --flags) extra=$2; shift 2 ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    *) echo "ablate_budgets: unknown argument $1 (see --help)" >&2; exit 1 ;;
  esac
done
case "$where" in system|user) ;; *) echo "ablate_budgets: --budget-in is system or user, got $where" >&2; exit 1 ;; esac
for v in model adapter data evaldata out; do
  [ -n "${!v}" ] || { echo "ablate_budgets: --${v/evaldata/eval} is required" >&2; exit 1; }
done
mkdir -p "$out"
runs=(); run_dirs=()
for b in $budgets; do
  for m in $ms; do
    run="$out/b${b}_m${m}"
    if [ ! -f "$run/adapter_model.safetensors" ]; then
      rm -rf "$run"
      # shellcheck disable=SC2086
      $BUILD/ertrain grpo --model "$model" --adapter "$adapter" --data "$data" --out "$run" --budgets "$b" \
        --barrier-m "$m" --steps "$steps" --budget-in "$where" --threads "${THREADS:-0}" $extra
    fi
    # The held-out prompts state the run's budget the way its training prompts did.
    /usr/bin/python3 scripts/budget_records.py "$evaldata" "$run/eval-prompts.jsonl" --key none --budgets "$b" \
      --where "$where" > /dev/null
    $BUILD/erinfer eval --model "$model" --adapter "$run" --data "$run/eval-prompts.jsonl" \
      --max-new $((b * 2 + 32)) --threads "${THREADS:-0}" --output "$run/eval.jsonl" > "$run/eval.txt"
    runs+=("$b $m $run"); run_dirs+=("$run")
  done
done

/usr/bin/python3 - "$out" "${runs[@]}" <<'PY'
import json, sys
out = sys.argv[1]
rows = []
for spec in sys.argv[2:]:
    b, m, run = spec.split(" ", 2)
    items = [json.loads(l) for l in open(f"{run}/eval.jsonl")]
    acc = sum(i["correct"] for i in items) / len(items)
    length = sum(i["samples"][0]["n_tokens"] for i in items) / len(items)
    metrics = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
    rows.append({"budget": int(b), "m": float(m), "accuracy": acc, "mean_length": length, "items": len(items),
                 "final_reward": metrics[-1]["reward"], "steps": metrics[-1]["step"], "run": run})
with open(f"{out}/ablation.json", "w") as f:
    json.dump(rows, f, indent=1)
with open(f"{out}/ablation.csv", "w") as f:
    f.write("budget,m,accuracy,mean_length,items,final_reward,steps\n")
    for r in rows:
        f.write(f"{r['budget']},{r['m']},{r['accuracy']:.4f},{r['mean_length']:.2f},{r['items']},{r['final_reward']:.4f},{r['steps']}\n")
with open(f"{out}/pareto.dat", "w") as f:
    for r in sorted(rows, key=lambda r: r["mean_length"]):
        f.write(f"{r['mean_length']} {r['accuracy']} {r['budget']}/{r['m']}\n")
for r in rows:
    print(f"budget {r['budget']:5d} m {r['m']:.2f}: accuracy {r['accuracy']:.3f}, mean length {r['mean_length']:.1f} tokens")
PY

gnuplot <<GNUPLOT_END
set terminal pngcairo size 800,560
set grid
set output '$out/pareto.png'
set title 'Accuracy vs mean generated length (one point per budget / m)'
set xlabel 'mean generated tokens'; set ylabel 'accuracy'
plot '$out/pareto.dat' using 1:2 with linespoints pt 7 title 'GRPO runs', '' using 1:2:3 with labels offset 1,1 notitle
GNUPLOT_END
# The runs' curves over the steps, overlaid (each labelled by its dir, b<budget>_m<m>).
"$BUILD"/ertrain plot "${run_dirs[@]}" --out "$out/curves.png" > /dev/null
echo "wrote $out/ablation.csv, $out/ablation.json, $out/pareto.png, $out/curves.png"
