#!/usr/bin/env bash
# Configures and builds dplb, its tools and tests into BUILD_DIR (default: build); with TARGETs, only
# those (and what they depend on).
# Usage: scripts/build.sh [BUILD_DIR [TARGET...]]
# Environment: DPLB_SANITIZE ("address,undefined" or "thread") builds with sanitizers;
# CMAKE_BUILD_TYPE (default RelWithDebInfo); DPLB_BUILD_JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
targets=("${@:2}")
cmake -S . -B "$build_dir" -G Ninja \
  -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" \
  -DDPLB_SANITIZE="${DPLB_SANITIZE:-}" -DDPLB_WERROR=ON >/dev/null
# Two jobs at most: each Beast translation unit needs ~1 GB and a core.
cmake --build "$build_dir" -j "${DPLB_BUILD_JOBS:-2}" ${targets[@]:+--target "${targets[@]}"}
