#!/usr/bin/env bash
# erinfer beside llama.cpp on the same weights: a random Qwen2.5-0.5B-shaped model (24 layers, hidden 896,
# 14/2 heads, ff 4864, vocab 151936, tied, the real Qwen tokenizer) written once under build/llbench,
# quantized with ertrain quantize (q8, q4, q4g32) and exported with ertrain export gguf (f32, q8_0, q4_0: q4
# and q4g32 both beside llama.cpp's Q4_0, written from their own dequantized weights), and quantized from the
# f32 GGUF by llama.cpp's own quantizer (bench/llama_quantize: Q8_0, Q4_0, Q4_K_M, Q5_K_M), which both then load
# from the same file. The 2-thread int8 multiply-add peak (bench/int8_peak) is measured in the same run; the prefill's
# integer multiply-adds per second are given against it.
# Per format: llama.cpp (node-llama-cpp, pinned, prebuilt CPU binaries, bench/llama_decode.mjs) and
# erinfer bench, same threads, prompt and new tokens; one table with the ratios and the load average.
# Then the deployed configuration at a long context: erinfer on the q4 weights with LONG (1024) prompt positions
# and 32 new tokens, int8 KV against f32 KV (decode N = 1 and 8, prefill). Then the Qwen3 shape: a random model of
# Qwen3-0.6B's config (configs/qwen3-0.6b.json: 28 layers, hidden 1024, 16/8 heads of 128, q/k norms, tied),
# quantized q4 and exported as Q4_0, erinfer against llama.cpp's qwen3 on that file.
#   THREADS (2), PROMPT (256), NEW (64), FORMATS ("f32 q8 q4 q4g32 q8_0 q4_0 q4_k_m q5_k_m"), LLAMA_NS (N values for
#   llama.cpp, "1 8"),
#   LONG (1024; 0 skips the long-context row), QWEN3 (1; 0 skips the Qwen3 row)
# Needs ~3 GB of memory and ~9 GB of disk (models written once: later runs only measure).
# Exits 0 with a loud line when node/npm or node-llama-cpp is missing: no comparison then.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BUILD=${BUILD:-build}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-256}
NEW=${NEW:-64}
FORMATS=${FORMATS:-f32 q8 q4 q4g32 q8_0 q4_0 q4_k_m q5_k_m}
LLAMA_NS=${LLAMA_NS:-1 8}
LONG=${LONG:-1024}
QWEN3=${QWEN3:-1}
dir=$BUILD/llbench
q3=$dir/qwen3-0.6b
tok=../shared/fixtures/qwen-tokenizer

if ! command -v node >/dev/null 2>&1; then
  echo "!!!!!! run_llama: node is not installed: NO llama.cpp COMPARISON !!!!!!"
  exit 0
fi
if ! scripts/llama_cpp.sh --install; then
  echo "!!!!!! run_llama: node-llama-cpp is not installed: NO llama.cpp COMPARISON !!!!!!"
  exit 0
fi
for bin in "$BUILD/ertrain" "$BUILD/erinfer" "$BUILD/bench/llama_quantize" "$BUILD/bench/int8_peak"; do
  [ -x "$bin" ] || make "$bin" >/dev/null || { echo "run_llama: cannot build $bin" >&2; exit 1; }
done
[ -f "$tok/tokenizer.json" ] || { echo "run_llama: $tok/tokenizer.json is missing" >&2; exit 1; }

# The model, once. Each step writes into a temporary name and renames, so an interrupted run redoes it.
mkdir -p "$dir"
sed -e 's/"num_hidden_layers": 2,/"num_hidden_layers": 24,/' -e 's/"vocab_size": 512,/"vocab_size": 151936,/' \
  configs/qwen05b-2l.json >"$dir/config.json"
if ! grep -q '"num_hidden_layers": 24,' "$dir/config.json" || ! grep -q '"vocab_size": 151936,' "$dir/config.json"; then
  echo "run_llama: configs/qwen05b-2l.json no longer has the layout this script edits" >&2
  exit 1
fi
if [ ! -d "$dir/f32" ]; then
  rm -rf "$dir/f32.tmp"
  "$BUILD/ertrain" init --config "$dir/config.json" --out "$dir/f32.tmp" --tokenizer "$tok" --threads "$THREADS"
  mv "$dir/f32.tmp" "$dir/f32"
fi
for q in q8 q4 q4g32; do
  if [ ! -d "$dir/$q" ]; then
    rm -rf "$dir/$q.tmp"
    "$BUILD/ertrain" quantize --model "$dir/f32" --out "$dir/$q.tmp" --weights "$q"
    mv "$dir/$q.tmp" "$dir/$q"
  fi
done
gguf_type() {
  case $1 in f32) echo f32 ;; q8) echo q8_0 ;; q4 | q4g32) echo q4_0 ;; q8_0 | q4_0 | q4_k_m | q5_k_m) echo "$1" ;; esac
}
# What erinfer loads: our model dir, or for llama.cpp's quantizations the same .gguf llama.cpp runs.
er_model() { case $1 in q8_0 | q4_0 | q4_k_m | q5_k_m) echo "$dir/$1.gguf" ;; *) echo "$dir/$1" ;; esac; }
for f in $FORMATS; do
  t=$(gguf_type "$f")
  [ -n "$t" ] || { echo "run_llama: unknown format $f (f32, q8, q4, q4g32, q8_0, q4_0, q4_k_m, q5_k_m)" >&2; exit 1; }
  if [ ! -f "$dir/$f.gguf" ] && [ "$(er_model "$f")" = "$dir/$f.gguf" ]; then
    if [ ! -f "$dir/f32.gguf" ]; then # llama.cpp quantizes the f32 GGUF, made here where FORMATS leaves f32 out
      "$BUILD/ertrain" export gguf --model "$dir/f32" --out "$dir/f32.gguf.tmp" --type f32
      mv "$dir/f32.gguf.tmp" "$dir/f32.gguf"
    fi
    "$BUILD/bench/llama_quantize" "$dir/f32.gguf" "$dir/$f.gguf.tmp" "$f" --threads "$THREADS" >/dev/null 2>&1
    mv "$dir/$f.gguf.tmp" "$dir/$f.gguf"
  elif [ ! -f "$dir/$f.gguf" ]; then
    "$BUILD/ertrain" export gguf --model "$dir/$f" --out "$dir/$f.gguf.tmp" --type "$t"
    mv "$dir/$f.gguf.tmp" "$dir/$f.gguf"
  fi
done

if [ "$QWEN3" = 1 ]; then
  mkdir -p "$q3"
  if [ ! -d "$q3/f32" ]; then
    rm -rf "$q3/f32.tmp"
    "$BUILD/ertrain" init --config configs/qwen3-0.6b.json --out "$q3/f32.tmp" --tokenizer "$tok" --threads "$THREADS"
    mv "$q3/f32.tmp" "$q3/f32"
  fi
  if [ ! -d "$q3/q4" ]; then
    rm -rf "$q3/q4.tmp"
    "$BUILD/ertrain" quantize --model "$q3/f32" --out "$q3/q4.tmp" --weights q4
    mv "$q3/q4.tmp" "$q3/q4"
  fi
  if [ ! -f "$q3/q4.gguf" ]; then
    "$BUILD/ertrain" export gguf --model "$q3/q4" --out "$q3/q4.gguf.tmp" --type q4_0
    mv "$q3/q4.gguf.tmp" "$q3/q4.gguf"
  fi
fi

# Measure: the int8 peak, then llama.cpp and erinfer per format, each on an otherwise idle process.
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
"$BUILD/bench/int8_peak" --threads "$THREADS" >"$dir/int8_peak.json"
for f in $FORMATS; do
  echo "run_llama: $f: llama.cpp ($(gguf_type "$f")), then erinfer bench; load $(cut -d' ' -f1-3 /proc/loadavg)"
  # shellcheck disable=SC2086
  node bench/llama_decode.mjs "$dir/$f.gguf" "$THREADS" "$PROMPT" "$NEW" $LLAMA_NS >"$dir/$f.llama.json"
  "$BUILD/erinfer" bench --model "$(er_model "$f")" --prompt-tokens "$PROMPT" --new-tokens "$NEW" \
    --threads "$THREADS" --json >"$dir/$f.erinfer.json"
done
if [ "$LONG" -gt 0 ]; then
  echo "run_llama: q4 at $LONG positions, erinfer bench (f32 then int8 KV); load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$BUILD/erinfer" bench --model "$dir/q4" --prompt-tokens "$LONG" --new-tokens 32 --threads "$THREADS" \
    --json >"$dir/q4.long.json"
fi
if [ "$QWEN3" = 1 ]; then
  echo "run_llama: Qwen3-0.6B shape, q4 / Q4_0: llama.cpp, then erinfer bench; load $(cut -d' ' -f1-3 /proc/loadavg)"
  # shellcheck disable=SC2086
  node bench/llama_decode.mjs "$q3/q4.gguf" "$THREADS" "$PROMPT" "$NEW" $LLAMA_NS >"$q3/q4.llama.json"
  "$BUILD/erinfer" bench --model "$q3/q4" --prompt-tokens "$PROMPT" --new-tokens "$NEW" --threads "$THREADS" \
    --json >"$q3/q4.erinfer.json"
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# The table: decode tok/s per sequence and step time at each llama.cpp N, erinfer's f32-KV row at the same N,
# then erinfer's int8-KV row (its speed against the f32-KV row, and its N/1 step ratio).
node - "$dir" "$FORMATS" "$LONG" "$PROMPT" "$QWEN3" "$q3" <<'EOF'
const fs = require("fs");
const [dir, formats, long, prompt, qwen3, q3] = process.argv.slice(2);
const gguf = {f32: "F32", q8: "Q8_0", q4: "Q4_0", q4g32: "Q4_0", q8_0: "Q8_0*", q4_0: "Q4_0*", q4_k_m: "Q4_K_M*",
    q5_k_m: "Q5_K_M*"};
const cfg = JSON.parse(fs.readFileSync(`${dir}/config.json`, "utf8"));
const C = cfg.hidden_size, KV = cfg.num_key_value_heads * C / cfg.num_attention_heads;
const macsPerToken = cfg.num_hidden_layers * (2 * C * C + 2 * C * KV + 3 * C * cfg.intermediate_size);
const peak = JSON.parse(fs.readFileSync(`${dir}/int8_peak.json`, "utf8"));
const prefill = [], memory = [];
let release = "";
const lines = [];
for (const f of formats.split(/\s+/).filter(Boolean)) {
    const ll = JSON.parse(fs.readFileSync(`${dir}/${f}.llama.json`, "utf8"));
    const er = JSON.parse(fs.readFileSync(`${dir}/${f}.erinfer.json`, "utf8"));
    release = ll.llama_cpp;
    const p1 = ll.rows.find(r => r.n === 1), e1 = er.rows.find(r => r.kv === "f32" && r.n === 1);
    const gmacs = ms => prompt * macsPerToken / (ms / 1e3) / 1e9;
    if (f !== "f32")
        prefill.push(`${f}: erinfer ${(prompt / (e1.ttft_ms / 1e3)).toFixed(0)} prompt tokens/s ` +
            `(${gmacs(e1.ttft_ms).toFixed(0)} G int8 MAC/s, ${(100 * gmacs(e1.ttft_ms) / peak.gmacs).toFixed(0)}% of the peak), ` +
            `llama.cpp ${(prompt / (p1.ttft_ms / 1e3)).toFixed(0)} (${(100 * gmacs(p1.ttft_ms) / peak.gmacs).toFixed(0)}%): ` +
            `${(p1.ttft_ms / e1.ttft_ms).toFixed(2)}x`);
    if (gguf[f].endsWith("*"))
        memory.push(`${f}: file ${(fs.statSync(`${dir}/${f}.gguf`).size / 1048576).toFixed(1)} MiB, erinfer's weights resident ` +
            `${(er.weights_resident_bytes / 1048576).toFixed(1)} MiB ` +
            `(${(er.weights_resident_bytes / fs.statSync(`${dir}/${f}.gguf`).size).toFixed(3)}x)`);
    const step1 = {ll: ll.rows.find(r => r.n === 1), er: er.rows.find(r => r.kv === "f32" && r.n === 1),
        e8: er.rows.find(r => r.kv === "int8" && r.n === 1)};
    for (const l of ll.rows) {
        const e = er.rows.find(r => r.kv === "f32" && r.n === l.n), q = er.rows.find(r => r.kv === "int8" && r.n === l.n);
        const fmt = (x, d) => x === undefined ? "-" : x.toFixed(d);
        lines.push([`${f} / ${gguf[f]}`, l.n, fmt(l.ttft_ms, 0), fmt(e?.ttft_ms, 0), fmt(l.tokens_per_s_seq, 1),
            fmt(e?.tokens_per_s_seq, 1), fmt(e && e.tokens_per_s_seq / l.tokens_per_s_seq, 2) + "x",
            fmt(l.step_ms / step1.ll.step_ms, 2) + "x", fmt(e && e.step_ms / step1.er.step_ms, 2) + "x",
            fmt(q?.tokens_per_s_seq, 1), fmt(q && e && q.tokens_per_s_seq / e.tokens_per_s_seq, 2) + "x",
            fmt(q && q.step_ms / step1.e8.step_ms, 2) + "x"]);
    }
}
console.log(`llama.cpp ${release} (node-llama-cpp, CPU, greedy) vs erinfer bench (samples at temperature 1); both f32 KV, ` +
    "one prompt prefill shared by the N sequences; er8: erinfer with the int8 KV cache");
const head = ["format", "N", "TTFT_ll_ms", "TTFT_er_ms", "ll_tok/s/seq", "er_tok/s/seq", "er/ll", "ll_stepN/1",
    "er_stepN/1", "er8_tok/s/seq", "er8/er", "er8_stepN/1"];
const w = head.map((h, i) => Math.max(h.length, ...lines.map(l => String(l[i]).length)));
for (const l of [head, ...lines])
    console.log(l.map((x, i) => String(x).padStart(w[i])).join("  "));
console.log("* quantized by llama.cpp's llama_model_quantize from the f32 GGUF; erinfer runs that same file");
console.log(`prefill of ${prompt} tokens (${(macsPerToken / 1e6).toFixed(1)} M multiply-adds a token in the layers) against the ${peak.threads}-thread ` +
    `int8 peak, ${peak.gmacs} G MAC/s (${peak.isa}):`);
for (const l of prefill)
    console.log("  " + l);
for (const l of memory)
    console.log("memory: " + l);
if (Number(long) > 0) {
    const er = JSON.parse(fs.readFileSync(`${dir}/q4.long.json`, "utf8"));
    const row = (kv, n) => er.rows.find(r => r.kv === kv && r.n === n);
    const speed = n => (row("int8", n).tokens_per_s_seq / row("f32", n).tokens_per_s_seq).toFixed(2) + "x";
    console.log(`q4 weights at ${long} prompt positions, int8 KV / f32 KV: decode N=1 ${speed(1)}, N=8 ${speed(8)}; ` +
        `prefill ${(row("f32", 1).ttft_ms / row("int8", 1).ttft_ms).toFixed(2)}x; ` +
        `KV at N=1 ${(row("int8", 1).kv_bytes / 1048576).toFixed(1)} vs ${(row("f32", 1).kv_bytes / 1048576).toFixed(1)} MiB`);
}
if (qwen3 === "1") {
    const ll = JSON.parse(fs.readFileSync(`${q3}/q4.llama.json`, "utf8"));
    const er = JSON.parse(fs.readFileSync(`${q3}/q4.erinfer.json`, "utf8"));
    const l1 = ll.rows.find(r => r.n === 1), e1 = er.rows.find(r => r.kv === "f32" && r.n === 1);
    const decode = ll.rows.map(l => {
        const e = er.rows.find(r => r.kv === "f32" && r.n === l.n);
        return `N=${l.n} ${e.tokens_per_s_seq.toFixed(1)} vs ${l.tokens_per_s_seq.toFixed(1)} tok/s/seq ` +
            `(${(e.tokens_per_s_seq / l.tokens_per_s_seq).toFixed(2)}x)`;
    });
    console.log(`Qwen3-0.6B shape (28 layers, q/k norms), q4 / Q4_0 from it, erinfer vs llama.cpp (qwen3): prefill ` +
        `${e1.ttft_ms.toFixed(0)} vs ${l1.ttft_ms.toFixed(0)} ms (${(l1.ttft_ms / e1.ttft_ms).toFixed(2)}x); decode ` +
        decode.join(", "));
}
EOF
echo "run_llama: $THREADS threads, prompt $PROMPT, $NEW new tokens; load average $load_before before, $load_after after"
