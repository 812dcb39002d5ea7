#!/usr/bin/env bash
# Tenants benchmark (not CI, except the TENANTS_QUICK=1 smoke): dplb's fair queue against FIFO on 4 simulated
# ranks (mock --simulate, each rank on its own clock) behind dplb --max-inflight-per-rank 16 (the engines'
# --max-num-seqs: dplb queues, the engines never do). First the capacity of the setup for each tenant's request
# shape (requests/s answered with the queue never empty): the flood's (64 prompt / 8 output tokens, +-50%) and the
# interactive tenant's (4,000 / 16). Then the issue's scenario: a flooding tenant at 5x its capacity (Poisson, at
# most 5 x the 64 slots in flight, so dplb's queue holds a steady backlog of 256) and an interactive tenant at 10%
# of its capacity (streaming, its TTFT measured), three runs of 120 s: the interactive tenant alone, with the flood
# under dplb's fair queue (tenants configured, equal weights), and with the flood under FIFO (the same dplb flags,
# no tenants). Bar: the interactive TTFT p99 under the fair queue within 1.5x of its solo run; FIFO's figure beside
# it (it must be at least 3x solo, else the flood did not load the queue and the comparison tests nothing). Then
# weights: two tenants flooding, weights 3 and 1, a minute: the requests answered 200 to each, from dplb's
# dplb_tenant_requests_total, must be 3:1 within 10%. Exit status 1 when a bar fails. ~9 min. Writes
# bench/results/tenants.{md,json}. The method, and why these shapes, are in bench/tenants.py's header.
#
#   bench/tenants.sh [more options of bench/tenants.py, e.g. --parts "fairness" --duration 120 --capacity 400]
#
# Environment:
#   TENANTS_BUILD_DIR   where the binaries are (default: build)
#   TENANTS_QUICK=1     a smoke of under a minute (CI): 6-8 s runs, results in $TMPDIR. The bars are the full
#                       run's except the fair / solo p99 bar, 2.0 instead of 1.5: 8 s of the interactive tenant
#                       are ~20-30 requests, whose p99 is their slowest (1.3x when measured). Two of them
#                       prefilling on one rank make ~2x, which the queue's spreading of long prompts
#                       (--long-prompt-tokens) prevents: with --long-prompt-tokens 0 two smokes gave 2.12x and
#                       2.10x (docs/benchmarks.md section 10); FIFO (8x and more) fails it by far
# Everything listens on 127.0.0.1 on ephemeral ports; every process started is stopped by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."

args=(--build-dir "${TENANTS_BUILD_DIR:-build}")
if [[ ${TENANTS_QUICK:-0} == 1 ]]; then
  args+=(--capacity-warmup 1 --capacity-seconds 2.5 --duration 8 --weights-duration 6 --warmup-timeout 10
         --max-fair-ratio 2.0 --results-dir "${TMPDIR:-/tmp}/dplb-tenants-quick")
fi
exec python3 bench/tenants.py "${args[@]}" "$@"
