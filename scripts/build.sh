#!/usr/bin/env bash
# Configures and builds dplb, its tools and tests into BUILD_DIR (default: build); with TARGETs, only
# those (and what they depend on).
# Usage: scripts/build.sh [BUILD_DIR [TARGET...]]
# Environment: DPLB_SANITIZE ("address,undefined" or "thread") builds with sanitizers;
# CMAKE_BUILD_TYPE (default RelWithDebInfo); DPLB_BUILD_JOBS (default 2); DPLB_ASIO_OVERRIDE (ON or OFF:
# build on cmake/AsioOverride.cmake's Asio where it matches, or on Asio as installed; unset: as the build
# directory was configured, ON for a new one); DPLB_WERROR (default ON, what CI builds with: warnings are
# errors; OFF for a compiler CI does not use, whose new warnings would otherwise stop the build);
# DPLB_UNITY_BUILD (ON: dplb_core and the mock engine's pure code as unity builds, as CI's sanitizer
# builds are; unset: as the build directory was configured, OFF for a new one).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
targets=("${@:2}")
cmake -S . -B "$build_dir" -G Ninja \
  -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" \
  -DDPLB_SANITIZE="${DPLB_SANITIZE:-}" -DDPLB_WERROR="${DPLB_WERROR:-ON}" \
  ${DPLB_ASIO_OVERRIDE:+-DDPLB_ASIO_OVERRIDE="$DPLB_ASIO_OVERRIDE"} \
  ${DPLB_UNITY_BUILD:+-DDPLB_UNITY_BUILD="$DPLB_UNITY_BUILD"} >/dev/null
# Two jobs at most: each Beast translation unit needs ~1 GB and a core.
cmake --build "$build_dir" -j "${DPLB_BUILD_JOBS:-2}" ${targets[@]:+--target "${targets[@]}"}
