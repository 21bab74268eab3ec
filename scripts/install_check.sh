#!/usr/bin/env bash
# make install-check's second half (CI runs it after make test): the Makefile has installed into DIR/shared
# (make install), DIR/static (make install SHARED=0, the archive alone) and DIR/stage (DESTDIR=DIR/stage
# PREFIX=/opt/erinfer). Here infer/examples/example.c is built against the first two copies with nothing but what
# `pkg-config ... erinfer` prints (PKG_CONFIG_PATH pointing at that prefix), and run on models/tiny-base:
#   - shared: `pkg-config --cflags --libs erinfer`, linked to liberinfer.so.MAJOR, run with LD_LIBRARY_PATH (and
#     not without it);
#   - static: `pkg-config --static --cflags --libs erinfer`, liberinfer.a linked in (no liberinfer.so needed);
# and the staged files lie under DIR/stage/opt/erinfer, erinfer.pc naming /opt/erinfer.
#   CC=cc scripts/install_check.sh DIR
set -euo pipefail
dir=${1:?usage: install_check.sh DIR}
cd "$(dirname "$0")/.."
cc=${CC:-cc}
fail() { echo "install_check: $*" >&2; exit 1; }
command -v pkg-config >/dev/null || fail "pkg-config is not installed (scripts/deps.sh installs it)"

# example PREFIX NAME PKG-CONFIG-FLAGS...: builds DIR/NAME from the example against PREFIX's erinfer.pc alone.
example() {
  local prefix=$1 name=$2 flags
  shift 2
  [ -f "$prefix/include/erinfer.h" ] || fail "$prefix/include/erinfer.h: not installed"
  flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config "$@" erinfer) ||
    fail "$prefix/lib/pkgconfig/erinfer.pc: pkg-config $* erinfer failed"
  echo "install_check: $name: $cc infer/examples/example.c $flags"
  # shellcheck disable=SC2086 # the flags are words
  $cc -std=c11 -Wall -Wextra -Werror infer/examples/example.c $flags -o "$dir/$name" ||
    fail "$name: the example does not build against $prefix"
}

# run NAME [ENV...]: the example on the tiny base must stream a reply and exit 0.
run() {
  local name=$1 out
  shift
  out=$(env "$@" "$dir/$name" models/tiny-base "Start with 2. Add 3. What is the result?") ||
    fail "$name: the example exited $? (env: $*)"
  grep -q '^reply: ' <<<"$out" && grep -q '^stats: ' <<<"$out" || fail "$name: unexpected output: $out"
}

needed() { readelf -d "$dir/$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

shared=$dir/shared
for f in lib/liberinfer.a lib/liberinfer.so lib/pkgconfig/erinfer.pc; do
  [ -e "$shared/$f" ] || fail "$shared/$f: not installed"
done
soname=$(readelf -d "$shared/lib/liberinfer.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ -n "$soname" ] && [ -L "$shared/lib/$soname" ] || fail "$shared/lib: no $soname link to the library"
example "$shared" example-shared --cflags --libs
libs=$(needed example-shared)
grep -qx "$soname" <<<"$libs" || fail "example-shared does not link $soname: $libs"
# Without the library's directory on the loader's path the program must not start: the .so is what it runs.
if env -u LD_LIBRARY_PATH "$dir/example-shared" models/tiny-base >/dev/null 2>&1; then
  fail "example-shared ran without LD_LIBRARY_PATH: it did not use the installed $soname"
fi
run example-shared LD_LIBRARY_PATH="$shared/lib"
echo "install_check: example-shared runs on $shared/lib/$soname"

static=$dir/static
[ ! -e "$static/lib/liberinfer.so" ] || fail "$static/lib/liberinfer.so: installed with SHARED=0"
example "$static" example-static --static --cflags --libs
libs=$(needed example-static)
if grep -q '^liberinfer' <<<"$libs"; then fail "example-static needs $libs"; fi
run example-static
echo "install_check: example-static runs with liberinfer.a linked in"

stage=$dir/stage/opt/erinfer
for f in include/erinfer.h lib/liberinfer.a lib/liberinfer.so lib/pkgconfig/erinfer.pc; do
  [ -e "$stage/$f" ] || fail "$stage/$f: not installed under DESTDIR"
done
grep -qx 'prefix=/opt/erinfer' "$stage/lib/pkgconfig/erinfer.pc" ||
  fail "$stage/lib/pkgconfig/erinfer.pc: prefix is not PREFIX (/opt/erinfer): $(grep '^prefix=' "$stage/lib/pkgconfig/erinfer.pc")"
echo "install_check: DESTDIR=$dir/stage PREFIX=/opt/erinfer installs under $stage"
