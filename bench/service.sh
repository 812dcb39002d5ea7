#!/usr/bin/env bash
# Service benchmark (not CI, except the SERVICE_QUICK=1 smoke): 1 or 2 dplb replicas in front of the same 4 lockstep
# ranks, as pods behind a Kubernetes Service; a burst split over the replicas and a steady closed loop. Writes
# bench/results/service.{md,json}. bench/service.py's header has the method; docs/scaling.md the results.
#
#   bench/service.sh [more options of bench/service.py, e.g. --repeats 3 --burst-splits "128:128 136:120"]
#
# Environment:
#   SERVICE_BUILD_DIR   where the binaries are (default: build)
#   SERVICE_QUICK=1     a seconds-long smoke: a small burst, a short steady run, one run each
# Everything listens on 127.0.0.1 on ephemeral ports; every process started is stopped by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."

args=(--build-dir "${SERVICE_BUILD_DIR:-build}")
if [[ ${SERVICE_QUICK:-0} == 1 ]]; then
  args+=(--burst-splits "9:7" --concurrency 8 --waves 2 --output-len 16 --repeats 1
         --results-dir "${TMPDIR:-/tmp}/dplb-service-quick")
fi
exec python3 bench/service.py "${args[@]}" "$@"
