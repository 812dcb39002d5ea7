#!/usr/bin/env bash
# Prefix benchmark (not CI, except the PREFIX_QUICK=1 smoke): dplb's prefix-aware policy against round-robin,
# least-inflight and least-load, and the mock's oracle balancing, on 4 simulated DP engines behind one port
# with KV and prefix caches (mock --dp 4 --simulate --prefill-us-per-token 120 --kv-blocks 1024). Workloads:
# "groups" (16 shared 1,500-word prefixes, Poisson arrivals at each of several rates, a run per rate),
# "chat" (multi-turn sessions that send their history back), "unrelated" and "pressure" (caches under pressure:
# precise prefix routing from the engines' KV-cache events, "prefix-aware-events", against the approximate
# index, with one dplb and with two replicas splitting the client's requests). Per workload, rate and policy, fresh engines and
# dplb: output tok/s and TTFT p50/p90 (simulated), the engines' prefix-cache hit rate, ratios to
# least-inflight and the share of the oracle's throughput. Rows this build lacks (prefix-aware in dplb,
# --dp-balance in the mock) are skipped. Writes bench/results/prefix.{md,json}. The method is in
# bench/prefix.py's header.
#
#   bench/prefix.sh [more options of bench/prefix.py, e.g. --workloads groups --rates "16 32" --repeats 3]
#
# Environment:
#   PREFIX_BUILD_DIR   where the binaries are (default: build)
#   PREFIX_QUICK=1     a seconds-long smoke: one small run per workload and policy, results in $TMPDIR
# Everything listens on 127.0.0.1 on ephemeral ports; every process started is stopped by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."

args=(--build-dir "${PREFIX_BUILD_DIR:-build}")
if [[ ${PREFIX_QUICK:-0} == 1 ]]; then
  args+=(--rates 16 --num-prompts 48 --prefix-len 300 --chat-sessions 8 --chat-turns 3 --chat-concurrency 8
         --chat-prefix-len 200 --output-len 16 --unrelated-len 300 --unrelated-concurrency 16 --repeats 1 --time-scale 20
         --pressure-rates 40 --pressure-num-prompts 160 --pressure-groups 16 --pressure-prefix-len 300
         --pressure-kv-blocks 256 --pressure-time-scale 20
         --results-dir "${TMPDIR:-/tmp}/dplb-prefix-quick")
fi
exec python3 bench/prefix.py "${args[@]}" "$@"
