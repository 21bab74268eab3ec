#!/usr/bin/env bash
# The committed tiny base's greedy tokens on aarch64 (qemu, with and without the dot-product extensions)
# against x86, for a fixed prompt set in fp32, q4 and q2lut weights and fp32 / int8 KV. Fails on the first
# configuration whose tokens differ anywhere. The last one decodes 2 samples at once, so the q4 layers and the
# int8 lm_head take the N = 2 kernels (SMMLA on -cpu max) and the attention reads 2 sequences. Called by make
# test-aarch64 after both builds; the quantized dirs are made by the x86 ertrain (quantizing is the training
# tier; the device only reads the files). make test-aarch64 passes the x86 build without BLAS and without
# the tiled decode kernels (see the Makefile): with int8-rounded decode inputs, OpenBLAS's prefill order or
# the tiled kernels' order of the fp32 block sums alone can change a token.
# Usage: scripts/aarch64_tokens.sh X86_BUILD ARM_BUILD
set -euo pipefail
cd "$(dirname "$0")/.."
X86=${1:-build}
ARM=${2:-build/aarch64}
OUT=$ARM/tokens
BASE=models/tiny-base
rm -rf "$OUT" && mkdir -p "$OUT"
for f in q4 q2lut; do
  "$X86/ertrain" quantize --model "$BASE" --out "$OUT/$f" --weights "$f" --threads 1 >/dev/null
done

# Raw text continues with a long verbose trace (64 tokens); the chat form answers in a few tokens.
PROMPTS=(
  "Start with 9. Multiply by 3. Subtract 6. Add 5. Add 1. Subtract 7. Subtract 3. Subtract 7. Divide by 2. What is the result?"
  "Start with 1. Subtract 1. Add 9. Multiply by 3. Divide by 3. Add 8. Add 2. Add 7. What is the result?"
  "Start with 2. Divide by 2. Subtract 1. Add 2. Divide by 2. Subtract 1. Add 2. What is the result?"
  "Start with 6. Subtract 3. Multiply by 2. Multiply by 3. Subtract 1. Add 7. What is the result?"
)
CHAT=("Start with 4. Add 2. Subtract 2. What is the result?" "Start with 18. Add 9. What is the result?")

# The token ids of one greedy generation, one line.
tokens() { # BIN MODEL KV SAMPLES PROMPT [--raw] (with several samples: the last one's)
  "$1" generate --model "$2" --kv "$3" --samples "$4" --prompt "$5" --max-new 64 --threads 2 --json "${@:6}" \
    2>/dev/null |
    sed -n 's/.*"tokens":\[\([0-9,]*\)\].*/\1/p'
}

export OMP_WAIT_POLICY=passive # two emulated threads on a shared machine: waiting ones sleep
fail=0
for cfg in "$BASE f32" "$BASE int8" "$OUT/q4 f32" "$OUT/q2lut f32" "$OUT/q2lut int8" "$OUT/q4 int8 2"; do
  set -- $cfg
  model=$1 kv=$2 ns=${3:-1} n=0 same=0 ntok=0
  for i in "${!PROMPTS[@]}" c0 c1; do
    case $i in c*) p=${CHAT[${i#c}]} raw=() ;; *) p=${PROMPTS[$i]} raw=(--raw) ;; esac
    ref=$(tokens "$X86/erinfer" "$model" "$kv" "$ns" "$p" "${raw[@]}")
    ntok=$((ntok + $(echo "$ref" | tr ',' '\n' | grep -c .)))
    for cpu in max cortex-a53; do
      got=$(QEMU_CPU=$cpu tokens "$ARM/erinfer" "$model" "$kv" "$ns" "$p" "${raw[@]}")
      n=$((n + 1))
      if [ -n "$ref" ] && [ "$got" = "$ref" ]; then
        same=$((same + 1))
      else
        echo "aarch64_tokens: $(basename "$model") kv $kv, qemu -cpu $cpu, prompt \"$p\": x86 [$ref], aarch64 [$got]"
        fail=1
      fi
    done
  done
  echo "aarch64_tokens: $(basename "$model") weights, $kv KV, $ns sample(s): $same of $n aarch64 generations" \
       "equal x86's ($ntok tokens per CPU model)"
done
exit $fail
