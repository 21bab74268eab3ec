#!/usr/bin/env bash
# Decode speed against the memory-bandwidth bound, N = 8 vs N = 1 step time and KV int8 vs fp32, on a
# random Qwen2.5-0.5B-shaped model and a tiny one (bench/decode.c). About two minutes on 2 cores;
# the 0.5B model needs ~2 GB of memory (DECODE_FLAGS=--skip-big for the tiny model only).
# Timings are sensitive to other load on the machine: the load average is printed with them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BUILD=${BUILD:-build}
THREADS=${THREADS:-$(nproc)}
bin=$BUILD/bench/decode
if [ ! -x "$bin" ]; then
  make "$bin" >/dev/null || { echo "run_decode: cannot build $bin" >&2; exit 1; }
fi
echo "run_decode: $(uptime)"
# shellcheck disable=SC2086
"$bin" --threads "$THREADS" ${DECODE_FLAGS:-}
echo "run_decode: $(uptime)"
