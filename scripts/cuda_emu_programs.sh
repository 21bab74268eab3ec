#!/usr/bin/env bash
# Whole programs on the CUDA backend with its kernels emulated on the host (make CUDA_EMU=1, no GPU): each runs
# once with --device cpu and once with --device cuda from the same build, on the committed tiny base
# (models/tiny-base) with a masked adapter trained for a few steps here, and the two runs are compared:
#   erinfer generate   greedy, 2 samples: the same tokens
#   erinfer eval       greedy, 4 records: the same samples, answers and grades
#   erinfer serve      one chat completion (greedy, n = 2) over HTTP: the same choices
#   ertrain grpo       2 steps at temperature 1 with a reward program: the same rollouts (hashes) and rewards,
#                      the loss, gradient norm and entropy within 5% (the base is bf16 on the device)
#   ertrain heads      switcher and verifier: the same labels, the heads' training losses within 0.01
# `make CUDA_EMU=1 test-cuda-emu-programs` builds the programs and runs this (CI, after test-cuda-emu).
# Usage: scripts/cuda_emu_programs.sh [BUILD_DIR]   (default build/cuda_emu)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/cuda_emu}
command -v curl >/dev/null || { echo "cuda_emu_programs: curl is not installed" >&2; exit 2; }
for p in ertrain erinfer; do
  [ -x "$B/$p" ] || { echo "cuda_emu_programs: $B/$p is not built (make CUDA_EMU=1 $B/$p)" >&2; exit 2; }
done
export ASAN_OPTIONS=detect_leaks=0 OMP_WAIT_POLICY=passive
T=$(mktemp -d /tmp/er_cuda_emu_programs.XXXXXX)
server=
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$T"' EXIT
BASE=models/tiny-base
fail() { echo "cuda_emu_programs: FAILED: $*" >&2; exit 1; }
. scripts/serve_port.sh

# serve DEVICE: one greedy chat completion (n = 2) from `erinfer serve --device DEVICE` into $T/serve-DEVICE.json.
serve() {
  "$B/erinfer" serve --model "$BASE" --adapter "$T/sft" --port 0 --threads 2 --device "$1" 2>"$T/serve-$1.log" &
  server=$!
  local port
  port=$(serve_port "$T/serve-$1.log" "$server") ||
    fail "erinfer serve --device $1 did not start: $(tail -1 "$T/serve-$1.log")"
  curl -s --max-time 300 "http://127.0.0.1:$port/v1/chat/completions" -H "Content-Type: application/json" \
    -d '{"messages":[{"role":"user","content":"Start with 7. Add 5. Multiply by 2. What is the result?"}],
         "temperature":0,"n":2,"max_tokens":48}' >"$T/serve-$1.json" || fail "the request to the $1 server"
  kill -TERM "$server"
  wait "$server" || fail "erinfer serve --device $1 exited with status $? ($(tail -1 "$T/serve-$1.log"))"
  server=
}

"$B/ertrain" synth chains --n 24 --seed 1 --out "$T/chains.jsonl" --tokenizer "$BASE" >/dev/null
head -4 "$T/chains.jsonl" >"$T/eval.jsonl"
"$B/ertrain" sft --model "$BASE" --data "$T/chains.jsonl" --response-key concise --out "$T/sft" --steps 3 \
  --batch 4 --device cpu --threads 2 >/dev/null 2>&1 || fail "sft (the adapter the runs use)"

for d in cpu cuda; do
  SECONDS=0
  "$B/erinfer" generate --model "$BASE" --adapter "$T/sft" --temperature 0 --samples 2 --max-new 64 --json \
    --prompt "Start with 19. Multiply by 2. Subtract 2. Divide by 2. Add 7. What is the result?" --device $d \
    --threads 2 >"$T/gen-$d.json" 2>"$T/gen-$d.err" || fail "erinfer generate --device $d: $(tail -1 "$T/gen-$d.err")"
  "$B/erinfer" eval --model "$BASE" --adapter "$T/sft" --data "$T/eval.jsonl" --temperature 0 --max-new 96 \
    --output "$T/eval-$d.jsonl" --device $d --threads 2 >/dev/null 2>"$T/eval-$d.err" ||
    fail "erinfer eval --device $d: $(tail -1 "$T/eval-$d.err")"
  serve $d
  "$B/ertrain" grpo --model "$BASE" --adapter "$T/sft" --data "$T/chains.jsonl" --out "$T/grpo-$d" --steps 2 \
    --group 4 --prompts 2 --budgets 32 --temperature 1 --device $d --threads 2 \
    --reward-cmd "python3 -c 'import sys
for l in sys.stdin: print(len(l) % 2, flush=True)'" >/dev/null 2>"$T/grpo-$d.err" ||
    fail "ertrain grpo --device $d: $(tail -1 "$T/grpo-$d.err")"
  "$B/ertrain" heads --model "$BASE" --adapter "$T/sft" --data "$T/chains.jsonl" --derive-labels \
    --target-recall 0.9 --samples 2 --max-new 32 --limit 12 --allow-one-class --device $d --threads 2 \
    --switcher-out "$T/heads-$d/sw.safetensors" --verifier-out "$T/heads-$d/vf.safetensors" \
    >"$T/heads-$d.out" 2>"$T/heads-$d.err" || fail "ertrain heads --device $d: $(tail -1 "$T/heads-$d.err")"
  grep -q "running on $d" "$T/grpo-$d.err" || fail "ertrain grpo --device $d did not say it runs there"
  echo "cuda_emu_programs: --device $d: generate, eval, serve, grpo, heads in $SECONDS s"
done

python3 - "$T" <<'EOF'
import json, re, sys
t = sys.argv[1]
def lines(p):
    return [json.loads(l) for l in open(p)]
ok = True
def check(cond, what):
    global ok
    print(f"cuda_emu_programs: {'ok' if cond else 'FAILED'}: {what}")
    ok &= bool(cond)
g = [json.load(open(f"{t}/gen-{d}.json"))["samples"] for d in ("cpu", "cuda")]
check([s["tokens"] for s in g[0]] == [s["tokens"] for s in g[1]],
      f"erinfer generate: 2 greedy samples of {len(g[0][0]['tokens'])} tokens, the same on cuda")
e = [lines(f"{t}/eval-{d}.jsonl") for d in ("cpu", "cuda")]
same = [(a["samples"][0]["text"], a["correct"]) == (b["samples"][0]["text"], b["correct"]) for a, b in zip(*e)]
check(len(e[0]) == 4 and all(same), f"erinfer eval: {sum(same)} of {len(e[0])} records the same text and grade")
c = [[x["message"]["content"] for x in json.load(open(f"{t}/serve-{d}.json"))["choices"]] for d in ("cpu", "cuda")]
check(len(c[0]) == 2 and c[0] == c[1], f"erinfer serve: 2 greedy choices, the same on cuda ({c[0][0][:40]!r}...)")
m = [lines(f"{t}/grpo-{d}/metrics.jsonl") for d in ("cpu", "cuda")]
for a, b in zip(*m):
    s = a["step"]
    check(a["rollout_hash"] == b["rollout_hash"] and a["reward"] == b["reward"],
          f"ertrain grpo step {s}: rollouts {a['rollout_hash']}, reward {a['reward']} on both")
    for k in ("loss", "grad_norm", "entropy"):
        close = abs(a[k] - b[k]) <= 0.05 * abs(a[k]) + 1e-6
        check(close, f"ertrain grpo step {s}: {k} {a[k]:.6g} on cpu, {b[k]:.6g} on cuda")
    check(abs(a["kl"] - b["kl"]) <= 1e-3, f"ertrain grpo step {s}: kl {a['kl']:.3g} on cpu, {b['kl']:.3g} on cuda")
h = [open(f"{t}/heads-{d}.out").read() for d in ("cpu", "cuda")]
lab = [[l for l in x.splitlines() if " labels: " in l] for x in h]
check(lab[0] == lab[1] and len(lab[0]) == 2, "ertrain heads: the same labels (" + "; ".join(lab[0]) + ")")
loss = [re.findall(r"train loss ([0-9.]+) -> ([0-9.]+)", x) for x in h]
check(len(loss[0]) == 2 and all(abs(float(p) - float(q)) <= 0.01 for a, b in zip(*loss) for p, q in zip(a, b)),
      f"ertrain heads: training losses {loss[0]} on cpu, {loss[1]} on cuda")
sys.exit(0 if ok else 1)
EOF
