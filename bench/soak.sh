#!/usr/bin/env bash
# Soak test (not CI): dplb in front of 4 mock vLLM ranks takes REQUESTS requests (default 1,000,000), a
# mix of streaming and non-streaming /v1/completions, while clients hang up on purpose, ranks reset
# streams or refuse requests, and one rank at a time is killed and restarted. Checks at the end:
# no unexpected client-visible error, every dplb_rank_inflight 0, dplb's accounting equal to what was
# sent, no request left running in the engines, dplb's RSS flat after the warm-up, and a clean drain
# (SIGTERM: exit 0). Exit status 0 when everything passed.
#
# SOAK_TENANTS=1: tenants and queueing. dplb gets a config file with three tenants (alpha: a key, weight 3;
# beta: a key given as its SHA-256, weight 1, max_queued 1000; gamma: named by the X-Tenant header, weight 2,
# requests_per_second SOAK_GAMMA_RPS burst 20, so that it is rate-limited) and --max-inflight-per-rank
# SOAK_MAX_INFLIGHT (2: with 48 connections, most requests wait in dplb's queue). The client sends each request
# as alpha, beta, gamma or default (neither key nor header), with a random body priority (-1, 0, 1 or 2), and
# abandons 1% of them a few milliseconds after sending if nothing has come back (most still queued). gamma's
# 429s (with Retry-After) are expected, and must come; any other tenant's 429 fails. It checks besides that
# dplb_queue_depth and every dplb_tenant_queued and dplb_tenant_in_flight are 0 at the end, and that
# dplb_tenant_requests_total counted every request once under the tenant it was sent as.
#
#   bench/soak.sh [REQUESTS]
#
# Environment:
#   SOAK_BUILD_DIR        where the binaries are (default: build)
#   SOAK_DPLB_THREADS     dplb worker threads (2)
#   SOAK_MOCK_THREADS     mock engine threads (1)
#   SOAK_CONCURRENCY      client connections (48)
#   SOAK_TTFT_MS, SOAK_ITL_MS   mock latencies (1, 1)
#   SOAK_DPLB_ARGS        more dplb options (default: --ejection-base-ms 500 --ejection-max-ms 5000)
#   SOAK_CLIENT_ARGS      more options for bench/soak_client.py (see its --help), e.g.
#                         "--fault-ranks 0,1,2,3" to fault every rank (by default only ranks 0 and 1 are
#                         faulted, so that capacity always remains and any 502/503 is dplb's failure)
#   SOAK_KEEP_LOGS=1      keep the log directory even when the soak passed
#   SOAK_TENANTS=1        the tenants and queueing mode above; with it SOAK_MAX_INFLIGHT (2) and
#                         SOAK_GAMMA_RPS (100, gamma's requests_per_second)
# Everything listens on 127.0.0.1, on ephemeral ports; every process started here is stopped by pid.
set -euo pipefail
cd "$(dirname "$0")/.."

requests=${1:-1000000}
build=${SOAK_BUILD_DIR:-build}
dplb_bin=$build/dplb
mock_bin=$build/tools/mock_engine/dplb-mock-engine
for bin in "$dplb_bin" "$mock_bin"; do
  [[ -x $bin ]] || { echo "soak: $bin not found; build first (./scripts/build.sh $build)" >&2; exit 2; }
done

workdir=$(mktemp -d "${TMPDIR:-/tmp}/dplb-soak.XXXXXX")
mock_pid=
dplb_pid=
client_pid=
status=1
# shellcheck source=scripts/lib.sh
source scripts/lib.sh  # the working directory is the repository root (see above)

# shellcheck disable=SC2317  # invoked by the trap
cleanup() {
  stop_pids "$client_pid" "$dplb_pid" "$mock_pid"
  finish_workdir "$workdir" "$status" "${SOAK_KEEP_LOGS:-0}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$mock_bin" --host 127.0.0.1 --port 0 --ranks 4 --threads "${SOAK_MOCK_THREADS:-1}" \
  --ttft-ms "${SOAK_TTFT_MS:-1}" --itl-ms "${SOAK_ITL_MS:-1}" --admin-port 0 >"$workdir/mock.log" 2>&1 &
mock_pid=$!
await_line "$workdir/mock.log" "mock-engine ready" >/dev/null
backends=$(grep -Eo 'rank [0-9]+ listening on [0-9.]+:[0-9]+' "$workdir/mock.log" | awk '{print "http://" $5}' | paste -sd, -)
admin=$(grep -Eo 'admin listening on [0-9.]+:[0-9]+' "$workdir/mock.log" | awk '{print $4}')

# Tenants and queueing (SOAK_TENANTS=1): the config file, dplb's options and the client's.
tenant_dplb_args=()
tenant_client_args=()
if [[ ${SOAK_TENANTS:-0} == 1 ]]; then
  beta_digest=$(printf %s sk-soak-beta | sha256sum | awk '{print $1}')
  cat >"$workdir/tenants.json" <<EOF
{"tenants": [
  {"name": "alpha", "api_keys": ["sk-soak-alpha"], "weight": 3},
  {"name": "beta", "api_key_sha256": ["$beta_digest"], "weight": 1, "max_queued": 1000},
  {"name": "gamma", "weight": 2, "requests_per_second": ${SOAK_GAMMA_RPS:-100}, "burst": 20}
]}
EOF
  tenant_dplb_args=(--config "$workdir/tenants.json" --tenant-header X-Tenant
                    --max-inflight-per-rank "${SOAK_MAX_INFLIGHT:-2}" --max-queued-requests 10000)
  tenant_client_args=(--tenants "alpha=key:sk-soak-alpha,beta=key:sk-soak-beta,gamma=header:gamma,default=none"
                      --tenant-header X-Tenant --rate-limited gamma --priorities=-1,0,1,2
                      --queued-disconnect-fraction 0.01)
fi

# Info level: the listening line, and one line per ejection, truncation or failed request (counted below).
# Ejections are shortened (default: 5 s doubling to 300 s) so that the faulted ranks keep coming back and
# the faults keep meeting traffic; everything else is dplb's default.
# shellcheck disable=SC2086  # SOAK_DPLB_ARGS is a list of options
"$dplb_bin" --listen 127.0.0.1:0 --backend "$backends" --threads "${SOAK_DPLB_THREADS:-2}" \
  --log-level info ${SOAK_DPLB_ARGS---ejection-base-ms 500 --ejection-max-ms 5000} \
  ${tenant_dplb_args[@]+"${tenant_dplb_args[@]}"} >"$workdir/dplb.log" 2>&1 &
dplb_pid=$!
address=$(await_line "$workdir/dplb.log" 'listening on [0-9.]+:[0-9]+' | awk '{print $3}')
echo "soak: dplb (pid $dplb_pid) on $address; mock engine (pid $mock_pid) ranks $backends, admin $admin; logs in $workdir"

started=$(date +%s)
client_status=0
# In the background so that a signal to this script is handled (trap) at once, not after the client.
# shellcheck disable=SC2086  # SOAK_CLIENT_ARGS is a list of options
python3 bench/soak_client.py --dplb "$address" --admin "$admin" --ranks 4 --dplb-pid "$dplb_pid" \
  --requests "$requests" --concurrency "${SOAK_CONCURRENCY:-48}" --json-out "$workdir/result.json" \
  ${tenant_client_args[@]+"${tenant_client_args[@]}"} ${SOAK_CLIENT_ARGS:-} &
client_pid=$!
wait "$client_pid" || client_status=$?
client_pid=

# A graceful drain: SIGTERM, dplb must exit 0 on its own (nothing is in flight any more).
drain_status=0
if kill -0 "$dplb_pid" 2>/dev/null; then
  kill -TERM "$dplb_pid"
  for _ in $(seq 1 200); do kill -0 "$dplb_pid" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$dplb_pid" 2>/dev/null; then
    echo "soak: dplb did not exit within 10 s of SIGTERM" >&2
    drain_status=1
  else
    dplb_exit=0
    wait "$dplb_pid" || dplb_exit=$?
    dplb_pid=
    echo "soak: dplb exited with status $dplb_exit after SIGTERM"
    [[ $dplb_exit == 0 ]] || drain_status=1
  fi
else
  echo "soak: dplb is not running any more" >&2
  drain_status=1
fi

echo "soak: dplb log lines by kind (warnings and errors):"
grep -E ' (warning|warn|error|critical) ' "$workdir/dplb.log" |
  sed -E 's/^[^ ]+ //; s/[0-9]+/N/g; s/\(http[^)]*\)/(URL)/g' | cut -c1-140 | sort | uniq -c | sort -rn | head -20 || true
echo "soak: total wall time $(( $(date +%s) - started )) s"

if [[ $client_status == 0 && $drain_status == 0 ]]; then
  status=0
  echo "soak: PASS"
else
  echo "soak: FAIL (client checks: $client_status, drain: $drain_status)" >&2
fi
exit "$status"
