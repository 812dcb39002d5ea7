#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh: the Debian packages of the build, of the tests and of their real
# clients, and the npm packages), builds everything, and runs every test with CTest.
# Usage: scripts/test.sh [BUILD_DIR]   (DPLB_SANITIZE=address,undefined scripts/test.sh build-asan)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
./scripts/setup.sh
./scripts/build.sh "$build_dir"
# A sanitizer report fails the run: the processes the integration tests start inherit these.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
# Sanitizers slow dplb and the mock engine several times over: the integration tests' timing bounds
# get that much slack (tests/support/timing_slack.hpp), unless the caller chose a value.
case ${DPLB_SANITIZE:-} in
  *thread*) default_slack=8 ;;
  ?*) default_slack=4 ;;
  *) default_slack=1 ;;
esac
export DPLB_TEST_TIMING_SLACK=${DPLB_TEST_TIMING_SLACK:-$default_slack}
# Integration tests start processes on ephemeral loopback ports; two at a time keeps timing honest
# on a 2-core machine.
ctest --test-dir "$build_dir" --output-on-failure -j "${DPLB_TEST_JOBS:-2}" --timeout 300
