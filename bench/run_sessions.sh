#!/usr/bin/env bash
# Two conversations at once on the tiny base (bench/sessions.c): one session of 2 threads against two sessions of
# 1 thread on two app threads (ErSessionParams.n_threads), and two of 2 threads (oversubscribed), per wall second
# and per CPU second, medians of 5 rounds, with the load average. Extra arguments go to the program.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BUILD=${BUILD:-build}
bin=$BUILD/bench/sessions

if [ ! -x "$bin" ]; then
  make "$bin" >/dev/null || { echo "run_sessions: cannot build $bin" >&2; exit 1; }
fi
echo "== sessions side by side: 1 x 2 threads vs 2 x 1 thread (models/tiny-base) =="
"$bin" --rounds 5 "$@" | sed -n '/^$/,$p'
