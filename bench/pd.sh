#!/usr/bin/env bash
# P/D benchmark (not CI, except the PD_QUICK=1 smoke): prefill/decode disaggregation against co-located engines at
# equal engine count, on the simulator (mock --simulate --dp-lockstep). Part 1, a prefill-heavy mixed streaming
# workload (long prompts, mixed output lengths, Poisson): 4 prefill + 4 decode ranks behind dplb in P/D mode
# (--prefill/--decode) against 8 co-located ranks (--kv-role both) behind dplb --policy least-inflight; ITL p99
# and TTFT p90 side by side, and their ratios. Part 2, a 256-request burst on the decode pool through dplb P/D:
# the split over the 4 decode ranks (least-inflight must give 64/64/64/64) and the decode engines' padded/real
# tokens, against the same burst with --policy engine-stats (the baseline). Part 3, multi-turn chat on the same
# 4 + 4 ranks (each turn's prompt the conversation's history, as token ids): dplb --pd-skip-prefill-ratio 0 against
# 0.5 (a turn whose decode rank holds half its blocks runs there in one leg, no prefill leg), decode --policy
# prefix-aware, and least-inflight with no skip; TTFT of the later turns, ITL, prefill legs run and skipped. Rows
# need dplb's P/D mode (--prefill in dplb --help): without it only the co-located row runs, with a note. Writes
# bench/results/pd.{md,json}.
# The method is in bench/pd.py's header.
#
#   bench/pd.sh [more options of bench/pd.py, e.g. --rate 20 --repeats 3 --parts mixed]
#
# Environment:
#   PD_BUILD_DIR   where the binaries are (default: build)
#   PD_QUICK=1     a seconds-long smoke (CI): few requests, a 64-request burst, 8 short conversations, one run each,
#                  results in $TMPDIR; it too fails when least-inflight splits the burst unevenly, a P/D run leaves
#                  blocks held, or the chat part skips no prefill with R > 0 (or skips one with R = 0)
# Everything listens on 127.0.0.1 on ephemeral ports; every process started is stopped by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."

args=(--build-dir "${PD_BUILD_DIR:-build}")
if [[ ${PD_QUICK:-0} == 1 ]]; then
  args+=(--num-prompts 40 --input-len 500 --long-input-len 1500 --output-len 48 --long-output-len 8 --rate 40
         --time-scale 10 --burst 64 --burst-output-len 32 --conversations 8 --turns 3 --chat-prefix-len 256
         --user-min 32 --user-max 64 --chat-output-len 16 --chat-start-spread-ms 200 --repeats 1
         --results-dir "${TMPDIR:-/tmp}/dplb-pd-quick")
fi
exec python3 bench/pd.py "${args[@]}" "$@"
