#!/usr/bin/env python3
"""prefix-aware routing against the load-only policies and an oracle, on 4 simulated engines with prefix caching.

Run through bench/prefix.sh (it documents the knobs). For each workload, rate, policy and repeat: a fresh mock
(one process, one port, `dplb-mock-engine --ranks 1 --dp 4 --simulate`: 4 DP engines behind one URL, each on
its own clock as the DP ranks of a dense model, each with its own KV cache and prefix cache), a fresh dplb in
front of it (`--backend http://127.0.0.1:PORT#dp=4 --policy P`), and one dplb-bench client. The "oracle" row
has no dplb: the client talks to a mock started with `--dp-balance oracle --load-bound 1.25`, which sends each
request to the engine whose simulated cache holds the longest prefix of it, within the load bound; it is the
ceiling a prefix-aware router can aim at. Rows whose dplb policy or mock mode this build lacks are skipped
(dplb --help, dplb-mock-engine --help), so the script runs before and after they land.

Engines (every row): --prefill-us-per-token 120 (prefill-heavy: a cached prefix saves most of a request's cost),
--kv-blocks 1024 of 16 tokens (16,384 tokens) each, --max-num-seqs 32, --threads 1.
  Why 1024 blocks: the mock caches full blocks only, so a 1,500-word prefix is 93 cached
  blocks (94 held while a request of its group runs). The 16 groups' prefixes need 16 x 94 = 1,504 blocks: more
  than one engine has (1,024), so an engine that sees every group evicts prefixes, but a quarter of that (376,
  4 groups per engine) plus the running requests' own blocks ((100 + 64) / 16 -> 11 each, 32 x 11 = 352) fits
  in one engine: 376 + 352 = 728 < 1,024, and the four engines (4,096 blocks) hold every prefix with room.

Workloads (--workloads):
  groups  16 groups of 1,500-word prefixes (dplb-bench --prefix-groups 16 --prefix-len 1500), each request's
          own 100 words after its group's prefix, 64 output tokens (ignore_eos), completions, streaming. Open
          loop: Poisson arrivals at each of --rates (requests per simulated second), each rate its own run
          with fresh engines (so a row's cache starts cold, as the others'), --num-prompts requests per run,
          at most --max-concurrency in flight. The default rates 12, 24, 36: the load-only policies carry
          about 20 (their hit rate near 0.5, most of the 192 ms of a whole prompt's prefill paid every other
          request), a router that hits the cache about twice that, so 12 loads everyone lightly, 24 is
          past the load-only policies' capacity but not a prefix-aware one's, 36 near its limit.
  unrelated  prompts that share nothing (1,600 unique words each, 64 output tokens), closed loop with
          --unrelated-concurrency in flight: prefix-aware must place them as least-inflight does (its
          throughput within noise of least-inflight's).
  chat    multi-turn sessions (dplb-bench --sessions --turns, chat endpoint): --chat-sessions sessions of
          --chat-turns turns; each session's first user message starts with one of 8 shared 1,000-word
          system prompts (--prefix-groups 8 --prefix-len 1000), every turn adds 100 new words, answers are 64
          tokens sent back as the history; the last turn's prompt is 1,000 + 6 x 100 + 5 x 64 = 1,920
          tokens. Closed loop: --chat-concurrency sessions at a time, a session's next turn as soon as its
          answer is in. Every request carries `x-session-id: session-<i>`; prefix-aware runs here with
          --affinity-header x-session-id unless --no-affinity.

Measured per run:
  - output tok/s (simulated): the client's output tokens over its duration (first request to last answer),
    divided by --time-scale to read as the simulated engines' (under the load, this is the arrival rate; over
    it, the capacity);
  - TTFT p50 and p90 (s, simulated): dplb-bench's per-request TTFTs times --time-scale;
  - cache hit rate: sum over the engines of vllm:prefix_cache_hits_total over the sum of
    vllm:prefix_cache_queries_total (tokens), from the mock's /metrics at the end;
  - requests per engine (mock_requests_routed_total), prompt tokens prefilled, preemptions, and the mock's
    step-end lag over its steps' wall time (the scaled figures hold while it is small).
Ratios: tok/s policy / least-inflight, TTFT least-inflight / policy (above 1: the policy better), and the share
of the oracle's tok/s; medians over the repeats.

Standard library only; every process started here is stopped by its pid, also on errors and Ctrl-C.
"""

import argparse
import statistics
import subprocess
import time

from benchlib import (add_run_arguments, compared_policies, finish_bench, log, metric_by_engine, quantile, run_cells,
                      scrape, start_bench, start_dplb, start_mock)

ENGINES = 4
ORACLE = "oracle"
POLICIES = "round-robin least-inflight least-load prefix-aware"
SESSION_HEADER = "x-session-id"
ENGINE_ARGS = ["--prefill-us-per-token", "120", "--threads", "1"]


def groups_args(opts):
    return ["--prefix-groups", str(opts.groups), "--prefix-len", str(opts.prefix_len), "--random-input-len",
            str(opts.query_len), "--random-output-len", str(opts.output_len), "--num-prompts", str(opts.num_prompts),
            "--max-concurrency", str(opts.max_concurrency)]


def unrelated_args(opts):
    return ["--random-input-len", str(opts.unrelated_len), "--random-output-len", str(opts.output_len),
            "--num-prompts", str(opts.num_prompts), "--max-concurrency", str(opts.unrelated_concurrency)]


def chat_args(opts):
    return ["--backend", "openai-chat", "--sessions", str(opts.chat_sessions), "--turns", str(opts.chat_turns),
            "--session-header", SESSION_HEADER, "--prefix-groups", str(opts.chat_groups), "--prefix-len",
            str(opts.chat_prefix_len), "--random-input-len", str(opts.chat_input_len), "--random-output-len",
            str(opts.output_len), "--max-concurrency", str(opts.chat_concurrency)]


def oracle_offered(mock):
    """True when this mock has the oracle balancing mode (its --help names --dp-balance)."""
    text = subprocess.run([mock, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=30).stdout
    return "--dp-balance" in text


def engine_figures(metrics_text):
    """Per-engine counters of the mock's /metrics (one port, --dp engines): lists indexed by engine."""
    def per_engine(name):
        values = metric_by_engine(metrics_text, name)
        return [values.get(e, 0.0) for e in range(ENGINES)]
    return {"queries": per_engine("vllm:prefix_cache_queries_total"),
            "hits": per_engine("vllm:prefix_cache_hits_total"),
            "routed": per_engine("mock_requests_routed_total"),
            "prompt_tokens": per_engine("vllm:prompt_tokens_total"),
            "generated": per_engine("vllm:generation_tokens_total"),
            "busy_s": per_engine("mock_step_seconds_total"),
            "lag_s": per_engine("mock_step_lag_seconds_total"),
            "preemptions": per_engine("vllm:num_preemptions_total")}


def run_one(opts, workdir, workload, rate, policy, repeat):
    tag = f"{workload}-{rate}-{policy}-{repeat}"
    oracle = policy == ORACLE
    mock_args = (["--ranks", "1", "--dp", str(ENGINES), "--simulate", "--time-scale", str(opts.time_scale),
                  "--kv-blocks", str(opts.kv_blocks), "--max-num-seqs", str(opts.max_num_seqs)] + ENGINE_ARGS
                 + (["--dp-balance", "oracle", "--load-bound", str(opts.load_bound)] if oracle else [])
                 + opts.mock_args.split())
    mock, ports, admin = start_mock(opts.mock, mock_args, workdir / f"{tag}.mock.log")
    proxy = None
    try:
        port = ports[0]
        if not oracle:
            extra = ["--threads", "1"]
            if policy == "prefix-aware":
                extra += opts.prefix_aware_args.split()
                if workload == "chat" and opts.affinity:
                    extra += ["--affinity-header", SESSION_HEADER]
            proxy, port = start_dplb(opts.dplb, policy, ports, workdir / f"{tag}.dplb.log", extra, dp=ENGINES)
        rate_args = ["--request-rate", "inf" if rate == "inf" else str(float(rate) * opts.time_scale)]
        workload_args = {"groups": groups_args, "chat": chat_args, "unrelated": unrelated_args}[workload](opts)
        args = workload_args + rate_args + [
            "--ignore-eos", "--seed", str(opts.seed + repeat)]
        result_path = workdir / f"{tag}.json"
        started = time.monotonic()
        result = finish_bench(start_bench(opts.bench, port, args, result_path, workdir / f"{tag}.client.log"),
                              result_path)
        wall = time.monotonic() - started
        engines = engine_figures(scrape(f"http://127.0.0.1:{admin}/metrics?rank=0"))
    finally:
        if proxy:
            proxy.stop()
        mock.stop()

    ttfts = [t * opts.time_scale for t in result["ttfts"] if t is not None]
    queries = sum(engines["queries"])
    # The mock must keep up for the scaled figures to hold: its step ends' wall lag against the wall time the
    # engines' steps take (mock_step_seconds_total is simulated).
    busy_wall = sum(engines["busy_s"]) / opts.time_scale
    return {
        "workload": workload, "rate": rate, "policy": policy, "repeat": repeat, "wall_s": wall,
        "output_tok_s": result["output_throughput"] / opts.time_scale,
        "ttft_p50_s": quantile(ttfts, 0.5) if ttfts else None,
        "ttft_p90_s": quantile(ttfts, 0.9) if ttfts else None,
        "hit_rate": sum(engines["hits"]) / queries if queries else 0.0,
        "duration_s": result["duration"] * opts.time_scale,
        "lag_share": sum(engines["lag_s"]) / busy_wall if busy_wall else 0.0,
        "completed": result["completed"], "failed": result["failed"],
        **engines,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--policies", default=POLICIES + " " + ORACLE,
                        help="dplb policies, and 'oracle' (the mock's own balancing); those this build lacks are "
                        "skipped")
    parser.add_argument("--workloads", default="groups chat unrelated", help="among: groups chat unrelated")
    parser.add_argument("--rates", default="12 24 36",
                        help="groups: requests per simulated second, one run each ('inf': all at once)")
    parser.add_argument("--num-prompts", type=int, default=480, help="groups: requests per run")
    parser.add_argument("--max-concurrency", type=int, default=512, help="groups: the client's cap in flight")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--prefix-len", type=int, default=1500, help="groups: words of each group's prefix")
    parser.add_argument("--query-len", type=int, default=100, help="groups: each request's own words")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--unrelated-len", type=int, default=1600, help="unrelated: words of each prompt")
    parser.add_argument("--unrelated-concurrency", type=int, default=64,
                        help="unrelated: requests in flight (closed loop)")
    parser.add_argument("--chat-sessions", type=int, default=96)
    parser.add_argument("--chat-turns", type=int, default=6)
    parser.add_argument("--chat-concurrency", type=int, default=32, help="chat: sessions at a time")
    parser.add_argument("--chat-groups", type=int, default=8, help="chat: shared system prompts")
    parser.add_argument("--chat-prefix-len", type=int, default=1000, help="chat: words of each system prompt")
    parser.add_argument("--chat-input-len", type=int, default=100, help="chat: new words per turn")
    parser.add_argument("--kv-blocks", type=int, default=1024, help="per engine, of 16 tokens")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--load-bound", type=float, default=1.25, help="the oracle's (the mock's --load-bound)")
    parser.add_argument("--prefix-aware-args", default="", help="more dplb options for prefix-aware, e.g. "
                        "'--load-bound 1.5 --prefix-min-match 64'")
    parser.add_argument("--no-affinity", dest="affinity", action="store_false",
                        help=f"chat: prefix-aware without --affinity-header {SESSION_HEADER}")
    parser.add_argument("--mock-args", default="", help="more engine options for every row")
    add_run_arguments(parser, repeats=1)
    opts = parser.parse_args()

    wanted = opts.policies.split()
    opts.policies = " ".join(p for p in wanted if p != ORACLE)
    policies = compared_policies(opts, "prefix")
    if ORACLE in wanted:
        if oracle_offered(opts.mock):
            policies.append(ORACLE)
        else:
            log(f"prefix: skipping {ORACLE}: {opts.mock} has no --dp-balance")
    workloads = opts.workloads.split()
    for workload in workloads:
        if workload not in ("groups", "chat", "unrelated"):
            raise SystemExit(f"prefix: unknown workload {workload} (known: groups chat unrelated)")
    rates = {"groups": opts.rates.split(), "chat": ["inf"], "unrelated": ["inf"]}
    cells = [(workload, rate, policy, repeat) for workload in workloads for rate in rates[workload]
             for repeat in range(opts.repeats) for policy in policies]
    run_cells("prefix", cells, lambda workdir, *cell: run_one(opts, workdir, *cell), opts,
              lambda records, elapsed: report(opts, workloads, rates, policies, records, elapsed))


def report(opts, workloads, rates, policies, records, elapsed):
    med = statistics.median
    lines = [f"# dplb prefix benchmark: {ENGINES} independent DP engines behind one port (mock --simulate --dp "
             f"{ENGINES} --prefill-us-per-token 120 --kv-blocks {opts.kv_blocks} --max-num-seqs {opts.max_num_seqs} "
             f"--time-scale {opts.time_scale:g}{(' ' + opts.mock_args) if opts.mock_args else ''}), "
             f"{opts.repeats} run(s) per cell, {elapsed:.0f} s",
             "",
             f"groups: {opts.groups} groups of {opts.prefix_len}-word prefixes, {opts.query_len}-word queries, "
             f"{opts.output_len} output tokens, {opts.num_prompts} requests per run, Poisson at the rate "
             f"(requests per simulated s). chat: {opts.chat_sessions} sessions x {opts.chat_turns} turns, "
             f"{opts.chat_concurrency} at a time, {opts.chat_groups} shared {opts.chat_prefix_len}-word system "
             f"prompts, {opts.chat_input_len} new words per turn"
             + (f", prefix-aware with --affinity-header {SESSION_HEADER}" if opts.affinity else "") + ".",
             "",
             "Output tok/s and TTFT (s) simulated (the client's, scaled by the time scale); hit rate = prefix-cache "
             "hit tokens / queried tokens over the engines; ratios to least-inflight (tok/s: policy / "
             "least-inflight; TTFT: least-inflight / policy; above 1: better); oracle share = tok/s / the oracle's. "
             "Medians over runs.",
             "",
             "| workload | rate | policy | output tok/s | TTFT p50 | TTFT p90 | hit rate | requests per engine "
             "| tok/s ratio | TTFT p50 ratio | TTFT p90 ratio | oracle share |",
             "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for workload in workloads:
        for rate in rates[workload]:
            cell = {p: [r for r in records if r["workload"] == workload and r["rate"] == rate and r["policy"] == p]
                    for p in policies}

            def value(policy, key):
                vals = [r[key] for r in cell.get(policy, []) if r[key] is not None]
                return med(vals) if vals else None

            def ratio(num, den):
                return f"{num / den:.3f}" if num and den else "-"

            for policy in policies:
                if not cell[policy]:
                    continue
                tput, p50, p90 = value(policy, "output_tok_s"), value(policy, "ttft_p50_s"), value(policy, "ttft_p90_s")
                routed = "/".join(str(int(med(r["routed"][e] for r in cell[policy]))) for e in range(ENGINES))
                lines.append(
                    f"| {workload} | {rate} | {policy} | {tput:,.0f} | {p50:.2f} | {p90:.2f} "
                    f"| {value(policy, 'hit_rate'):.3f} | {routed} "
                    f"| {ratio(tput, value('least-inflight', 'output_tok_s'))} "
                    f"| {ratio(value('least-inflight', 'ttft_p50_s'), p50)} "
                    f"| {ratio(value('least-inflight', 'ttft_p90_s'), p90)} "
                    f"| {ratio(tput, value(ORACLE, 'output_tok_s'))} |")
    lines += ["", "Every run's output tok/s, by seed (runs of one seed send the same requests):", ""]
    for workload in workloads:
        for rate in rates[workload]:
            for policy in policies:
                runs = sorted((r for r in records if r["workload"] == workload and r["rate"] == rate
                               and r["policy"] == policy), key=lambda r: r["repeat"])
                if runs:
                    lines.append(f"- {workload}, {rate}, {policy}: " + ", ".join(f"{r['output_tok_s']:,.0f}" for r in runs))
    lines += ["", f"Failed requests: {sum(r['failed'] for r in records)}; preemptions: "
              f"{sum(sum(r['preemptions']) for r in records):.0f}; the mock's step-end lag, at most "
              f"{max(r['lag_share'] for r in records):.1%} of its steps' wall time (the scaled figures hold while "
              "this is small)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
