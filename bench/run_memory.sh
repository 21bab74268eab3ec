#!/usr/bin/env bash
# erinfer memory's exact vector scan: 100k entries x 1024 dims (int8) against the read bandwidth (bench/memory_scan.c;
# docs/memory.md). Builds a scratch store of about 100 MB in /tmp first (a minute or so on 2 cores).
set -euo pipefail
BUILD=${BUILD:-build}
"$BUILD/bench/memory_scan" --threads "${THREADS:-$(nproc)}" "$@"
