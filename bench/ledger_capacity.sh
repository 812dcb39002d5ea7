#!/usr/bin/env bash
# The shared ledger's capacity (not CI, except the LEDGER_CAPACITY_QUICK=1 smoke): how many picks, releases and
# tenant bucket takes a second one Redis serves, the library of src/ledger/ledger_functions.cpp as built, called
# as dplb calls it, measured with redis-benchmark against a redis-server of the script's own (127.0.0.1, a free
# ephemeral port, no persistence), stopped by its pid at the end. bench/ledger_capacity.py's header has the method;
# docs/scaling.md the results. Writes bench/results/ledger_capacity.{md,json}. About 2 minutes.
#
#   bench/ledger_capacity.sh [options of bench/ledger_capacity.py, e.g. --repeats 3 --modes "1x1 4x16" --seconds 5]
#
# Environment:
#   LEDGER_CAPACITY_QUICK=1   a seconds-long smoke: every operation and mode once, runs of a fraction of a second,
#                             results in $TMPDIR/dplb-ledger-capacity-quick; exits non-zero if a call failed or did
#                             not do its work (a pick not recorded or not exact, a release that freed nothing)
# Needs redis-server, redis-cli and redis-benchmark (Debian redis-server, redis-tools), Redis 7 or later.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in redis-server redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "ledger_capacity: $tool not found (apt-get install redis-server)" >&2; exit 2; }
done
args=()
if [[ ${LEDGER_CAPACITY_QUICK:-0} == 1 ]]; then
  args+=(--repeats 1 --seconds 0.2 --probe-requests 200 --results-dir "${TMPDIR:-/tmp}/dplb-ledger-capacity-quick")
fi
exec python3 bench/ledger_capacity.py "${args[@]}" "$@"
