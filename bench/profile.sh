#!/usr/bin/env bash
# Per-request cost profile (not CI, except the PROFILE_QUICK=1 smoke): what one proxied request and one
# relayed SSE event cost each proxy, counted rather than timed, so that the figures repeat on a shared
# machine where CPU time varies by +-20%. The targets, each alone in front of the same mock vLLM rank:
#   dplb     dplb --threads 1 (PROFILE_DPLB_THREADS)
#   nginx    nginx, worker_processes 1, master_process off (bench/nginx.conf.in plus that line: the
#            process started is the one that proxies, so it is the one traced)
#   haproxy  HAProxy, nbthread 1, foreground -db (bench/haproxy.cfg.in); the streaming load uses the
#            `option http-no-delay` variant, as bench/overhead.sh does (without it HAProxy holds events back)
# and the tools:
#   callgrind  the proxy runs under `valgrind --tool=callgrind`: user-space instructions (Ir) per
#              request and per event; the callgrind.out files are kept for callgrind_annotate
#   strace     the proxy runs natively and `strace -f -c` attaches for the measured phase: system calls
#              per request and per event, in all and by name (with the failed ones, e.g. EAGAIN)
# Each (tool, target, load) gets a fresh proxy. bench/profile_client.py opens the connections and sends a
# warm-up; only then are the counters zeroed (callgrind_control -z) or strace attached, the measured load
# is sent, and the counters are dumped (callgrind_control -d) or strace detached before the connections
# close. The loads:
#   requests  N POSTs /v1/completions (max_tokens 1, bench/overhead.lua's body) over K keep-alive
#             connections, each sending its next request when its answer is in
#   streams   M concurrent SSE streams of T tokens (mock --itl-ms), one per connection; events relayed =
#             M * (T + 2) (the tokens, the usage event, [DONE]); the figure per event carries the M
#             requests' own cost spread over the events (about 1/T of a request each)
# After each measured phase the same counters run for a few idle seconds: the background (timers, health
# checks) per second, which the report scales to the measured phase and requires to stay under 2% of it.
# Prints a table; writes profile.tsv, syscalls.tsv and profile.json into a results directory. Exit status
# 0 when every request succeeded, every stream relayed every event and the background stayed under 2%.
#
#   bench/profile.sh
#
# Environment:
#   PROFILE_BUILD_DIR      where the binaries are (default: build)
#   PROFILE_TARGETS        "dplb nginx haproxy"
#   PROFILE_TOOLS          "callgrind strace"
#   PROFILE_QUICK=1        a seconds-long smoke: few requests, short streams (the 2% check only warns)
#   PROFILE_REQUESTS       measured requests N (20000; quick 300)
#   PROFILE_CONNECTIONS    keep-alive connections K (16)
#   PROFILE_DPLB_THREADS   dplb's --threads (1); 4 shows the locks threads share (callgrind_annotate the
#                          kept callgrind.out for pthread_mutex_lock and its callers)
#   PROFILE_WARMUP         warm-up requests (1000; quick 100)
#   PROFILE_STREAMS        concurrent streams M (32; quick 4)
#   PROFILE_TOKENS         tokens per stream T (200; quick 20)
#   PROFILE_ITL_MS         mock inter-token latency, ms (10)
#   PROFILE_IDLE_S         idle seconds measured after each load for the background check (2; quick 0.5)
#   PROFILE_RESULTS_DIR    where results go (default: bench/results); each run writes a directory
#                          profile-<time>[-quick] there and points the link latest-profile[-quick] at it
#   PROFILE_KEEP_LOGS=1    keep the temporary directory with the logs and rendered configs
# Needs valgrind (callgrind), strace, haproxy, nginx, curl, python3 (DPLB_SETUP_BENCH=1 DPLB_SETUP_PROFILE=1
# scripts/setup.sh). Everything listens on 127.0.0.1 (free ports picked at start); every process started
# here is stopped by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."

# ---------------------------------------------------------------------------------------------- settings
build=${PROFILE_BUILD_DIR:-build}
quick=${PROFILE_QUICK:-0}
if [[ $quick == 1 ]]; then
  requests=${PROFILE_REQUESTS:-300}
  warmup=${PROFILE_WARMUP:-100} streams=${PROFILE_STREAMS:-4} tokens=${PROFILE_TOKENS:-20}
  idle_s=${PROFILE_IDLE_S:-0.5}
else
  # 900-2,200 requests/s under callgrind or strace here: 8-25 s per target and tool.
  requests=${PROFILE_REQUESTS:-20000}
  warmup=${PROFILE_WARMUP:-1000} streams=${PROFILE_STREAMS:-32} tokens=${PROFILE_TOKENS:-200}
  idle_s=${PROFILE_IDLE_S:-2}
fi
connections=${PROFILE_CONNECTIONS:-16}
itl_ms=${PROFILE_ITL_MS:-10}
dplb_threads=${PROFILE_DPLB_THREADS:-1}
read -r -a targets <<<"${PROFILE_TARGETS-dplb nginx haproxy}"
read -r -a tools <<<"${PROFILE_TOOLS-callgrind strace}"
results_root=${PROFILE_RESULTS_DIR:-bench/results}
# Bounds: a proxy under valgrind takes seconds to start; a measured phase, however slow, ends within this.
start_timeout_s=60
phase_timeout_s=600

log() { echo "profile: $*" >&2; }
die() { log "$*"; exit 2; }

dplb_bin=$build/dplb
mock_bin=$build/tools/mock_engine/dplb-mock-engine
[[ -x $mock_bin ]] || die "$mock_bin not found; build first (scripts/build.sh $build dplb dplb-mock-engine)"
((${#targets[@]} > 0)) || die "PROFILE_TARGETS is empty"
((${#tools[@]} > 0)) || die "PROFILE_TOOLS is empty"
needed=(curl python3)
for target in "${targets[@]}"; do
  case $target in
    dplb) [[ -x $dplb_bin ]] || die "$dplb_bin not found; build first (scripts/build.sh $build dplb dplb-mock-engine)" ;;
    nginx | haproxy) needed+=("$target") ;;
    *) die "unknown target '$target' (known: dplb nginx haproxy)" ;;
  esac
done
for tool in "${tools[@]}"; do
  case $tool in
    callgrind) needed+=(valgrind callgrind_control) ;;
    strace) needed+=(strace) ;;
    *) die "unknown tool '$tool' (known: callgrind strace)" ;;
  esac
done
for cmd in "${needed[@]}"; do
  command -v "$cmd" >/dev/null ||
    die "$cmd not installed (DPLB_SETUP_BENCH=1 DPLB_SETUP_PROFILE=1 scripts/setup.sh, as root)"
done

suffix=
if [[ $quick == 1 ]]; then suffix=-quick; fi
results=$results_root/profile-$(date +%Y%m%d-%H%M%S)$suffix
mkdir -p "$results/raw" "$results/callgrind"
workdir=$(mktemp -d "${TMPDIR:-/tmp}/dplb-profile.XXXXXX")

# ----------------------------------------------------------------------------------- process bookkeeping
mock_pid=
mock_port=
target_pid=    # the proxy (under valgrind: valgrind, which is the proxy's process)
target_port=
client_pid=
strace_pid=
status=1
# shellcheck source=scripts/lib.sh
source scripts/lib.sh  # the working directory is the repository root (see above)

# SIGTERM, then SIGKILL if it has not exited within 15 s (a proxy under valgrind writes its last dump
# first); reaps it. Empty arguments and processes already gone are skipped.
stop_bounded() {
  local p
  for p in "$@"; do
    if [[ -z $p ]] || ! kill -0 "$p" 2>/dev/null; then continue; fi
    kill "$p" 2>/dev/null || true
    for _ in $(seq 1 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
}

# shellcheck disable=SC2317  # invoked by the trap
cleanup() {
  # strace first: it detaches from the proxy before the proxy is stopped.
  stop_bounded "$strace_pid" "$client_pid" "$target_pid" "$mock_pid"
  finish_workdir "$workdir" "$status" "${PROFILE_KEEP_LOGS:-0}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free TCP port on 127.0.0.1 (nginx and HAProxy cannot listen on port 0).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

now() { echo "$EPOCHREALTIME"; }

# Waits (bounded) until a file exists; fails at once if the watched process has exited.
await_file() {  # path timeout_s pid what
  local deadline
  deadline=$(awk -v t="$(now)" -v d="$2" 'BEGIN { printf "%.3f", t + d }')
  until [[ -e $1 ]]; do
    if ! kill -0 "$3" 2>/dev/null; then log "$4 exited before $1 appeared"; return 1; fi
    if awk -v t="$(now)" -v d="$deadline" 'BEGIN { exit !(t > d) }'; then
      log "timed out after $2 s waiting for $1 ($4)"; return 1
    fi
    sleep 0.02
  done
}

# Fills a template: @KEY@ -> value, for each KEY=value argument.
render() {
  local template=$1 out=$2 expr=() kv
  shift 2
  for kv in "$@"; do expr+=(-e "s|@${kv%%=*}@|${kv#*=}|g"); done
  sed "${expr[@]}" "$template" >"$out"
}

start_mock() {
  # As bench/overhead.sh: --ttft-ms 0 (a 1-token request is answered at once), 2 threads (never the
  # bottleneck), keep-alive longer than any proxy keeps an idle engine connection.
  "$mock_bin" --host 127.0.0.1 --port 0 --ranks 1 --threads 2 --ttft-ms 0 --itl-ms "$itl_ms" \
    --keepalive-timeout-ms 600000 >"$workdir/mock.log" 2>&1 &
  mock_pid=$!
  await_line "$workdir/mock.log" "mock-engine ready" >/dev/null
  mock_port=$(grep -Eo 'rank 0 listening on [0-9.]+:[0-9]+' "$workdir/mock.log" | awk -F: '{print $NF}')
}

# Starts one target for one run, under valgrind for callgrind, natively for strace.
start_target() {  # tool target load name
  local tool=$1 target=$2 load=$3 name=$4 cmd=() prefix=()
  target_port=$(free_port)
  case $target in
    dplb)
      # Everything else at dplb's defaults (health checks included): the configuration a user runs.
      cmd=("$dplb_bin" --listen "127.0.0.1:$target_port" --backend "http://127.0.0.1:$mock_port"
        --threads "$dplb_threads" --log-level warn) ;;
    nginx)
      mkdir -p "$workdir/$name"
      render bench/nginx.conf.in "$workdir/$name/nginx.conf" "LISTEN_PORT=$target_port" \
        "BACKEND_PORT=$mock_port" "WORKDIR=$workdir/$name"
      # One process that both accepts and proxies: the worker is the process traced.
      printf '\n# bench/profile.sh: no master, the worker loop runs in the process started.\nmaster_process off;\n' \
        >>"$workdir/$name/nginx.conf"
      cmd=(nginx -p "$workdir/$name" -c "$workdir/$name/nginx.conf") ;;
    haproxy)
      local no_delay=""
      if [[ $load == streams ]]; then no_delay="    option http-no-delay"; fi
      render bench/haproxy.cfg.in "$workdir/$name.cfg" "LISTEN_PORT=$target_port" \
        "BACKEND_PORT=$mock_port" "NO_DELAY_LINE=$no_delay"
      cmd=(haproxy -db -f "$workdir/$name.cfg") ;;
  esac
  if [[ $tool == callgrind ]]; then
    cg_out=$workdir/$name.callgrind cg_dumps=0
    prefix=(valgrind --tool=callgrind --callgrind-out-file="$cg_out")
  fi
  "${prefix[@]}" "${cmd[@]}" >"$workdir/$name.log" 2>&1 &
  target_pid=$!
  # Bounded wait for the port; fails at once if the process exited (a configuration error).
  local deadline=$((SECONDS + start_timeout_s))
  until (exec 3<>"/dev/tcp/127.0.0.1/$target_port") 2>/dev/null; do
    if ! kill -0 "$target_pid" 2>/dev/null || ((SECONDS > deadline)); then
      log "$target ($tool) does not listen on 127.0.0.1:$target_port; its log:"
      cat "$workdir/$name.log" >&2
      return 1
    fi
    sleep 0.1
  done
  # One request through it, which must answer 200: catches a proxy that cannot reach the mock.
  local code
  code=$(curl -s --noproxy '*' -o /dev/null -w '%{http_code}' --max-time 30 -X POST \
    -H 'Content-Type: application/json' -d '{"model":"mock-model","prompt":"hi","max_tokens":1}' \
    "http://127.0.0.1:$target_port/v1/completions") || true
  [[ $code == 200 ]] || { log "$target answered '$code' instead of 200; its log:"; cat "$workdir/$name.log" >&2; return 1; }
}

# ------------------------------------------------------------------------------------ counting windows
# callgrind: counters zeroed at the start, dumped at the end (dump k of a process goes to <out-file>.k).
# strace: attached at the start (returns once every thread of the proxy is traced), detached at the end
# (SIGTERM: strace detaches and writes its -c summary).
cg_out=      # callgrind's --callgrind-out-file for the target running
cg_dumps=0   # dumps taken from it so far
begin_count() {  # tool
  case $1 in
    callgrind) callgrind_control -z "$target_pid" >>"$workdir/callgrind_control.log" 2>&1 ||
      { log "callgrind_control -z $target_pid failed:"; cat "$workdir/callgrind_control.log" >&2; return 1; } ;;
    strace)
      strace -f -c -o "$workdir/strace.out" -p "$target_pid" 2>>"$workdir/strace.log" &
      strace_pid=$!
      local task tracer untraced
      for _ in $(seq 1 500); do
        untraced=0
        for task in /proc/"$target_pid"/task/*; do
          tracer=$(awk '/^TracerPid:/ { print $2 }' "$task/status" 2>/dev/null || echo 0)
          [[ $tracer == "$strace_pid" ]] || untraced=1
        done
        ((untraced == 0)) && return 0
        kill -0 "$strace_pid" 2>/dev/null || break
        sleep 0.02
      done
      log "strace did not attach to $target_pid (ptrace not allowed?):"; cat "$workdir/strace.log" >&2
      return 1 ;;
  esac
}

end_count() {  # tool dest
  case $1 in
    callgrind)
      callgrind_control -d "$target_pid" >>"$workdir/callgrind_control.log" 2>&1 ||
        { log "callgrind_control -d $target_pid failed:"; cat "$workdir/callgrind_control.log" >&2; return 1; }
      cg_dumps=$((cg_dumps + 1))
      local dump=$cg_out.$cg_dumps
      if ! grep -q '^totals:' "$dump" 2>/dev/null; then log "no callgrind dump $dump"; return 1; fi
      mv "$dump" "$2" ;;
    strace)
      kill -TERM "$strace_pid" 2>/dev/null || true
      for _ in $(seq 1 150); do kill -0 "$strace_pid" 2>/dev/null || break; sleep 0.1; done
      stop_bounded "$strace_pid"
      strace_pid=
      # An empty summary is a window without a single system call (an idle nginx).
      [[ -e $workdir/strace.out ]] || { log "strace wrote no summary:"; cat "$workdir/strace.log" >&2; return 1; }
      mv "$workdir/strace.out" "$2" ;;
  esac
}

# ------------------------------------------------------------------------------------------- one run
run_one() {  # tool target load
  local tool=$1 target=$2 load=$3 name=$2-$3-$1 sync client_args=() t0 t1 rc=0 data idle
  start_target "$tool" "$target" "$load" "$name"
  sync=$workdir/sync-$name
  mkdir -p "$sync"
  if [[ $load == requests ]]; then
    client_args=(requests --connections "$connections" --requests "$requests" --warmup "$warmup")
  else
    client_args=(streams --streams "$streams" --tokens "$tokens")
  fi
  python3 bench/profile_client.py "${client_args[@]}" --port "$target_port" --sync-dir "$sync" \
    --sync-timeout-s "$phase_timeout_s" --timeout-s 120 --result "$results/raw/client-$name.json" \
    >"$workdir/client-$name.log" 2>&1 &
  client_pid=$!
  await_file "$sync/ready" "$phase_timeout_s" "$client_pid" "the client (warm-up)" ||
    { cat "$workdir/client-$name.log" >&2; return 1; }
  begin_count "$tool"
  t0=$(now)
  touch "$sync/go"
  await_file "$sync/done" "$phase_timeout_s" "$client_pid" "the client (measured phase)" ||
    { cat "$workdir/client-$name.log" >&2; return 1; }
  t1=$(now)
  if [[ $tool == callgrind ]]; then
    data=$results/callgrind/$name.out idle=$results/callgrind/$name-idle.out
  else
    data=$results/raw/$name.txt idle=$results/raw/$name-idle.txt
  fi
  end_count "$tool" "$data"
  touch "$sync/close"
  wait "$client_pid" || rc=$?
  client_pid=
  ((rc == 0)) || { log "the client failed against $target ($tool, $load):"; cat "$workdir/client-$name.log" >&2; }
  # The background: the same counters over idle_s seconds with every connection closed.
  begin_count "$tool"
  sleep "$idle_s"
  end_count "$tool" "$idle"
  stop_bounded "$target_pid"
  target_pid=
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$tool" "$target" "$load" \
    "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f", b - a }')" "$idle_s" "client-$name.json" \
    "${data#"$results"/}" "${idle#"$results"/}" >>"$results/raw/runs.tsv"
  log "  $tool $target $load: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s measured, client exit $rc"
}

# --------------------------------------------------------------------------------------------------- main
started=$(date +%s)
start_mock
log "mock engine on $mock_port (pid $mock_pid); results in $results; logs in $workdir"
printf 'tool\ttarget\tload\twindow_s\tidle_s\tclient_json\tdata\tidle_data\n' >"$results/raw/runs.tsv"
cat >"$results/raw/settings.tsv" <<EOF
key	value
targets	${targets[*]}
tools	${tools[*]}
requests	$requests
connections	$connections
warmup	$warmup
streams	$streams
tokens	$tokens
itl_ms	$itl_ms
idle_s	$idle_s
quick	$quick
cpus	$(nproc)
valgrind	$(if command -v valgrind >/dev/null; then valgrind --version; else echo -; fi)
strace	$(if command -v strace >/dev/null; then strace -V | head -1; else echo -; fi)
date	$(date -Is)
EOF

for tool in "${tools[@]}"; do
  for target in "${targets[@]}"; do
    for load in requests streams; do run_one "$tool" "$target" "$load"; done
  done
done

report_status=0
python3 bench/profile_report.py "$results" || report_status=$?
ln -sfn "$(basename "$results")" "$results_root/latest-profile$suffix"
if [[ " ${tools[*]} " == *" callgrind "* ]]; then
  log "callgrind files: $results/callgrind/ (e.g. callgrind_annotate --inclusive=yes $results/callgrind/dplb-requests-callgrind.out)"
fi
log "total wall time $(($(date +%s) - started)) s; results in $results (link: $results_root/latest-profile$suffix)"
if [[ $report_status == 0 ]]; then status=0; fi
exit "$report_status"
