#!/usr/bin/env bash
# GRPO rollouts: G = 8 batched vs 8 sequential generations, and the rollout share of a GRPO step.
set -euo pipefail
BUILD=${BUILD:-build}
"$BUILD/bench/rollout" --threads "${THREADS:-$(nproc)}"
