#!/usr/bin/env bash
# Replicas benchmark (not CI, except the REPLICAS_QUICK=1 smoke): two dplb replicas in front of the same 4
# lockstep ranks, each fed by its own closed-loop client; replica A fronts ranks 0-1 only (a team's share, or
# clients that bypass dplb), replica B all 4. Per policy (least-inflight, least-load), fresh engines and
# replicas: the engines' own imbalance (max-min of running+waiting over the ranks, sampled every 50 ms from
# their /metrics: mean and p95), their output-token throughput in the steady window (simulated, exact), and
# each client's throughput and TTFT, as ratios least-load / least-inflight. Writes
# bench/results/replicas.{md,json}. The method and the expected split are in bench/replicas.py's header.
#
#   bench/replicas.sh [more options of bench/replicas.py, e.g. --repeats 3 --concurrency-a 64]
#
# Environment:
#   REPLICAS_BUILD_DIR   where the binaries are (default: build)
#   REPLICAS_QUICK=1     a seconds-long smoke: small clients, one run per policy
# Everything listens on 127.0.0.1 on ephemeral ports; every process started is stopped by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."

args=(--build-dir "${REPLICAS_BUILD_DIR:-build}")
if [[ ${REPLICAS_QUICK:-0} == 1 ]]; then
  args+=(--concurrency-a 24 --concurrency-b 32 --max-num-seqs 16 --output-len 32 --waves 4 --repeats 1
         --time-scale 5 --results-dir "${TMPDIR:-/tmp}/dplb-replicas-quick")
fi
exec python3 bench/replicas.py "${args[@]}" "$@"
