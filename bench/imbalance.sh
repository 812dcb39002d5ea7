#!/usr/bin/env bash
# Imbalance benchmark (not CI, except the IMBALANCE_QUICK=1 smoke): what each balancing policy costs
# 4 MoE data-parallel ranks that step in lockstep. For each burst size (255, 256, 257, 1024 requests,
# delivered over a few hundred ms as vllm bench serve does, all present when the engine starts;
# decode-heavy: 64 prompt tokens, 512 output tokens) and each Poisson rate, every policy in turn
# (least-inflight, round-robin, least-load, least-tokens, random, and the engine-stats baseline refreshed
# every 100 ms as vLLM's) runs against a fresh simulated engine and a fresh dplb; a policy this dplb lacks
# is skipped with a note. The engine reports the simulated GPU time the load took. Prints per-rank splits,
# output-token throughput and its ratio to the balanced run (least-inflight); writes
# bench/results/imbalance.{md,tsv,json} for docs/benchmarks.md and bench/plot.sh. Exits 1 when a request
# failed or when least-inflight or round-robin split a burst unevenly. The method is in bench/imbalance.py.
#
#   bench/imbalance.sh [more options of bench/imbalance.py, e.g. --bursts "256" --repeats 5]
#
# Environment:
#   IMBALANCE_BUILD_DIR   where the binaries are (default: build)
#   IMBALANCE_QUICK=1     a seconds-long smoke (CI): one small burst, one rate, one run each; it too fails on
#                         an uneven split by least-inflight or round-robin
# Everything listens on 127.0.0.1 on ephemeral ports; every process started is stopped by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."

args=(--build-dir "${IMBALANCE_BUILD_DIR:-build}")
if [[ ${IMBALANCE_QUICK:-0} == 1 ]]; then
  args+=(--bursts 64 --rates 20 --repeats 1 --output-len 64 --poisson-output-len 32 --poisson-prompts 40
         --results-dir "${TMPDIR:-/tmp}/dplb-imbalance-quick")
fi
exec python3 bench/imbalance.py "${args[@]}" "$@"
