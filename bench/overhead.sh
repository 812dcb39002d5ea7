#!/usr/bin/env bash
# Proxy overhead benchmark (not CI, except the OVERHEAD_QUICK=1 smoke): one mock vLLM rank measured
#   direct      no proxy: the baseline
#   dplb1       dplb --threads 1
#   dplb1_log   the same with --access-log (a file in the work directory): the access log's cost (part 1)
#   haproxy     HAProxy, nbthread 1, as its manual advises   (bench/haproxy.cfg.in)
#   haproxy_nd  the same plus `option http-no-delay` (part 2 only; see below)
#   nginx       nginx, worker_processes 1                    (bench/nginx.conf.in)
#   dplb2       dplb --threads 2
#   dplb1_base  another dplb build, --threads 1 (only with OVERHEAD_BASELINE_DPLB): the same load on an
#               earlier commit, in the same rounds, for a paired before/after ratio
# in one invocation, ALTERNATELY: every round runs every target once per load point (the order rotated
# each round), so that a slow moment of this shared machine hits every target alike; the report gives
# the median over the rounds.
#   Part 1, non-streaming: wrk -t1 POSTs /v1/completions (max_tokens 1, answered at once) over C
#     keep-alive connections: req/s, p50/p99 latency, the proxy's CPU per request, ratios.
#   Part 2, streaming: dplb-bench runs N concurrent SSE streams (mock --itl-ms, max_tokens tokens each):
#     the proxy's CPU seconds per million relayed events, and the TTFT/ITL it adds to the direct run.
#     HAProxy's manual says `option http-no-delay` should only be used for applications that need each
#     piece of a payload to leave at once; without it HAProxy holds SSE events back (~170-200 ms here:
#     TTFT up by that much, events arrive in bursts), so part 2 measures HAProxy both ways and
#     compares dplb's CPU with haproxy_nd, the configuration that streams like the others.
# Prints a table; writes TSV + JSON into a results directory for bench/plot.sh. Exit status 0 when every
# request of every run succeeded (the performance targets are reported, not enforced).
#
#   bench/overhead.sh
#
# Environment:
#   OVERHEAD_BUILD_DIR     where the binaries are (default: build)
#   OVERHEAD_QUICK=1       a seconds-long smoke: 1 round, 1 s per wrk run, fewer points, short streams
#   OVERHEAD_ROUNDS        rounds over the targets (3; quick 1)
#   OVERHEAD_DURATION      seconds per wrk run (3; quick 1)
#   OVERHEAD_CONNECTIONS   wrk connection counts ("1 16 64 256"; quick "1 64")
#   OVERHEAD_STREAMS       concurrent streams ("64 256"; quick "32")
#   OVERHEAD_ITL_MS        mock inter-token latency, ms (10)
#   OVERHEAD_OUTPUT_LEN    tokens per stream (200; quick 50)
#   OVERHEAD_STREAM_WAVES  streams per run = waves * N, at most N at once (1)
#   OVERHEAD_INPUT_LEN     prompt words per stream (64)
#   OVERHEAD_PROBES        1-token streams sent at a steady rate during each streaming run to measure
#                          the TTFT a request sees under load (20; 0 = none; see run_stream)
#   OVERHEAD_MOCK_THREADS  mock engine threads (2: one per core, so that it is not the bottleneck)
#   OVERHEAD_WRK_TARGETS   targets of part 1 ("direct dplb1 dplb1_log haproxy nginx dplb2")
#   OVERHEAD_STREAM_TARGETS  targets of part 2 ("direct dplb1 haproxy haproxy_nd nginx dplb2")
#                          (either may be empty to skip that part)
#   OVERHEAD_BASELINE_DPLB the dplb binary of an earlier build (e.g. a worktree of the commit before a change,
#                          built with scripts/build.sh): adds dplb1_base to both parts, and the report
#                          gives dplb1 / dplb1_base
#   OVERHEAD_RESULTS_DIR   where results go (default: bench/results); each run writes a directory
#                          overhead-<time>[-quick] there and points the link latest[-quick] at it
#   OVERHEAD_KEEP_LOGS=1   keep the temporary directory with the logs and rendered configs
# Needs wrk, haproxy, nginx, curl, python3. Everything listens on 127.0.0.1 (free ports picked at start);
# every process started here is stopped by its pid. Nothing is pinned to a CPU: each target gets the
# same scheduler, as it would in a deployment, and pinning 3 busy processes onto 2 cores would measure
# the pinning.
set -euo pipefail
cd "$(dirname "$0")/.."

# ---------------------------------------------------------------------------------------------- settings
build=${OVERHEAD_BUILD_DIR:-build}
quick=${OVERHEAD_QUICK:-0}
if [[ $quick == 1 ]]; then
  rounds=${OVERHEAD_ROUNDS:-1} duration=${OVERHEAD_DURATION:-1}
  connections=${OVERHEAD_CONNECTIONS:-"1 64"} streams=${OVERHEAD_STREAMS:-32}
  output_len=${OVERHEAD_OUTPUT_LEN:-50}
else
  rounds=${OVERHEAD_ROUNDS:-3} duration=${OVERHEAD_DURATION:-3}
  connections=${OVERHEAD_CONNECTIONS:-"1 16 64 256"} streams=${OVERHEAD_STREAMS:-"64 256"}
  output_len=${OVERHEAD_OUTPUT_LEN:-200}
fi
itl_ms=${OVERHEAD_ITL_MS:-10}
waves=${OVERHEAD_STREAM_WAVES:-1}
input_len=${OVERHEAD_INPUT_LEN:-64}
probes=${OVERHEAD_PROBES:-20}
mock_threads=${OVERHEAD_MOCK_THREADS:-2}
read -r -a wrk_targets <<<"${OVERHEAD_WRK_TARGETS-direct dplb1 dplb1_log haproxy nginx dplb2}"
read -r -a stream_targets <<<"${OVERHEAD_STREAM_TARGETS-direct dplb1 haproxy haproxy_nd nginx dplb2}"
# Every target started (once, for the whole run): the union of both lists, in order.
baseline_bin=${OVERHEAD_BASELINE_DPLB:-}
if [[ -n $baseline_bin ]]; then
  [[ -x $baseline_bin ]] || { echo "overhead: OVERHEAD_BASELINE_DPLB=$baseline_bin is not an executable" >&2; exit 2; }
  wrk_targets+=(dplb1_base)
  stream_targets+=(dplb1_base)
fi
mapfile -t targets < <(printf '%s\n' "${wrk_targets[@]}" "${stream_targets[@]}" | awk 'NF && !seen[$0]++')
results_root=${OVERHEAD_RESULTS_DIR:-bench/results}

dplb_bin=$build/dplb
mock_bin=$build/tools/mock_engine/dplb-mock-engine
bench_bin=$build/tools/bench/dplb-bench
for bin in "$dplb_bin" "$mock_bin" "$bench_bin"; do
  [[ -x $bin ]] || { echo "overhead: $bin not found; build first (./scripts/build.sh $build)" >&2; exit 2; }
done
for tool in wrk haproxy nginx curl python3; do
  command -v "$tool" >/dev/null || { echo "overhead: $tool not installed (./scripts/setup.sh?)" >&2; exit 2; }
done

suffix=
if [[ $quick == 1 ]]; then suffix=-quick; fi
results=$results_root/overhead-$(date +%Y%m%d-%H%M%S)$suffix
mkdir -p "$results/raw"
workdir=$(mktemp -d "${TMPDIR:-/tmp}/dplb-overhead.XXXXXX")

# ----------------------------------------------------------------------------------- process bookkeeping
declare -A port=()   # target -> port it listens on
declare -A pid=()    # target -> pid of the process this script started (nginx: the master)
mock_pid=
stream_pid=
status=1
# shellcheck source=scripts/lib.sh
source scripts/lib.sh  # the working directory is the repository root (see above)

# shellcheck disable=SC2317  # invoked by the trap
cleanup() {
  stop_pids "$stream_pid" "${pid[@]}" "$mock_pid"
  finish_workdir "$workdir" "$status" "${OVERHEAD_KEEP_LOGS:-0}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "overhead: $*" >&2; }

# A free TCP port on 127.0.0.1. nginx and HAProxy cannot listen on port 0 and dplb at --log-level warn
# does not log the port it got, so every proxy is given one picked here (the kernel does not hand the
# same ephemeral port out again at once).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits (bounded: 10 s) until the target accepts connections on its port; fails at once if the process
# has exited (a configuration error), showing its log.
await_target() {
  local target=$1
  for _ in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/${port[$target]}") 2>/dev/null; then return 0; fi
    if [[ $target != direct ]] && ! kill -0 "${pid[$target]}" 2>/dev/null; then break; fi
    sleep 0.05
  done
  log "$target does not listen on 127.0.0.1:${port[$target]}; its log:"
  cat "$workdir/$target.log" >&2 || true
  return 1
}

# Fills a template: @KEY@ -> value, for each KEY=value argument.
render() {
  local template=$1 out=$2 expr=() kv
  shift 2
  for kv in "$@"; do expr+=(-e "s|@${kv%%=*}@|${kv#*=}|g"); done
  sed "${expr[@]}" "$template" >"$out"
}

# The pids whose CPU time counts for a target, one per line: the process, plus its children (nginx's
# worker).
target_pids() {
  local p=${pid[$1]}
  echo "$p"
  cat "/proc/$p/task/"*/children 2>/dev/null | tr ' ' '\n' | grep . || true
}

# CPU seconds (user + system) used so far by the given pids and all their threads. Read from
# /proc/PID/task/*/schedstat (nanoseconds on CPU per thread): the same kernel counter that the utime +
# stime of /proc/PID/stat are scaled to, without the 10 ms tick rounding that would blur a run costing
# 0.1 s. Every process measured here keeps its threads for its whole life, so no exited thread is lost.
cpu_seconds() {
  local p f total=0 ns _
  for p in "$@"; do
    for f in /proc/"$p"/task/*/schedstat; do
      read -r ns _ <"$f" 2>/dev/null || continue
      total=$((total + ns))
    done
  done
  awk -v ns="$total" 'BEGIN { printf "%.6f", ns / 1e9 }'
}

# -------------------------------------------------------------------------------------------- start-up
start_mock() {
  # --ttft-ms 0: a non-streaming request of max_tokens 1 is answered at once (part 1) and a stream's
  # first token leaves at once (part 2), so TTFT measures the path, not a sleep. Keep-alive 10 min:
  # longer than any proxy keeps an idle upstream connection, so no proxy meets the keep-alive race.
  "$mock_bin" --host 127.0.0.1 --port 0 --ranks 1 --threads "$mock_threads" --ttft-ms 0 \
    --itl-ms "$itl_ms" --keepalive-timeout-ms 600000 >"$workdir/mock.log" 2>&1 &
  mock_pid=$!
  await_line "$workdir/mock.log" "mock-engine ready" >/dev/null
  port[direct]=$(grep -Eo 'rank 0 listening on [0-9.]+:[0-9]+' "$workdir/mock.log" | awk -F: '{print $NF}')
}

start_dplb() {  # target threads [more options]   (DPLB_BIN: another binary)
  port[$1]=$(free_port)
  # Everything else at dplb's defaults (health checks included): the configuration a user runs.
  "${DPLB_BIN:-$dplb_bin}" --listen "127.0.0.1:${port[$1]}" --backend "http://127.0.0.1:${port[direct]}" \
    --threads "$2" --log-level warn "${@:3}" >"$workdir/$1.log" 2>&1 &
  pid[$1]=$!
}

start_haproxy() {  # target no-delay(0|1)
  port[$1]=$(free_port)
  local no_delay=""
  if [[ $2 == 1 ]]; then no_delay="    option http-no-delay"; fi
  render bench/haproxy.cfg.in "$workdir/$1.cfg" "LISTEN_PORT=${port[$1]}" \
    "BACKEND_PORT=${port[direct]}" "NO_DELAY_LINE=$no_delay"
  haproxy -db -f "$workdir/$1.cfg" >"$workdir/$1.log" 2>&1 &
  pid[$1]=$!
}

start_nginx() {
  port[nginx]=$(free_port)
  render bench/nginx.conf.in "$workdir/nginx.conf" "LISTEN_PORT=${port[nginx]}" \
    "BACKEND_PORT=${port[direct]}" "WORKDIR=$workdir"
  nginx -p "$workdir" -c "$workdir/nginx.conf" >"$workdir/nginx.log" 2>&1 &
  pid[nginx]=$!
}

# One request through the target, which must answer 200: catches a proxy that started but cannot reach
# the mock before any number is taken.
check_target() {
  local code
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X POST -H 'Content-Type: application/json' \
    -d '{"model":"mock-model","prompt":"hi","max_tokens":1}' "http://127.0.0.1:${port[$1]}/v1/completions") || true
  [[ $code == 200 ]] || { log "$1 answered '$code' instead of 200; its log:"; cat "$workdir/$1.log" >&2; return 1; }
}

# ----------------------------------------------------------------------------------------- measurements
# The targets given after the round number, in this round's order: rotated by one each round, so that
# no target always runs first or right after the same other one.
round_order() {
  local r=$1 i
  shift
  for ((i = 0; i < $#; i++)); do echo "${@:(i + r) % $# + 1:1}"; done
}

proxy_cpu() {  # target -> CPU seconds so far of its processes ("0" for direct)
  local pids
  if [[ $1 == direct ]]; then echo 0; return; fi
  mapfile -t pids < <(target_pids "$1")
  cpu_seconds "${pids[@]}"
}

# Part 1, one run: appends a line to raw/wrk.tsv.
run_wrk() {  # round target connections
  local round=$1 target=$2 conns=$3 out=$workdir/wrk-$2-$3-$1.txt cpu0 mock0 cpu1 mock1 line
  local requests dur p50 p99 errors load
  load=$(cut -d' ' -f1 /proc/loadavg)
  cpu0=$(proxy_cpu "$target") mock0=$(cpu_seconds "$mock_pid")
  # wrk's own bound is -d; `timeout` only guards against a hung wrk. --timeout 10s: a request slower
  # than that would be a failure worth seeing, not a latency sample to drop.
  timeout $((duration + 30)) wrk -t1 -c"$conns" -d"${duration}s" --timeout 10s --latency \
    -s bench/overhead.lua "http://127.0.0.1:${port[$target]}/v1/completions" >"$out" 2>&1 ||
    { log "wrk failed against $target:"; cat "$out" >&2; return 1; }
  cpu1=$(proxy_cpu "$target") mock1=$(cpu_seconds "$mock_pid")
  line=$(grep -E '^OVERHEAD ' "$out") || { log "no summary from wrk:"; cat "$out" >&2; return 1; }
  # requests=.. duration_us=.. p50_us=.. p99_us=.. errors=..  ->  values in that order
  read -r requests dur p50 p99 errors < <(sed -E 's/[a-z0-9_]+=//g; s/^OVERHEAD //' <<<"$line")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$target" "$conns" "$requests" \
    "$(awk -v d="$dur" 'BEGIN { printf "%.6f", d / 1e6 }')" "$p50" "$p99" "$errors" \
    "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.6f", b - a }')" \
    "$(awk -v a="$mock0" -v b="$mock1" 'BEGIN { printf "%.6f", b - a }')" "$load" >>"$results/raw/wrk.tsv"
  printf '  round %d  %-10s c=%-4d %8.0f req/s  errors %d\n' "$round" "$target" "$conns" \
    "$(awk -v n="$requests" -v d="$dur" 'BEGIN { print n / (d / 1e6) }')" "$errors" >&2
}

# Part 2, one run: appends a line to raw/stream.tsv; dplb-bench's JSONs stay in raw/.
# Two dplb-bench processes at once:
#   main   waves * N streams, N at a time, all starting together (--request-rate inf): the load;
#   probe  short streams (1 token) arriving at a steady rate, started once the main burst has settled
#          and done before the main streams end: the TTFT a new request sees while N streams run.
#          The main run's TTFT is that of N requests arriving at the same instant, i.e. mostly how long
#          the proxy takes to work through a burst of N; the probe's is the latency it adds per request.
run_stream() {  # round target streams
  local round=$1 target=$2 n=$3 cpu0 mock0 cpu1 mock1 rc=0 probe_rc=0 load
  local json=$results/raw/stream-$2-$3-r$1.json probe_json=$results/raw/probe-$2-$3-r$1.json
  local url=http://127.0.0.1:${port[$target]} bound=$((waves * output_len * itl_ms / 1000 + 60))
  # The probe starts a quarter into a wave and spreads its requests over the next half of it.
  local wave_s probe_delay probe_rate
  wave_s=$(awk -v t="$output_len" -v i="$itl_ms" 'BEGIN { print t * i / 1000 }')
  probe_delay=$(awk -v w="$wave_s" 'BEGIN { print w / 4 }')
  probe_rate=$(awk -v w="$wave_s" -v p="$probes" 'BEGIN { print p / (w / 2) }')
  rm -f "$json" "$probe_json"
  load=$(cut -d' ' -f1 /proc/loadavg)
  cpu0=$(proxy_cpu "$target") mock0=$(cpu_seconds "$mock_pid")
  # --model: no GET /v1/models first. --timeout-s bounds the run (a stream lasts output_len * itl).
  "$bench_bin" --base-url "$url" --model mock-model \
    --num-prompts $((waves * n)) --request-rate inf --max-concurrency "$n" \
    --random-input-len "$input_len" --random-output-len "$output_len" --ignore-eos \
    --timeout-s "$bound" --quiet --result-json "$json" >"$workdir/stream-$target-$n-$round.txt" 2>&1 &
  stream_pid=$!
  if ((probes > 0)); then
    sleep "$probe_delay"
    "$bench_bin" --base-url "$url" --model mock-model --seed 1 \
      --num-prompts "$probes" --request-rate "$probe_rate" \
      --random-input-len "$input_len" --random-output-len 1 --ignore-eos \
      --timeout-s "$bound" --quiet --result-json "$probe_json" >"$workdir/probe-$target-$n-$round.txt" 2>&1 ||
      probe_rc=$?
  fi
  wait "$stream_pid" || rc=$?
  stream_pid=
  cpu1=$(proxy_cpu "$target") mock1=$(cpu_seconds "$mock_pid")
  [[ -s $json ]] || { log "dplb-bench wrote no result against $target:"; cat "$workdir/stream-$target-$n-$round.txt" >&2; return 1; }
  if ((probes > 0)) && [[ ! -s $probe_json ]]; then
    log "the probe wrote no result against $target:"; cat "$workdir/probe-$target-$n-$round.txt" >&2; return 1
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$target" "$n" \
    "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.6f", b - a }')" \
    "$(awk -v a="$mock0" -v b="$mock1" 'BEGIN { printf "%.6f", b - a }')" \
    "$(basename "$json")" "$( ((probes > 0)) && basename "$probe_json" || echo -)" "$load" >>"$results/raw/stream.tsv"
  printf '  round %d  %-10s N=%-4d exit %d, probe exit %d\n' "$round" "$target" "$n" "$rc" "$probe_rc" >&2
}

# --------------------------------------------------------------------------------------------------- main
started=$(date +%s)
start_mock
for target in "${targets[@]}"; do
  case $target in
    direct) ;;
    dplb1) start_dplb dplb1 1 ;;
    dplb1_log) start_dplb dplb1_log 1 --access-log "$workdir/access.log" ;;
    dplb2) start_dplb dplb2 2 ;;
    dplb1_base) DPLB_BIN=$baseline_bin start_dplb dplb1_base 1 ;;
    haproxy) start_haproxy haproxy 0 ;;
    haproxy_nd) start_haproxy haproxy_nd 1 ;;
    nginx) start_nginx ;;
    *) log "unknown target '$target'"; exit 2 ;;
  esac
done
for target in "${targets[@]}"; do
  await_target "$target"
  check_target "$target"
done
log "mock engine on ${port[direct]} (pid $mock_pid); $(for t in "${targets[@]}"; do
  [[ $t == direct ]] || printf '%s on %s (pid %s) ' "$t" "${port[$t]}" "${pid[$t]}"; done)"
log "results in $results; logs in $workdir"

# loadavg: the machine's 1-minute load average when the run started (other users' load shows there).
printf 'round\ttarget\tconnections\trequests\tduration_s\tp50_us\tp99_us\terrors\tproxy_cpu_s\tmock_cpu_s\tloadavg\n' \
  >"$results/raw/wrk.tsv"
printf 'round\ttarget\tstreams\tproxy_cpu_s\tmock_cpu_s\tresult_json\tprobe_json\tloadavg\n' >"$results/raw/stream.tsv"
cat >"$results/raw/settings.tsv" <<EOF
key	value
rounds	$rounds
duration_s	$duration
connections	$connections
streams	$streams
stream_waves	$waves
itl_ms	$itl_ms
output_len	$output_len
probes	$probes
input_len	$input_len
mock_threads	$mock_threads
wrk_targets	${wrk_targets[*]}
stream_targets	${stream_targets[*]}
quick	$quick
cpus	$(nproc)
date	$(date -Is)
EOF

# Warm-up, not recorded: first-touch page faults, lazily built tables and the first upstream
# connections happen here instead of in the first measured run. (Skipped by the smoke, whose numbers
# only show that everything runs.)
if [[ $quick != 1 ]]; then
  log "warm-up"
  for target in "${targets[@]}"; do
    timeout 30 wrk -t1 -c16 -d1s -s bench/overhead.lua "http://127.0.0.1:${port[$target]}/v1/completions" >/dev/null
  done
fi

log "part 1: wrk, $rounds round(s) x connections {$connections} x ${#wrk_targets[@]} targets x ${duration} s"
for ((round = 1; round <= rounds && ${#wrk_targets[@]} > 0; round++)); do
  for conns in $connections; do
    for target in $(round_order "$round" "${wrk_targets[@]}"); do run_wrk "$round" "$target" "$conns"; done
  done
done

log "part 2: streams, $rounds round(s) x N {$streams} x ${#stream_targets[@]} targets, $output_len tokens at $itl_ms ms"
for ((round = 1; round <= rounds && ${#stream_targets[@]} > 0; round++)); do
  for n in $streams; do
    for target in $(round_order "$round" "${stream_targets[@]}"); do run_stream "$round" "$target" "$n"; done
  done
done

report_status=0
python3 bench/overhead_report.py "$results" || report_status=$?
ln -sfn "$(basename "$results")" "$results_root/latest$suffix"
log "total wall time $(($(date +%s) - started)) s; results in $results (link: $results_root/latest$suffix)"
if [[ $report_status == 0 ]]; then status=0; fi
exit "$report_status"
