#!/usr/bin/env bash
# Data-parallel throughput (make MPI=1): the same job as one process with one thread and as
# `mpirun -np 2` with one thread per rank, on the 0.5B shape with two layers (configs/qwen05b-2l.json,
# random weights): a LoRA SFT step (rank 16 on all seven linears, global batch 8) and a GRPO step
# (4 prompts x 4 rollouts, then the update). Prints the ratio of the two throughputs (2 ranks / 1 rank;
# the ideal on 2 free cores is 2) and the share of the 2-rank run's time rank 0 spent in the gradient
# all-reduce (allreduce_s in metrics.jsonl; waiting for the other rank included), with the load
# average before each run: other work on the machine disturbs the ratio.
#   bash bench/run_mpi.sh [BUILD_DIR]      (default build/mpi; REPEAT=3 runs each pair 3 times)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/mpi}
PY=${PY:-/usr/bin/python3}
REPEAT=${REPEAT:-1}
SFT_STEPS=${SFT_STEPS:-6}
GRPO_STEPS=${GRPO_STEPS:-3}
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to core -np 2)
command -v mpirun > /dev/null || { echo "run_mpi: no mpirun (MPI=1 scripts/deps.sh)" >&2; exit 1; }
"${MPIRUN[@]}" "$B/ertrain" version | grep -q "ranks: 2 (MPI)" ||
  { echo "run_mpi: $B/ertrain is not an MPI=1 build (make MPI=1)" >&2; exit 1; }
work=$(mktemp -d /tmp/er_bench_mpi_XXXXXX)
trap 'rm -rf "$work"' EXIT
"$B/ertrain" init --config configs/qwen05b-2l.json --tokenizer data/tiny_tokenizer --out "$work/m" --seed 1 > /dev/null
"$B/ertrain" synth chains --n 256 --seed 1 --max-steps 4 --out "$work/d.jsonl" > /dev/null
load() { cut -d' ' -f1 /proc/loadavg; }

# Wall seconds of the steps after the first (metrics.jsonl's cumulative allreduce_s and the step lines'
# times are rank 0's): the first step warms pages and threads. Prints "tokens_per_s allreduce_share".
sft_rate() {
  "$PY" - "$1/metrics.jsonl" <<'EOF'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
first, last = m[0], m[-1]
# tokens_per_s is cumulative from the loop's start: recover the time of steps 2..S from it.
t_all, t_first = last["tokens"] / last["tokens_per_s"], first["tokens"] / first["tokens_per_s"]
rate = (last["tokens"] - first["tokens"]) / (t_all - t_first)
share = (last["allreduce_s"] - first["allreduce_s"]) / (t_all - t_first)
print("%.1f %.3f" % (rate, share))
EOF
}

SFT=(sft --model "$work/m" --data "$work/d.jsonl" --response-key verbose --rank 16 --batch 8 --steps "$SFT_STEPS"
     --seq-len 256 --eval-split 0 --threads 1 --seed 1)
GRPO=(grpo --model "$work/m" --data "$work/d.jsonl" --budgets 32 --group 4 --prompts 4 --steps "$GRPO_STEPS"
      --answer-tokens 8 --threads 1 --seed 1)
for r in $(seq "$REPEAT"); do
  rm -rf "$work"/sft1 "$work"/sft2 "$work"/grpo1 "$work"/grpo2
  l1=$(load); "$B/ertrain" "${SFT[@]}" --out "$work/sft1" > /dev/null 2>&1
  l2=$(load); "${MPIRUN[@]}" "$B/ertrain" "${SFT[@]}" --out "$work/sft2" > /dev/null 2>&1
  read -r one _ <<< "$(sft_rate "$work/sft1")"
  read -r two share <<< "$(sft_rate "$work/sft2")"
  "$PY" -c "import sys; o, t, s = map(float, sys.argv[1:4]); print('mpi sft 0.5b-2l lora16 batch 8: 1 rank %.0f tok/s (load %s), 2 ranks %.0f tok/s (load %s): %.2fx; all-reduce %.1f%% of the 2-rank step' % (o, sys.argv[4], t, sys.argv[5], t / o, 100 * s))" "$one" "$two" "$share" "$l1" "$l2"
  # GRPO starts from the 1-rank SFT adapter; whole-run wall time over the steps (model load included).
  l3=$(load); t0=$(date +%s.%N)
  "$B/ertrain" "${GRPO[@]}" --adapter "$work/sft1" --out "$work/grpo1" > /dev/null 2>&1
  t1=$(date +%s.%N); l4=$(load)
  "${MPIRUN[@]}" "$B/ertrain" "${GRPO[@]}" --adapter "$work/sft1" --out "$work/grpo2" > /dev/null 2>&1
  t2=$(date +%s.%N)
  cmp -s <(grep -o '"rollout_hash":[0-9]*' "$work/grpo1/metrics.jsonl") \
         <(grep -o '"rollout_hash":[0-9]*' "$work/grpo2/metrics.jsonl") ||
    { echo "run_mpi: the 2-rank GRPO run rolled out other tokens than the 1-rank one" >&2; exit 1; }
  "$PY" - "$t0" "$t1" "$t2" "$l3" "$l4" "$work/grpo2/metrics.jsonl" "$GRPO_STEPS" <<'EOF'
import json, sys
t0, t1, t2 = map(float, sys.argv[1:4])
m = [json.loads(l) for l in open(sys.argv[6])]
steps = int(sys.argv[7])
one, two = (t1 - t0) / steps, (t2 - t1) / steps
print("mpi grpo 0.5b-2l 4 prompts x 4 rollouts: 1 rank %.2f s/step (load %s), 2 ranks %.2f s/step (load %s): %.2fx; "
      "all-reduce %.1f%% of the 2-rank run" % (one, sys.argv[4], two, sys.argv[5], one / two,
                                                100 * m[-1]["allreduce_s"] / (t2 - t1)))
EOF
done
