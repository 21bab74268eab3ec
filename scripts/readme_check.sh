#!/usr/bin/env bash
# Checks the documents (scripts/check_docs.py: every relative link in README.md and docs/*.md resolves,
# nothing points to ../shared, the README stays short), then runs the README's pipeline ("The pipeline on
# a real model") as written on the tiny default: the one block of commands, with M, BUDGETS and B set
# as its comments say for models/tiny-base, the step and record counts shortened, and the heads allowed
# one class (64 records and 2-step adapters may derive no positive label; the only edits).
# Each command runs in a scratch dir holding links to build/, scripts/ and models/, so nothing in the
# checkout is touched; any failing command fails this.
#   scripts/readme_check.sh [BUILD_DIR]      (default build; the binaries must be built)
#   KEEP=1 scripts/readme_check.sh           keeps the scratch dir and its log.txt
set -euo pipefail
cd "$(dirname "$0")/.."
# As in the demo: OpenMP threads that spin while they wait make a 2-core run crawl whenever the other
# core is busy.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ROOT=$PWD
BIN=${1:-build}
python3 scripts/check_docs.py
block=$(awk '/^## The pipeline on a real model/{f=1} f&&/^```sh$/{g=1; next} g&&/^```$/{exit} g{print}' README.md)
[ -n "$block" ] || { echo "readme_check: no pipeline block in README.md" >&2; exit 1; }
script=$(printf '%s\n' "$block" | sed -E \
  -e 's|^M=[^ ]*|M=models/tiny-base|' -e 's|^BUDGETS=[^ ]*|BUDGETS=32,64,128|' -e 's|^B=[^ ]*|B=64|' \
  -e 's|^make( .*)?$|true|' \
  -e 's|--n 20000|--n 64|' -e 's|--n 500|--n 8|' \
  -e 's|--epochs [0-9]+|--steps 2|' -e 's|--steps [0-9]+|--steps 2|' \
  -e 's|--save-every [0-9]+|--save-every 1|' \
  -e 's|--derive-labels|--derive-labels --allow-one-class|')
work=$(mktemp -d /tmp/er_readme_XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
ln -s "$ROOT/$BIN" "$work/build"
ln -s "$ROOT/scripts" "$work/scripts"
ln -s "$ROOT/models" "$work/models"
cd "$work"
t0=$(date +%s)
printf '%s\n' "$script" > readme_pipeline.sh
echo "readme_check: running the README pipeline on models/tiny-base in $work" >&2
if ! bash -euo pipefail -x readme_pipeline.sh > log.txt 2>&1; then
  echo "readme_check: FAILED; the last lines:" >&2
  tail -15 log.txt >&2
  exit 1
fi
echo "readme_check: every README pipeline command ran ($(( $(date +%s) - t0 )) s)" >&2
