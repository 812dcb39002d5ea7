#!/usr/bin/env bash
# Turns the results of one bench/overhead.sh run into PNGs, written next to the results:
#   overhead-rps.png          req/s vs client connections, one line per target (part 1)
#   overhead-cpu-per-req.png  proxy CPU microseconds per request vs connections, per proxy (part 1)
#   overhead-stream-cpu.png   proxy CPU seconds per million relayed SSE events, per proxy and N (part 2)
# and, when bench/imbalance.sh has run (its imbalance.tsv in IMBALANCE_DIR, default bench/results):
#   imbalance-bursts.png      output-token throughput of each policy relative to the balanced run, per burst
# and, when bench/prefix.sh has run (its prefix.json in PREFIX_DIR, default bench/results):
#   prefix-groups.png         the shared-prefix workload: output tok/s and TTFT p90 against the arrival rate
#
#   bench/plot.sh [RESULTS_DIR]     (default: bench/results/latest, the last full overhead run)
#
# Needs gnuplot (pngcairo terminal when built with cairo, else the libgd png terminal).
set -euo pipefail
cd "$(dirname "$0")/.."

results=${1:-bench/results/latest}
imbalance_dir=${IMBALANCE_DIR:-bench/results}
prefix_dir=${PREFIX_DIR:-bench/results}
have_overhead=1
for f in wrk.tsv stream.tsv; do
  [[ -f $results/$f ]] || have_overhead=0
done
if [[ $have_overhead == 0 && ! -f $imbalance_dir/imbalance.tsv && ! -f $prefix_dir/prefix.json ]]; then
  echo "plot: no results found; run bench/overhead.sh, bench/imbalance.sh or bench/prefix.sh first" >&2
  exit 2
fi
command -v gnuplot >/dev/null || { echo "plot: gnuplot not installed" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dplb-plot.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# pngcairo draws anti-aliased lines; Debian's gnuplot-nox has it, but fall back to png rather than fail.
if gnuplot -e 'set terminal' 2>&1 | grep -qw pngcairo; then
  terminal="pngcairo size 1000,600 font ',11'"
else
  terminal="png size 1000,600"
fi

# One colour per target in every plot (gnuplot's default cycles by position, and direct is missing
# from the CPU plots).
declare -A colour=([direct]='#444444' [dplb1]='#d62728' [dplb1_log]='#e377c2' [dplb2]='#ff9896' [haproxy]='#1f77b4'
                   [haproxy_nd]='#9ecae1' [nginx]='#2ca02c')
colour_of() { echo "${colour[$1]:-#7f7f7f}"; }

# Column number of a header name in a TSV file.
column_of() { head -1 "$1" | tr '\t' '\n' | grep -nx "$2" | cut -d: -f1; }

# One data file per target (connections, value), in the targets' order of appearance: gnuplot joins the
# points of one file with a line.
split_by_target() {  # tsv value-column -> prints the target names; writes $tmp/<column>-<target>.dat
  local tsv=$1 col target_col x_col
  col=$(column_of "$tsv" "$2") target_col=$(column_of "$tsv" target) x_col=$(column_of "$tsv" connections)
  awk -F'\t' -v c="$col" -v t="$target_col" -v x="$x_col" -v out="$tmp/$2-" '
    NR > 1 && $c != "NA" { print $x "\t" $c > (out $t ".dat"); if (!seen[$t]++) order[++n] = $t }
    END { for (i = 1; i <= n; i++) print order[i] }' "$tsv"
}

# Lines over connections (log scale): one `plot` clause per target file.
plot_lines() {  # column title ylabel output
  local targets clauses="" t
  mapfile -t targets < <(split_by_target "$results/wrk.tsv" "$1")
  for t in "${targets[@]}"; do
    clauses+="${clauses:+, }'$tmp/$1-$t.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '$(colour_of "$t")' title '$t'"
  done
  gnuplot <<GNUPLOT
set terminal $terminal noenhanced
set output '$results/$4'
set title '$2'
set xlabel 'client connections (wrk -t1)'
set ylabel '$3'
set logscale x 2
set grid
set key outside right
set yrange [0:*]
plot $clauses
GNUPLOT
}

# Clustered bars from a matrix file whose first row names the series: one group per row, one bar per series.
plot_bars() {  # output title xlabel ylabel yrange plot-clauses
  gnuplot <<GNUPLOT
set terminal $terminal noenhanced
set output '$1'
set title '$2'
set xlabel '$3'
set ylabel '$4'
set datafile separator '\t'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set grid ytics
set key outside right
set yrange [$5]
plot $6
GNUPLOT
}

# Clustered bars: one group per N, one bar per proxy (direct has no proxy CPU).
plot_stream_cpu() {
  local tsv=$results/stream.tsv matrix=$tmp/stream-cpu.dat clauses="" i t
  awk -F'\t' -v c="$(column_of "$tsv" cpu_s_per_mevents)" -v t="$(column_of "$tsv" target)" \
      -v s="$(column_of "$tsv" streams)" '
    NR > 1 && $c != "NA" {
      if (!(s_seen[$s]++)) ns[++n] = $s
      if (!(t_seen[$t]++)) ts[++m] = $t
      v[$s, $t] = $c
    }
    END {
      printf "N"; for (j = 1; j <= m; j++) printf "\t%s", ts[j]; print ""
      for (i = 1; i <= n; i++) {
        printf "%s", ns[i]; for (j = 1; j <= m; j++) printf "\t%s", ((ns[i], ts[j]) in v) ? v[ns[i], ts[j]] : "NaN"; print ""
      }
    }' "$tsv" >"$matrix"
  # One clause per proxy column, each in its target's colour; `every ::1` skips the header row.
  i=1
  for t in $(head -1 "$matrix" | cut -f2-); do
    i=$((i + 1))
    clauses+="${clauses:+, }'$matrix' every ::1 using $i:xtic(1) lc rgb '$(colour_of "$t")' title '$t'"
  done
  plot_bars "$results/overhead-stream-cpu.png" 'Proxy CPU per million relayed SSE events (lower is better)' \
    'concurrent streams N' 'CPU seconds / million events' '0:*' "$clauses"
}

# Clustered bars: one group per burst size, one bar per policy: throughput / the balanced run's.
plot_imbalance() {
  local tsv=$imbalance_dir/imbalance.tsv matrix=$tmp/imbalance.dat clauses="" i t
  awk -F'\t' 'NR > 1 && $1 == "burst" {
      if (!(l_seen[$2]++)) ls[++n] = $2
      if (!(p_seen[$3]++)) ps[++m] = $3
      v[$2, $3] = $4
    }
    END {
      printf "N"; for (j = 1; j <= m; j++) printf "\t%s", ps[j]; print ""
      for (i = 1; i <= n; i++) { printf "%s", ls[i]; for (j = 1; j <= m; j++) printf "\t%s", v[ls[i], ps[j]]; print "" }
    }' "$tsv" >"$matrix"
  declare -A policy_colour=([least-inflight]='#d62728' [round-robin]='#ff9896' [least-load]='#ff7f0e'
                            [least-tokens]='#ffbb78' [random]='#7f7f7f' [engine-stats]='#1f77b4')
  i=1
  for t in $(head -1 "$matrix" | cut -f2-); do
    i=$((i + 1))
    clauses+="${clauses:+, }'$matrix' every ::1 using $i:xtic(1) lc rgb '${policy_colour[$t]:-#444444}' title '$t'"
  done
  plot_bars "$imbalance_dir/imbalance-bursts.png" \
    'Output-token throughput of 4 lockstep ranks, relative to the balanced run (median of runs)' \
    'burst size (requests at once)' 'throughput / balanced' '0.85:1.01' "$clauses"
  echo "plot: wrote imbalance-bursts.png in $imbalance_dir"
}

# Two panels over the arrival rate, one line per policy (medians over runs): output tok/s, and TTFT p90 on a
# log scale. The medians come out of prefix.json with python3, which the benchmarks need anyway.
plot_prefix() {
  local clauses_tput="" clauses_ttft="" p
  python3 - "$prefix_dir/prefix.json" "$tmp" <<'PY'
import json, statistics, sys
runs = [r for r in json.load(open(sys.argv[1]))["runs"] if r["workload"] == "groups" and r["rate"] != "inf"]
policies = list(dict.fromkeys(r["policy"] for r in runs))
with open(f"{sys.argv[2]}/prefix-policies", "w") as names:
    names.write("\n".join(policies) + "\n")
for p in policies:
    with open(f"{sys.argv[2]}/prefix-{p}.dat", "w") as out:
        for rate in sorted({float(r["rate"]) for r in runs if r["policy"] == p}):
            cell = [r for r in runs if r["policy"] == p and float(r["rate"]) == rate]
            out.write(f"{rate:g}\t{statistics.median(r['output_tok_s'] for r in cell)}\t"
                      f"{statistics.median(r['ttft_p90_s'] for r in cell)}\n")
PY
  declare -A policy_colour=([least-inflight]='#d62728' [round-robin]='#ff9896' [least-load]='#ff7f0e'
                            [prefix-aware]='#2ca02c' [oracle]='#444444')
  while read -r p; do
    clauses_tput+="${clauses_tput:+, }'$tmp/prefix-$p.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '${policy_colour[$p]:-#7f7f7f}' title '$p'"
    clauses_ttft+="${clauses_ttft:+, }'$tmp/prefix-$p.dat' using 1:3 with linespoints lw 2 pt 7 lc rgb '${policy_colour[$p]:-#7f7f7f}' title '$p'"
  done <"$tmp/prefix-policies"
  gnuplot <<GNUPLOT
set terminal $terminal noenhanced
set output '$prefix_dir/prefix-groups.png'
set multiplot layout 1,2 title '16 groups of shared 1,500-word prefixes, 4 simulated engines with prefix caching'
set xlabel 'arrival rate (requests per simulated s)'
set grid
set key top left
set ylabel 'output tokens / s'
set yrange [0:*]
plot $clauses_tput
set ylabel 'TTFT p90 (s, log scale; lower is better)'
set logscale y
set yrange [*:*]
plot $clauses_ttft
unset multiplot
GNUPLOT
  echo "plot: wrote prefix-groups.png in $prefix_dir"
}

if [[ $have_overhead == 1 ]]; then
  plot_lines rps 'Requests per second, POST /v1/completions (max_tokens 1), median of rounds' 'requests / s' \
    overhead-rps.png
  plot_lines proxy_cpu_us_per_req 'Proxy CPU per request (lower is better)' 'CPU microseconds / request' \
    overhead-cpu-per-req.png
  plot_stream_cpu
  echo "plot: wrote overhead-rps.png, overhead-cpu-per-req.png and overhead-stream-cpu.png in $results"
fi
[[ -f $imbalance_dir/imbalance.tsv ]] && plot_imbalance
[[ -f $prefix_dir/prefix.json ]] && plot_prefix
true
