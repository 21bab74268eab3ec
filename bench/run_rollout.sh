#!/usr/bin/env bash
# GRPO rollouts of one step on the Qwen2.5-0.5B shape: P = 8 prompts x G = 8 samples, the old loop (one
# engine_generate per prompt) against rollout_groups (all groups in one batch), each side's bound, and the
# rollout share of a GRPO step. About 3 minutes on 2 cores; extra flags go to the program (--prompt-tokens,
# --new-tokens, --prompts, --group, --rounds).
set -euo pipefail
BUILD=${BUILD:-build}
echo "run_rollout: $(uptime)"
"$BUILD/bench/rollout" --threads "${THREADS:-$(nproc)}" "$@"
echo "run_rollout: $(uptime)"
