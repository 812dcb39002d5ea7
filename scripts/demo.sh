#!/usr/bin/env bash
# One command to see the point: dplb in front of 4 simulated vLLM ranks takes a burst of 256 streaming
# requests and spreads it exactly 64/64/64/64. Installs only what the demo needs (scripts/setup.sh demo)
# and builds only dplb, the mock engine and the bench client, into a build directory of its own
# (build-demo: optimised, no debug information, no tests), so that a fresh machine gets there in
# minutes; scripts/test.sh installs and builds the rest. Each step says what it does, then how long it took.
# Environment: DEMO_POLICY (least-inflight), DEMO_PROMPTS (256), DEMO_BUILD_DIR (build-demo),
# DPLB_BUILD_JOBS (2), DEMO_PREBUILT=1 runs the binaries already in DEMO_BUILD_DIR without configuring or
# building it (CI: the plain build's, which its unity builds stand in for), DEMO_KEEP=1 keeps everything running afterwards so you can curl /metrics yourself
# (Ctrl-C stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh  # the working directory is the repository root (see above)

policy=${DEMO_POLICY:-least-inflight}
prompts=${DEMO_PROMPTS:-256}
build_dir=${DEMO_BUILD_DIR:-build-demo}
workdir=$(mktemp -d)
pids=()
cleanup() {
  stop_pids "${pids[@]}"
  rm -rf "$workdir"
}
trap cleanup EXIT INT TERM

if [[ ${DEMO_PREBUILT:-0} != 1 ]]; then
  step_begin "Installing the Debian packages that building and running the demo need (scripts/setup.sh demo)"
  ./scripts/setup.sh demo
  step_end

  # The demo's own build, for a cold build in minutes (docs/benchmarks.md §8): -O2 without debug information,
  # and dplb_core as a unity build (DPLB_UNITY_BUILD: its sources compiled 8 to a translation unit, so that
  # the Asio and Beast templates they share are compiled once per group rather than once per file). The
  # tests' builds (scripts/build.sh) keep RelWithDebInfo and one translation unit per file.
  step_begin "Configuring $build_dir (CMake: Release at -O2, dplb_core as a unity build, no tests)"
  log=$build_dir/demo-build.log
  mkdir -p "$build_dir"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
    -DDPLB_UNITY_BUILD=ON -DDPLB_BUILD_TESTS=OFF >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
  step_end

  step_begin "Building dplb, dplb-mock-engine and dplb-bench (about 3 min the first time on 2 cores, seconds after; log: $log)"
  # Two jobs at most: each Beast translation unit needs ~1 GB and a core.
  cmake --build "$build_dir" -j "${DPLB_BUILD_JOBS:-2}" --target dplb dplb-mock-engine dplb-bench >>"$log" 2>&1 ||
    { tail -n 60 "$log" >&2; echo "demo: the build failed; the whole log is $log" >&2; exit 1; }
  step_end
fi

step_begin "Starting 4 simulated vLLM ranks (dplb-mock-engine: 50 ms to the first token, then a token every 10 ms)"
"$build_dir"/tools/mock_engine/dplb-mock-engine --host 127.0.0.1 --port 0 --ranks 4 --ttft-ms 50 --itl-ms 10 \
  >"$workdir/engine.log" 2>&1 &
pids+=($!)
await_line "$workdir/engine.log" "mock-engine ready" >/dev/null
backends=$(grep -Eo 'rank [0-9]+ listening on [0-9.]+:[0-9]+' "$workdir/engine.log" | awk '{print "http://" $5}' | paste -sd, -)
step_end

step_begin "Starting dplb in front of them (policy $policy)"
"$build_dir"/dplb --listen 127.0.0.1:0 --backend "$backends" --policy "$policy" --threads 2 >"$workdir/dplb.log" 2>&1 &
pids+=($!)
address=$(await_line "$workdir/dplb.log" 'listening on [0-9.]+:[0-9]+' | awk '{print $3}')
echo "dplb is listening on http://$address in front of 4 mock vLLM ranks: $backends"
step_end

step_begin "Firing a burst of $prompts streaming requests at once through dplb (dplb-bench, shaped like vllm bench serve)"
"$build_dir"/tools/bench/dplb-bench --base-url "http://$address" --model mock-model --num-prompts "$prompts" \
  --request-rate inf --random-input-len 64 --random-output-len 32 --ignore-eos
step_end

echo
echo "dplb's own view (http://$address/metrics):"
metrics=$(curl -s "http://$address/metrics")
grep -E '^dplb_(requests_total|rank_inflight|inflight_skew|completion_tokens_total)' <<<"$metrics"
# dplb_requests_total summed per rank: "64/64/64/64 0" (the split, then the largest minus the smallest).
read -r split spread < <(awk '/^dplb_requests_total\{/ { match($0, /rank="[0-9]+"/);
  sent[substr($0, RSTART + 6, RLENGTH - 7)] += $NF }
  END { for (r = 0; r in sent; ++r) { printf "%s%d", (r ? "/" : ""), sent[r]; if (r == 0 || sent[r] > hi) hi = sent[r];
    if (r == 0 || sent[r] < lo) lo = sent[r] } print " " hi - lo }' <<<"$metrics")
echo
echo "The burst's split over the 4 ranks, as dplb counted it: $split"
# The point of the demo: least-inflight and round-robin split a burst exactly (within one request when it
# does not divide by 4).
if [[ $policy == least-inflight || $policy == round-robin ]] && ((spread > 1)); then
  echo "demo: the split is not exact (largest minus smallest: $spread); that is a bug, please report it" >&2
  exit 1
fi
if [[ "${DEMO_KEEP:-0}" == 1 ]]; then
  echo
  echo "Still running: try 'curl -s http://$address/metrics' or point 'vllm bench serve --base-url http://$address' at it. Ctrl-C stops."
  wait
fi
