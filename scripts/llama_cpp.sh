#!/usr/bin/env bash
# Real llama.cpp for the GGUF tests: installs node-llama-cpp (pinned; its prebuilt linux-x64 CPU
# binaries, llama.cpp release in build/node_modules/node-llama-cpp/llama/binariesGithubRelease.json) into
# build/node_modules like bench/run_tokenizer.sh does, then runs scripts/llama_cpp.mjs JOB.json OUT.json.
# Exit 77 (with a loud line) when node or npm is missing or the install fails: callers skip, loudly.
#   scripts/llama_cpp.sh --install    only installs (CI: fails, status 1, where the tests would skip)
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
pkg=node-llama-cpp@3.22.1

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "!!!!!! llama_cpp: node or npm is not installed: NO llama.cpp COMPARISON !!!!!!" >&2
  [ "${1:-}" = --install ] && exit 1
  exit 77
fi
if [ ! -f build/node_modules/node-llama-cpp/package.json ] ||
   ! grep -q '"version": "3.22.1"' build/node_modules/node-llama-cpp/package.json; then
  echo "llama_cpp: installing $pkg into build/node_modules" >&2
  mkdir -p build
  # Serialized: parallel test processes share build/node_modules.
  if ! flock build/.npm-llama.lock npm install --prefix build --no-save --no-audit --no-fund --ignore-scripts \
       "$pkg" >build/npm-llama.log 2>&1; then
    echo "!!!!!! llama_cpp: npm could not install $pkg (see build/npm-llama.log): NO llama.cpp COMPARISON !!!!!!" >&2
    [ "${1:-}" = --install ] && exit 1
    exit 77
  fi
fi
if [ "${1:-}" = --install ]; then
  echo "llama_cpp: $pkg in build/node_modules, llama.cpp $(sed -n 's/.*"release": *"\(.*\)".*/\1/p' \
    build/node_modules/node-llama-cpp/llama/binariesGithubRelease.json)" >&2
  exit 0
fi
exec node scripts/llama_cpp.mjs "$@"
