# Shell helpers shared by the project's scripts (source it; it defines functions only).

# Waits (bounded: 10 s) for a line matching an extended regex in a log file; prints the first match.
# On time-out it says so, names the calling script, shows the log and returns 1.
await_line() {
  local file=$1 pattern=$2
  for _ in $(seq 1 200); do
    if grep -Eo "$pattern" "$file" 2>/dev/null | head -1 | grep .; then return 0; fi
    sleep 0.05
  done
  echo "$(basename "$0" .sh): timed out waiting for '$pattern' in $file:" >&2
  cat "$file" >&2
  return 1
}

# Stops the given processes by pid (those still running) and reaps them; empty arguments are skipped.
stop_pids() {
  local p
  # `|| true`: under `set -e` a failing kill (already gone) or wait (killed by the signal) must not end
  # the caller's EXIT trap with that status.
  for p in "$@"; do [[ -z $p ]] || kill "$p" 2>/dev/null || true; done
  for p in "$@"; do [[ -z $p ]] || wait "$p" 2>/dev/null || true; done
}

# Removes a script's temporary directory after a run that passed (status 0), unless asked to keep it
# (keep = 1); otherwise keeps it and says where, for the logs.
finish_workdir() {  # dir status keep
  if [[ $2 == 0 && $3 != 1 ]]; then
    rm -rf "$1"
  else
    echo "$(basename "$0" .sh): logs kept in $1" >&2
  fi
}

# A script's steps, each announced before it runs and timed after: step_begin "what it does", then the
# step's commands, then step_end (prints the seconds since step_begin).
step_begin() {
  echo "==> $1"
  step_started=${EPOCHREALTIME/[^0-9]/.}  # bash writes the locale's decimal separator
}
step_end() {
  LC_ALL=C awk -v from="$step_started" -v to="${EPOCHREALTIME/[^0-9]/.}" 'BEGIN { printf "    (%.1f s)\n", to - from }'
}
