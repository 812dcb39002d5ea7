#!/usr/bin/env bash
# Memory and scale benchmark (not CI, except the SCALE_QUICK=1 smoke): dplb's resident memory with 1,
# 1,000 and 10,000 concurrent idle client connections and streaming requests, and with 300 keep-alive
# connections left idle after a 500 KB prompt each; the cost per connection, RSS after they close, and
# the bounds of docs/operations.md ("Memory") against them. Writes bench/results/scale.{md,json}. The
# method is in bench/scale.py's header.
#
#   bench/scale.sh [more options of bench/scale.py, e.g. --counts "1 5000"]
#
# Environment:
#   SCALE_BUILD_DIR   where the binaries are (default: build)
#   SCALE_QUICK=1     a seconds-long smoke: 1 and 100 connections, 100 after a 200 KB prompt
#   SCALE_CHECK=1     exit 1 when a bound is missed (--check-bounds)
# Everything listens on 127.0.0.1 on ephemeral ports; every process started is stopped by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."

args=(--build-dir "${SCALE_BUILD_DIR:-build}")
if [[ ${SCALE_QUICK:-0} == 1 ]]; then
  args+=(--counts "1 100" --itl-ms 100 --body-connections 100 --body-bytes 200000
         --results-dir "${TMPDIR:-/tmp}/dplb-scale-quick")
fi
if [[ ${SCALE_CHECK:-0} == 1 ]]; then
  args+=(--check-bounds)
fi
exec python3 bench/scale.py "${args[@]}" "$@"
