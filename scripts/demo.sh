#!/usr/bin/env bash
# make demo: the pipeline on the built-in tiny default, as far as it is built today (see README,
# "Status"). Every number printed comes from this run.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=${QUICK:-0}
OUT=${OUT:-runs/demo}
B=build
mkdir -p "$OUT"
N=2000; [ "$QUICK" = 1 ] && N=200

echo "== 1. synthetic reasoning data (ertrain synth chains) =="
$B/ertrain synth chains --n "$N" --seed 1 --out "$OUT/chains.jsonl" --tokenizer data/tiny_tokenizer

echo
echo "== 2. tokenizer round trip on the problems (erinfer tokenize / detokenize) =="
/usr/bin/python3 - "$OUT/chains.jsonl" "$OUT/text.jsonl" <<'PY'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as g:
    for line in f:
        g.write(json.dumps({"text": json.loads(line)["problem"]}) + "\n")
PY
$B/erinfer tokenize --tokenizer data/tiny_tokenizer --input "$OUT/text.jsonl" --output "$OUT/ids.jsonl"
$B/erinfer detokenize --tokenizer data/tiny_tokenizer --input "$OUT/ids.jsonl" --output "$OUT/back.jsonl"
/usr/bin/python3 - "$OUT/text.jsonl" "$OUT/back.jsonl" "$OUT/ids.jsonl" <<'PY'
import json, sys
a = [json.loads(l)["text"] for l in open(sys.argv[1])]
b = [json.loads(l)["text"] for l in open(sys.argv[2])]
n = sum(len(json.loads(l)["ids"]) for l in open(sys.argv[3]))
assert a == b, "round trip differs"
print(f"round trip: {len(a)} problems identical after encode/decode ({n} tokens, {n / len(a):.1f} per problem)")
PY

echo
echo "== 3. the transformer against the PyTorch reference (erinfer score) =="
make -s ref
if [ -d build/ref/qwen2_untied_f32 ]; then
  $B/erinfer score --model build/ref/qwen2_untied_f32 --input build/ref/qwen2_untied_f32/score_input.jsonl \
    --output "$OUT/score.jsonl"
  /usr/bin/python3 - "$OUT/score.jsonl" <<'PY'
import json, struct, sys
def read_st(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    return h, b[8 + n:]
h, buf = read_st("build/ref/qwen2_untied_f32/expected.safetensors")
info = h["logprobs"]; B, T = info["shape"]; s, e = info["data_offsets"]
ref = struct.unpack(f"<{B*T}f", buf[s:e])
worst = 0.0
for b, line in enumerate(open(sys.argv[1])):
    lp = json.loads(line)["logprobs"]
    worst = max([worst] + [abs(x - ref[b * T + i]) for i, x in enumerate(lp)])
print(f"erinfer score vs PyTorch reference: max |log-prob difference| = {worst:.2e}")
PY
fi

echo
echo "== 4. runtime: 4 samples sharing one prompt, hard budget, int8 KV (random tiny model) =="
$B/ertrain init --config configs/tiny.json --out "$OUT/model" --tokenizer data/tiny_tokenizer --seed 1
$B/erinfer generate --model "$OUT/model" --prompt "Start with 7. Add 5. What is the result?" --samples 4 \
  --temperature 0.8 --seed 1 --budget 16 --answer-tokens 24 --kv int8 --json > "$OUT/generate.json"
/usr/bin/python3 - "$OUT/generate.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for i, s in enumerate(r["samples"]):
    print(f"sample {i}: {len(s['tokens'])} tokens, finish={s['finish']}, budget_cut={s['budget_cut']}")
st = r["stats"]
print(f"prompt {st['prompt_tokens']} tokens, TTFT {st['ttft_s']*1e3:.1f} ms, {st['decode_tokens_per_s']:.0f} tokens/s, "
      f"KV {st['kv_bytes']/1024:.1f} KiB")
PY
echo
echo "Not in the demo yet (README, Status): the tiny base and SFT (scripts/build_tiny_base.sh), GRPO runs, heads, quantization."
