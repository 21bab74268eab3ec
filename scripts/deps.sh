#!/usr/bin/env bash
# Installs every Debian package the build, tests, bench and demo need. Idempotent: when all
# packages are present it only checks and returns in well under a second.
set -euo pipefail

PKGS=(
  build-essential pkg-config
  libopenblas-openmp-dev # sgemm for the dense kernels (OpenMP build: shares the thread pool)
  libcjson-dev           # JSON (config.json, safetensors headers, JSONL)
  libcriterion-dev       # test framework
  libpcre2-dev           # tokenizer pre-split regex
  libutf8proc-dev        # NFC normalizer
  python3 python3-torch python3-numpy   # PyTorch reference (tests only)
  gnuplot-nox            # plots in the demo
  python3-jinja2         # golden chat-template renderings (scripts/make_chat_golden.py)
  clang libclang-rt-14-dev libomp-14-dev   # fuzz targets (make fuzz: libFuzzer, ASan/UBSan runtimes, OpenMP)
)
# Data-parallel training (make MPI=1): OpenMPI's mpicc, mpirun and headers, on request.
if [ "${MPI:-0}" = 1 ]; then
  PKGS+=(openmpi-bin libopenmpi-dev)
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "deps.sh: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
