# shellcheck shell=bash disable=SC2034  # the settings are used by the scripts that source this file
# Sourced by scripts/demo.sh and scripts/paper.sh from the repository root: their common settings, the
# stage headers and two stages side by side.
# OpenMP threads that spin while waiting make a 2-thread run several times slower whenever the other
# core is busy (two stages run side by side); passive waiting costs little here.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
QUICK=${QUICK:-0}
B=${B:-build}
BASE=models/tiny-base
PY=/usr/bin/python3
T1="--threads 1"
t_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - t_start )); }
stage() { echo; echo "== $* ($(elapsed) s) =="; }
# Two stages side by side; both must succeed (the second is waited for even when the first fails).
both() {
  "$1" & local a=$!
  "$2" & local b=$!
  local ra=0 rb=0
  wait $a || ra=$?
  wait $b || rb=$?
  [ "$ra" = 0 ] && [ "$rb" = 0 ]
}
