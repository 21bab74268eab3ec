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
  libmicrohttpd-dev      # erinfer serve's HTTP server (the erinfer program only, never liberinfer)
  libsqlite3-dev         # erinfer memory's store, SQLite with FTS5 (the erinfer program only, never liberinfer)
)
# Data-parallel training (make MPI=1): OpenMPI's mpicc, mpirun and headers, on request.
if [ "${MPI:-0}" = 1 ]; then
  PKGS+=(openmpi-bin libopenmpi-dev)
fi

# The aarch64 cross build, on request (ARM64=1 scripts/deps.sh; make CROSS=aarch64-linux-gnu-): the cross
# compiler, qemu-user, the runtime's libraries for arm64 (Debian multiarch), cJSON's source and qemu's
# binfmt entry. Installed here, before the rest, because the steps after the install need it.
if [ "${ARM64:-0}" = 1 ]; then
  SUDO_ARM=""
  [ "$(id -u)" -eq 0 ] || SUDO_ARM="sudo"
  arm=(dpkg-dev gcc-aarch64-linux-gnu qemu-user libc6:arm64 libgomp1:arm64
       libcjson-dev:arm64 libpcre2-dev:arm64 libutf8proc-dev:arm64 libffi8:arm64 libgit2-1.5:arm64)
  arm_missing=()
  for p in "${arm[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || arm_missing+=("$p")
  done
  if [ ${#arm_missing[@]} -gt 0 ]; then
    dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO_ARM dpkg --add-architecture arm64
    echo "deps.sh: installing ${arm_missing[*]}" >&2
    $SUDO_ARM apt-get update -qq
    # An arm64 package that is not co-installable would replace its amd64 twin (the x86 build's): refuse.
    removes=$(apt-get -s install --no-install-recommends "${arm_missing[@]}" | sed -n 's/^Remv //p')
    if [ -n "$removes" ]; then
      echo "deps.sh: installing ${arm_missing[*]} would remove: $removes; not installing" >&2
      exit 1
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO_ARM apt-get install -y -qq --no-install-recommends "${arm_missing[@]}" >&2
  fi
  # Debian ships no static libcjson, so the static aarch64 erinfer compiles cJSON.c from Debian's own
  # source package (the version and security patches of libcjson-dev), unpacked once into CJSON_SRC.
  # The source lists are the system's binary ones turned into deb-src, in a scratch apt state.
  CJSON_SRC=${CJSON_SRC:-/usr/local/src/cjson}
  if [ ! -f "$CJSON_SRC/cJSON.c" ]; then
    tmp=$(mktemp -d)
    mkdir -p "$tmp/lists/partial" "$tmp/parts"
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] && sed 's/^Types: deb$/Types: deb-src/' "$f" > "$tmp/parts/$(basename "$f")"
    done
    [ -f /etc/apt/sources.list ] && sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > "$tmp/parts/main.list"
    apt_src=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$tmp/parts" -o "Dir::State::Lists=$tmp/lists")
    apt-get "${apt_src[@]}" update -qq >&2
    (cd "$tmp" && apt-get "${apt_src[@]}" source -qq cjson >/dev/null)
    $SUDO_ARM mkdir -p "$CJSON_SRC"
    $SUDO_ARM cp "$tmp"/cjson-*/cJSON.c "$tmp"/cjson-*/cJSON.h "$tmp"/cjson-*/LICENSE "$CJSON_SRC"/
    rm -rf "$tmp"
  fi
  # libcriterion3:arm64 needs libnanomsg5:arm64, whose version differs from amd64's (a rebuild of amd64
  # only), so dpkg would replace amd64's Criterion to install it. Instead the two libraries' arm64 packages
  # are unpacked into CRITERION_ARM64 (the build links and runs the aarch64 suite from there).
  CRITERION_ARM64=${CRITERION_ARM64:-/usr/local/lib/aarch64-criterion}
  if [ ! -f "$CRITERION_ARM64/libcriterion.so" ]; then
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download -qq libcriterion3:arm64 libnanomsg5:arm64 >/dev/null)
    for d in "$tmp"/*.deb; do dpkg-deb -x "$d" "$tmp/root"; done
    $SUDO_ARM mkdir -p "$CRITERION_ARM64"
    $SUDO_ARM cp -a "$tmp"/root/usr/lib/aarch64-linux-gnu/lib{criterion,nanomsg}.so.* "$CRITERION_ARM64"/
    $SUDO_ARM ln -sf libcriterion.so.3 "$CRITERION_ARM64/libcriterion.so"
    rm -rf "$tmp"
  fi
  # The suite's tests start child processes (Criterion runs each test in one, some run erinfer): the
  # kernel hands aarch64 programs to qemu once this entry (Debian qemu-user-binfmt's) is registered.
  # Kernel state, not a file: registered again after a reboot.
  BINFMT=/proc/sys/fs/binfmt_misc
  if [ ! -e "$BINFMT/qemu-aarch64" ]; then
    [ -e "$BINFMT/register" ] || $SUDO_ARM mount -t binfmt_misc binfmt_misc "$BINFMT"
    printf '%s\n' ':qemu-aarch64:M::\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64:' |
      $SUDO_ARM tee "$BINFMT/register" >/dev/null
  fi
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
