#!/usr/bin/env bash
# One command to see the point: dplb in front of 4 simulated vLLM ranks takes a burst of 256 streaming
# requests and spreads it exactly 64/64/64/64. Installs and builds what is missing first.
# Environment: DEMO_POLICY (least-inflight), DEMO_PROMPTS (256), DEMO_KEEP=1 keeps everything running
# afterwards so you can curl /metrics yourself (Ctrl-C stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh build >/dev/null 2>&1 || ./scripts/build.sh build

policy=${DEMO_POLICY:-least-inflight}
prompts=${DEMO_PROMPTS:-256}
workdir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$workdir"
}
trap cleanup EXIT INT TERM

# shellcheck source=scripts/lib.sh
source scripts/lib.sh  # the working directory is the repository root (see above)

# 4 ranks: 50 ms to first token, then a token every 10 ms, like a busy decode step.
./build/tools/mock_engine/dplb-mock-engine --host 127.0.0.1 --port 0 --ranks 4 --ttft-ms 50 --itl-ms 10 \
  >"$workdir/engine.log" 2>&1 &
pids+=($!)
await_line "$workdir/engine.log" "mock-engine ready" >/dev/null
backends=$(grep -Eo 'rank [0-9]+ listening on [0-9.]+:[0-9]+' "$workdir/engine.log" | awk '{print "http://" $5}' | paste -sd, -)

./build/dplb --listen 127.0.0.1:0 --backend "$backends" --policy "$policy" --threads 2 >"$workdir/dplb.log" 2>&1 &
pids+=($!)
address=$(await_line "$workdir/dplb.log" 'listening on [0-9.]+:[0-9]+' | awk '{print $3}')
echo "dplb is listening on http://$address (policy $policy) in front of 4 mock vLLM ranks: $backends"
echo

./build/tools/bench/dplb-bench --base-url "http://$address" --model mock-model --num-prompts "$prompts" --request-rate inf \
  --random-input-len 64 --random-output-len 32 --ignore-eos
echo
echo "dplb's own view (http://$address/metrics):"
curl -s "http://$address/metrics" | grep -E '^dplb_(requests_total|rank_inflight|inflight_skew|completion_tokens_total)'
if [[ "${DEMO_KEEP:-0}" == 1 ]]; then
  echo
  echo "Still running: try 'curl -s http://$address/metrics' or point 'vllm bench serve --base-url http://$address' at it. Ctrl-C stops."
  wait
fi
