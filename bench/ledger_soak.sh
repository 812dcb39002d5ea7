#!/usr/bin/env bash
# Chaos soak of the shared ledger (--shared-state; not CI, except the LEDGER_SOAK_QUICK=1 smoke): two dplb replicas,
# a and b, share one ledger in a redis-server of their own, in front of 4 mock ranks, with tenants on (alpha and
# beta by API key, gamma by X-Tenant and rate-limited, the default tenant) and --max-inflight-per-rank, under a
# closed-loop client spreading slow requests (streaming and not) over both. Every LEDGER_SOAK_FAULT_EVERY_S
# seconds a fault, alternately: Redis SIGKILLed and restarted empty on its port; a replica (a, then b, ...)
# SIGKILLed and restarted under its --replica-name on its port. Checks: no unexpected client error (gamma's 429s
# and the requests cut or refused by a replica while it was killed are expected, counted apart); within 5 s of
# each fault the ledger's counts (read from Redis) equal the engines' requests in flight, rank by rank; at the
# end every dplb_rank_inflight 0, dplb_shared_state_up 1 and the ledger's total 0. bench/ledger_soak.py's header
# has the method; docs/benchmarks.md the figures. Exit status 0 when everything passed.
#
#   bench/ledger_soak.sh [SECONDS]      (default 300)
#
# Environment:
#   LEDGER_SOAK_BUILD_DIR       where the binaries are (default: build): dplb, tools/mock_engine/dplb-mock-engine
#   LEDGER_SOAK_FAULT_EVERY_S   seconds between faults (20)
#   LEDGER_SOAK_QUICK=1         a smoke of about 35 s: 32 s of load, one fault of each kind (at 10 and 20 s)
#   LEDGER_SOAK_KEEP_LOGS=1     keep the log directory even when the soak passed (it is kept on failure)
#   LEDGER_SOAK_ARGS            more options of bench/ledger_soak.py (see its --help), e.g. "--concurrency 32"
# Needs redis-server (Debian redis-server). Everything listens on 127.0.0.1 on ephemeral ports; every process
# started (Redis and the replicas at each restart too) is stopped by its pid, also on failure and Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${1:-300}
every=${LEDGER_SOAK_FAULT_EVERY_S:-20}
if [[ ${LEDGER_SOAK_QUICK:-0} == 1 ]]; then
  duration=${1:-32}
  every=${LEDGER_SOAK_FAULT_EVERY_S:-10}
fi
args=(--build-dir "${LEDGER_SOAK_BUILD_DIR:-build}" --duration-s "$duration" --fault-every-s "$every")
[[ ${LEDGER_SOAK_KEEP_LOGS:-0} == 1 ]] && args+=(--keep-logs)
# shellcheck disable=SC2086  # LEDGER_SOAK_ARGS is a list of options
exec python3 bench/ledger_soak.py "${args[@]}" ${LEDGER_SOAK_ARGS:-}
