#!/usr/bin/env bash
# erinfer beside real llama.cpp in one process (tests/link/beside_llama.c), run by make test:
#   CC=cc LDFLAGS='the link flags' LIBS='what liberinfer.a links with' SHARED_LIB=BUILD/liberinfer.so.X.Y.Z \
#     tests/link/beside_llama.sh BUILD
# Links the program against the shipped BUILD/liberinfer.a and, when SHARED_LIB names it, liberinfer.so, each with
# node-llama-cpp's libllama and libggml shared libraries (scripts/llama_cpp.sh installs the pinned package into
# build/node_modules, as for the GGUF tests); llama.h and ggml's headers come from the package's own llama.cpp
# source bundle. Runs each on models/tiny-base and its GGUF export (BUILD/ertrain export gguf). Skips LOUDLY
# (status 0) where node, npm or the package is missing; any other failure is status 1.
set -u
build=${1:?usage: beside_llama.sh BUILD}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
cc=${CC:-cc}
fail() { echo "beside_llama: $*" >&2; exit 1; }

if ! bash scripts/llama_cpp.sh --install; then
  echo "!!!!!! beside_llama: no node-llama-cpp (see above): erinfer beside llama.cpp NOT TESTED (SKIPPED) !!!!!!" >&2
  exit 0
fi
case $(uname -m) in
  x86_64) plat=linux-x64 ;;
  aarch64) plat=linux-arm64 ;;
  *) echo "!!!!!! beside_llama: no node-llama-cpp binaries for $(uname -m): NOT TESTED (SKIPPED) !!!!!!" >&2; exit 0 ;;
esac
nlc=build/node_modules/node-llama-cpp
# libllama.so or libllama.vX.Y.Z.so (not libllama-common.so, node-llama-cpp's own helpers)
libllama=$(ls build/node_modules/@node-llama-cpp/$plat/bins/*/libllama.so \
  build/node_modules/@node-llama-cpp/$plat/bins/*/libllama.*so 2>/dev/null | head -n 1)
[ -n "$libllama" ] || fail "no libllama.so under build/node_modules/@node-llama-cpp/$plat/bins/"
bins=$(cd "$(dirname "$libllama")" && pwd)
libggml=$(ls "$bins"/libggml.so "$bins"/libggml.*so 2>/dev/null | head -n 1)
[ -f "$bins/libggml-base.so" ] && [ -n "$libggml" ] || fail "$bins: no libggml / libggml-base"

# The headers of the release the binaries were built from (its source ships as a git bundle in the package).
out=$build/beside_llama
bundle=$nlc/llama/gitRelease.bundle
[ -f "$bundle" ] || fail "$bundle: missing (node-llama-cpp's llama.cpp source, for llama.h)"
mkdir -p "$out"
if [ ! -f "$out/include/llama.h" ] || [ "$bundle" -nt "$out/include/llama.h" ]; then
  rm -rf "$out/src" "$out/include" && git init -q "$out/src" &&
    git -C "$out/src" fetch -q "$root/$bundle" 2>/dev/null &&
    git -C "$out/src" archive FETCH_HEAD include ggml/include | tar -x -C "$out" &&
    mv "$out/ggml/include/"*.h "$out/include/" && rm -rf "$out/src" "$out/ggml" ||
    fail "$bundle: could not extract include/llama.h and ggml/include"
fi

gguf=$out/tiny-base.gguf
"$build/ertrain" export gguf --model models/tiny-base --out "$gguf" >/dev/null || fail "ertrain export gguf failed"

llama_libs="-L$bins -l:$(basename "$libllama") -l:$(basename "$libggml") -l:libggml-base.so -Wl,-rpath,$bins"
cflags="-std=c11 -O1 -g -Wall -Wextra -Werror -Iinfer -I$out/include"
status=0
# shellcheck disable=SC2086 # word splitting of the flag lists is wanted
run() { # NAME LINK-FLAGS...
  local name=$1; shift
  $cc $cflags tests/link/beside_llama.c "$@" -o "$out/$name" || fail "$name: does not link"
  local needs
  needs=$(readelf -d "$out/$name" | sed -n 's/.*NEEDED.*\[\(lib\(erinfer\|llama\|ggml\).*\)\]/\1/p' | tr '\n' ' ')
  echo "beside_llama: $name, needs: $needs"
  "$out/$name" models/tiny-base "$gguf" "$bins"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "beside_llama: $name FAILED (status $rc): erinfer and llama.cpp do not work in one process" >&2
    status=1
  fi
}
# shellcheck disable=SC2086
run static ${LDFLAGS:-} "$build/liberinfer.a" $llama_libs ${LIBS:-}
if [ -n "${SHARED_LIB:-}" ]; then
  so_dir=$(cd "$(dirname "$SHARED_LIB")" && pwd)
  # shellcheck disable=SC2086
  run shared ${LDFLAGS:-} -L"$so_dir" -lerinfer -Wl,-rpath,"$so_dir" $llama_libs -lm # LDFLAGS: SAN=1's runtime
fi
exit $status
