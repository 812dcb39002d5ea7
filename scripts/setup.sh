#!/usr/bin/env bash
# Installs everything dplb needs to build and test, from Debian 12 packages only.
# Idempotent; run as root. Set DPLB_SETUP_BENCH=1 to also install the benchmark peers, DPLB_SETUP_FUZZ=1
# the fuzzing toolchain (scripts/fuzz.sh), DPLB_SETUP_PROFILE=1 the profilers of bench/profile.sh.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libboost1.81-dev libboost-program-options1.81-dev libboost-url1.81-dev
  nlohmann-json3-dev libspdlog-dev libfmt-dev prometheus-cpp-dev catch2
  curl python3
)
if [[ "${DPLB_SETUP_BENCH:-0}" == 1 ]]; then
  packages+=(haproxy nginx-light wrk gnuplot-nox)
fi
if [[ "${DPLB_SETUP_PROFILE:-0}" == 1 ]]; then
  # valgrind for callgrind (instructions per request), strace for system calls per request.
  packages+=(valgrind strace)
fi
if [[ "${DPLB_SETUP_FUZZ:-0}" == 1 ]]; then
  # clang 14 with libFuzzer and the sanitizer runtimes (libclang-rt), llvm for llvm-symbolizer.
  packages+=(clang libclang-rt-14-dev llvm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing packages: ${missing[*]}; run this script as root (it uses apt-get)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
