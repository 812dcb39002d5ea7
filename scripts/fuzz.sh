#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) in build-fuzz and runs each for a bounded time on a
# copy of its seed corpus, so nothing in the repository is written. Fails if a target crashes; the
# input that crashed is kept under build-fuzz/fuzz-artifacts/<target>/.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 30)
# Environment: DPLB_BUILD_JOBS (default 2), DPLB_FUZZ_BUILD_DIR (default build-fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
build_dir=${DPLB_FUZZ_BUILD_DIR:-build-fuzz}
targets=(fuzz_request_head fuzz_usage_scanner fuzz_request_facts fuzz_engine_samples fuzz_kv_events fuzz_pd_bodies)

DPLB_SETUP_FUZZ=1 ./scripts/setup.sh
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DDPLB_FUZZ=ON -DDPLB_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build_dir" --target dplb_fuzzers -j "${DPLB_BUILD_JOBS:-2}"

work=$(mktemp -d "${TMPDIR:-/tmp}/dplb-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
status=0
for target in "${targets[@]}"; do
  corpus=$work/$target/corpus
  artifacts=$build_dir/fuzz-artifacts/$target
  mkdir -p "$corpus" "$artifacts"
  cp tests/fuzz/corpus/"$target"/* "$corpus"/
  case $target in
    fuzz_request_head) extra=(-dict=tests/fuzz/request_head.dict -max_len=70000) ;;  # heads beyond the 64 KiB limit
    fuzz_usage_scanner) extra=(-dict=tests/fuzz/usage_scanner.dict) ;;
    fuzz_request_facts) extra=(-dict=tests/fuzz/request_facts.dict) ;;
    fuzz_engine_samples) extra=(-dict=tests/fuzz/engine_samples.dict) ;;
    fuzz_kv_events) extra=(-dict=tests/fuzz/kv_events.dict) ;;
    fuzz_pd_bodies) extra=(-dict=tests/fuzz/request_facts.dict) ;;
  esac
  log=$work/$target/log
  start=$(date +%s)
  if "$build_dir/tests/fuzz/$target" "${extra[@]}" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "fuzz: $target ${runs:-?} runs in $(( $(date +%s) - start )) s, no crash"
  else
    echo "fuzz: $target CRASHED; end of its log (the input is in $artifacts/):" >&2
    tail -n 60 "$log" >&2
    status=1
  fi
done
exit $status
