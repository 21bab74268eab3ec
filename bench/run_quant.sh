#!/usr/bin/env bash
# Quantized decode: the per-token weight pass of a Qwen2.5-0.5B-shaped model in fp32, bf16, q8, q4, q4g and
# q2lut (bench/quant_decode.c), with the ratios against fp32 (target: q4 >= 2.5x). About a minute on
# 2 cores; needs ~2.5 GB of memory (QUANT_FLAGS="--layers 8" for less).
# Timings are sensitive to other load on the machine: the load average is printed with them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BUILD=${BUILD:-build}
THREADS=${THREADS:-$(nproc)}
bin=$BUILD/bench/quant_decode
if [ ! -x "$bin" ]; then
  make "$bin" >/dev/null || { echo "run_quant: cannot build $bin" >&2; exit 1; }
fi
echo "run_quant: $(uptime)"
# shellcheck disable=SC2086
"$bin" --threads "$THREADS" ${QUANT_FLAGS:-}
echo "run_quant: $(uptime)"
