#!/usr/bin/env bash
# Service benchmark (not CI, except the SERVICE_QUICK=1 smoke): 1, 2 or 3 dplb replicas in front of the same 4
# lockstep ranks, as pods behind a Kubernetes Service, each counting alone or all sharing one ledger in a Redis of
# their own (--shared-state); bursts split over the replicas (fixed and random splits), a steady closed loop, the
# ledger's pick latency, the latency it adds to a request and the requests per second per replica with and without
# it. Writes bench/results/service.{md,json}. bench/service.py's header has the method; docs/scaling.md the results.
#
#   bench/service.sh [more options of bench/service.py, e.g. --repeats 3 --random-splits 20 --setups "1 2 2+shared"]
#
# Environment:
#   SERVICE_BUILD_DIR   where the binaries are (default: build)
#   SERVICE_QUICK=1     a seconds-long smoke: a small burst, a short steady run, one random split and short
#                       sequential and throughput runs, one run each, on 1 replica and 2 alone or sharing the
#                       ledger; exits 1 if a shared-ledger burst did not land exactly. Its picks may wait 100 ms
#                       for the ledger (not 20): on a loaded machine a pick that times out is made by the
#                       replica's own counts, which would fail the check for the machine's sake, not the ledger's
# Needs redis-server (Debian redis-server) for the shared-ledger setups. Everything listens on 127.0.0.1 on
# ephemeral ports; every process started (Redis too) is stopped by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."

args=(--build-dir "${SERVICE_BUILD_DIR:-build}")
if [[ ${SERVICE_QUICK:-0} == 1 ]]; then
  args+=(--setups "1 2 2+shared" --burst-splits "9:7" --concurrency 8 --waves 2 --output-len 16 --repeats 1
         --random-splits 1 --burst-size 16 --throughput-prompts 500 --sequential-prompts 200 --throughput-rounds 1
         --require-exact --ledger-timeout-ms 100
         --results-dir "${TMPDIR:-/tmp}/dplb-service-quick")
fi
exec python3 bench/service.py "${args[@]}" "$@"
