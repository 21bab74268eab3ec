#!/usr/bin/env bash
# Runs libFuzzer targets one after the other (make fuzz calls this):
#   tests/fuzz/run.sh OUT_DIR SECONDS TARGET...
# Each target OUT_DIR/TARGET fuzzes for SECONDS on OUT_DIR/corpus/TARGET, a scratch corpus that the
# committed seeds tests/fuzz/corpus/TARGET are copied into (what the fuzzer adds stays out of git),
# with tests/fuzz/TARGET.dict when there is one. Reproducers go to OUT_DIR/crashes/TARGET/, the whole
# log to OUT_DIR/TARGET.log. Exits non-zero when any target crashed, leaked, timed out, ran out of
# memory or printed a sanitizer report; prints one summary line per target either way.
set -uo pipefail
cd "$(dirname "$0")/../.."

if [ $# -lt 3 ]; then
  echo "usage: $0 OUT_DIR SECONDS TARGET..." >&2
  exit 2
fi
out=$1
secs=$2
shift 2

# One thread: the fuzzer is one process on a shared machine, and OpenMP teams would only add noise.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

failed=()
for t in "$@"; do
  bin=$out/$t
  if [ ! -x "$bin" ]; then
    echo "fuzz: $bin is not built (make fuzz-build)" >&2
    failed+=("$t")
    continue
  fi
  corpus=$out/corpus/$t
  crashes=$out/crashes/$t
  log=$out/$t.log
  mkdir -p "$corpus" "$crashes"
  if [ -d "tests/fuzz/corpus/$t" ]; then
    cp -n "tests/fuzz/corpus/$t"/* "$corpus"/ 2>/dev/null || true
  fi
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=("-dict=tests/fuzz/$t.dict")
  "$bin" "$corpus" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$crashes/" "${dict[@]}" >"$log" 2>&1
  rc=$?
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | tail -1 | grep -o '[0-9]*$')
  rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | tail -1 | grep -o '[0-9]*$')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  bad=0
  [ "$rc" -ne 0 ] && bad=1
  grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|fuzz check failed' "$log" && bad=1
  printf 'fuzz: %-22s %10s runs %7s exec/s  cov %6s  ft %6s  %s\n' "$t" "${runs:-?}" "${rate:-?}" "${cov:-?}" \
    "${ft:-?}" "$([ $bad -eq 0 ] && echo ok || echo "FAILED (rc $rc, log $log)")"
  if [ $bad -ne 0 ]; then
    failed+=("$t")
    grep -E -A40 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|fuzz check failed' "$log" |
      head -60 >&2
    ls "$crashes" >&2
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (reproduce with: $out/TARGET $out/crashes/TARGET/FILE)" >&2
  exit 1
fi
