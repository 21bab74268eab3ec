#!/usr/bin/env bash
# OpenBLAS comes from pkg-config, not from a fixed path (run by make test): the Makefile read by `make -n` (prints
# the commands, runs none) with pkg-config pointed at
#   - a made-up openblas.pc: the compile and link lines carry its -I, -L and -l flags (and the RPATH to its libdir);
#   - no openblas.pc at all: BLAS=1 stops with one line naming pkg-config, openblas and the way out (BLAS=0), and
#     BLAS=0 still builds.
#   tests/link/make_blas.sh
set -u
cd "$(dirname "$0")/../.."
# A user's make, not a sub-make of the one running the tests (whose -j would print a jobserver warning first).
unset MAKEFLAGS MFLAGS MAKELEVEL
tmp=$(mktemp -d /tmp/er_make_blas_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "make_blas: $*" >&2; exit 1; }

mkdir -p "$tmp/pc" "$tmp/none"
cat > "$tmp/pc/openblas.pc" <<'EOF'
Name: openblas
Description: a stand-in: its flags must reach the compile and link lines
Version: 0.3.21
Libs: -L/opt/er-fake-blas/lib -lopenblas
Cflags: -I/opt/er-fake-blas/include
EOF
out=$(PKG_CONFIG_LIBDIR="$tmp/pc" make -n -B --no-print-directory BLAS=1 build/obj/core/gemm.o build/erinfer 2>&1) ||
  fail "make -n with a stand-in openblas.pc failed: $out"
grep -q -- '-DER_BLAS -I/opt/er-fake-blas/include.* -c core/gemm.c' <<<"$out" ||
  fail "core/gemm.c is not compiled with the openblas.pc's Cflags: $(grep -- 'core/gemm.c' <<<"$out")"
grep -q -- '-L/opt/er-fake-blas/lib -lopenblas -Wl,-rpath,/opt/er-fake-blas/lib.* -o build/erinfer' <<<"$out" ||
  fail "build/erinfer is not linked with the openblas.pc's Libs: $(grep -- '-o build/erinfer' <<<"$out")"
if grep -q 'openblas-openmp' <<<"$out"; then fail "a fixed OpenBLAS path is still used: $out"; fi

err=$(PKG_CONFIG_LIBDIR="$tmp/none" make -n --no-print-directory BLAS=1 all 2>&1 >/dev/null) &&
  fail "BLAS=1 without an openblas.pc did not fail"
[ "$(wc -l <<<"$err")" -eq 1 ] || fail "BLAS=1 without an openblas.pc: not one line: $err"
grep -q 'BLAS=1: `pkg-config --libs openblas` finds no OpenBLAS.*make BLAS=0' <<<"$err" ||
  fail "BLAS=1 without an openblas.pc: unclear error: $err"
PKG_CONFIG_LIBDIR="$tmp/none" make -n --no-print-directory BLAS=0 all >/dev/null 2>&1 ||
  fail "BLAS=0 does not build without an openblas.pc"
echo "make_blas: OpenBLAS flags come from pkg-config; without it BLAS=1 stops with: $err"
