#!/usr/bin/env bash
# Tokens benchmark (not CI, except the TOKENS_QUICK=1 smoke): least-tokens against least-inflight on mixed
# long/short workloads (10% long prompts or long outputs, from dplb-bench --long-share), 4 simulated ranks
# (lockstep, or --engines independent), one closed-loop client (--request-rate R: open loop, Poisson). Per workload and policy, fresh engines and
# dplb: the engines' max-min over the ranks of outstanding tokens (prompt not yet prefilled + tokens still to
# generate), of running+waiting and of KV-cache tokens held (sampled every 50 ms from their /metrics: mean
# and p95), their output-token throughput (simulated, exact), and the client's TTFT mean and p99 (and the short
# and the long requests' apart, mean and p90), as ratios to least-inflight.
# Writes bench/results/tokens.{md,json}. The method is in bench/tokens.py's header.
#
#   bench/tokens.sh [more options of bench/tokens.py, e.g. --workloads prompts --repeats 3]
#
# Environment:
#   TOKENS_BUILD_DIR   where the binaries are (default: build)
#   TOKENS_QUICK=1     a seconds-long smoke: one small run per workload and policy
# Everything listens on 127.0.0.1 on ephemeral ports; every process started is stopped by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."

args=(--build-dir "${TOKENS_BUILD_DIR:-build}")
if [[ ${TOKENS_QUICK:-0} == 1 ]]; then
  args+=(--concurrency 48 --num-prompts 96 --max-num-seqs 16 --repeats 1 --time-scale 10
         --results-dir "${TMPDIR:-/tmp}/dplb-tokens-quick")
fi
exec python3 bench/tokens.py "${args[@]}" "$@"
