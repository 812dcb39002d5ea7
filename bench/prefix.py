#!/usr/bin/env python3
"""prefix-aware routing against the load-only policies and an oracle, on 4 simulated engines with prefix caching.

Run through bench/prefix.sh (it documents the knobs). For each workload, rate, policy and repeat: a fresh mock
(one process, one port, `dplb-mock-engine --ranks 1 --dp 4 --simulate`: 4 DP engines behind one URL, each on
its own clock as the DP ranks of a dense model, each with its own KV cache and prefix cache), a fresh dplb in
front of it (`--backend http://127.0.0.1:PORT#dp=4 --policy P`), and one dplb-bench client. The "oracle" row
has no dplb: the client talks to a mock started with `--dp-balance oracle --load-bound 1.25`, which sends each
request to the engine whose simulated cache holds the longest prefix of it, within the load bound; it is the
ceiling a prefix-aware router can aim at. The "prefix-aware-events" row is dplb's prefix-aware fed by the mock's
KV-cache events (`--kv-events-port P --kv-replay-port R` on free fixed ports; the backend
`http://127.0.0.1:PORT#dp=4&kv-events=tcp://127.0.0.1:P&kv-replay=tcp://127.0.0.1:R`, `--tokenize engine`, both
block sizes 16); dplb starts before the client, and what its SUB socket missed it replays. Rows whose dplb
policy or mock mode this build lacks are skipped (dplb --help, dplb-mock-engine --help), so the script runs
before and after they land.

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
  pressure  cache pressure, precise against approximate prefix routing, one and two dplb replicas: 32 groups of
          1,000-word prefixes (--pressure-groups, --pressure-prefix-len), the groups' 100-word queries and 64
          output tokens, Poisson at each of --pressure-rates (default 40 and 56 per simulated s), 1,200 requests
          per run, engines of --pressure-kv-blocks 1024 at --pressure-time-scale 4 (two dplb replicas, a front,
          /tokenize and the client share the 2 cores; 10 lags). Rows (--pressure-policies, --replica-policies):
          least-inflight, prefix-aware (the approximate index: what this dplb routed where, never what the
          engines evicted nor what another router sent), prefix-aware-events (the precise one: dplb prefix-aware
          with the backend's kv-events and kv-replay, --tokenize engine, the mock publishing vLLM's KV-cache
          events on fixed free ports), the oracle, and prefix-aware/2, prefix-aware-events/2: two replicas of
          that dplb in front of the same engines, the client's requests split evenly between them by a
          round-robin dplb in front of the replicas (plain backends: it sends no X-data-parallel-rank).
          Sizing (16-token blocks): a prefix is 62 full blocks; a request holds 11 more of its own ((1,000 +
          100 + 64) / 16 -> 73, less 62), so 32 running hold 352. The 32 prefixes are 1,984 blocks. Kept apart,
          8 groups per engine, an engine needs 8 x 62 + 352 = 848 of its 1,024: every prefix stays cached with
          about 3 prefixes of room for the load bound's spills, and the 4 caches (4,096) hold them all. Every
          group on two engines (two replicas, each placing a group where its own first request went, neither
          knowing the other's) is 16 per engine: 992 + 352 = 1,344 > 1,024, so an engine keeps about 10 of its
          16 ((1,024 - 352) / 62) and evicts the rest in turn; the approximate replicas keep sending each group
          to both homes, evicted or not. Every group everywhere (least-inflight) is 1,984 + 352 per engine:
          about a third stays. The precise replicas read the same events, so both send a group where it is
          cached: one home, as with one replica. At 40 per second the prefix-aware rows run under capacity
          (cached: ~25 ms of prefill and decode per request per engine; a miss adds 1,000 x 120 us = 120 ms) and
          least-inflight past it; at 56 one replica of either kind still keeps up, the approximate pair of
          replicas (hit rate down by its duplicates) does not.
          The other pressure shape, more prefixes than the 4 caches hold together (--pressure-groups 48
          --pressure-kv-blocks 768: 2,976 blocks of prefixes against 3,072, less the running requests'), makes
          every row evict; there a group's fixed home (the approximate index) beats following the cache
          (docs/benchmarks.md section 6 has the figures and why).
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
  - dplb's own figures (its /metrics, each replica's): prefix picks taken, overridden (over the load bound),
    missed; with KV-cache events, events read, errors, index resets, replayed, blocks indexed at the end and
    /tokenize outcomes. A precise run whose replica read no event, indexed nothing or tokenized nothing fails.
Ratios: tok/s policy / least-inflight, TTFT least-inflight / policy (above 1: the policy better), and the share
of the oracle's tok/s; medians over the repeats. For pressure also precise / approximate (tok/s, TTFT p90), the
precise share of the oracle, and each prefix-aware row's hit rate with two replicas against one.

Standard library only; every process started here is stopped by its pid, also on errors and Ctrl-C.
"""

import argparse
import statistics
import subprocess
import time

from benchlib import (add_run_arguments, compared_policies, finish_bench, free_port_block, labelled_sum, log,
                      metric_by_engine, quantile, run_cells, scrape, start_bench, start_dplb, start_mock)

ENGINES = 4
ORACLE = "oracle"
EVENTS = "prefix-aware-events"  # dplb prefix-aware fed by the engines' KV-cache events, --tokenize engine
TWO = "/2"  # a policy's two-replica row: "prefix-aware/2"
POLICIES = "round-robin least-inflight least-load prefix-aware"
PRESSURE_POLICIES = f"least-inflight prefix-aware {EVENTS} {ORACLE}"
REPLICA_POLICIES = f"prefix-aware {EVENTS}"
WORKLOADS = ("groups", "chat", "unrelated", "pressure")
SESSION_HEADER = "x-session-id"
ENGINE_ARGS = ["--prefill-us-per-token", "120", "--threads", "1"]
PRESSURE_GROUPS = 32
PRESSURE_PREFIX_LEN = 1000
PRESSURE_KV_BLOCKS = 1024
PRESSURE_RATES = "40 56"
PRESSURE_NUM_PROMPTS = 1200
PRESSURE_TIME_SCALE = 4.0


def groups_args(opts):
    return ["--prefix-groups", str(opts.groups), "--prefix-len", str(opts.prefix_len), "--random-input-len",
            str(opts.query_len), "--random-output-len", str(opts.output_len), "--num-prompts", str(opts.num_prompts),
            "--max-concurrency", str(opts.max_concurrency)]


def pressure_args(opts):
    return ["--prefix-groups", str(opts.pressure_groups), "--prefix-len", str(opts.pressure_prefix_len),
            "--random-input-len", str(opts.query_len), "--random-output-len", str(opts.output_len), "--num-prompts",
            str(opts.pressure_num_prompts), "--max-concurrency", str(opts.max_concurrency)]


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


def events_offered(dplb, mock):
    """True when this dplb reads KV-cache events (--tokenize in its --help) and this mock publishes them."""
    def helps(binary, flag):
        return flag in subprocess.run([binary, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      timeout=30).stdout
    return helps(dplb, "--tokenize") and helps(mock, "--kv-events-port")


def dplb_figures(metrics_text):
    """What one dplb says of its prefix picks and, with KV-cache events, of its event index."""
    return {"taken": labelled_sum(metrics_text, "dplb_prefix_decisions_total", 'outcome="taken"'),
            "overridden": labelled_sum(metrics_text, "dplb_prefix_decisions_total", 'outcome="overridden"'),
            "missed": labelled_sum(metrics_text, "dplb_prefix_decisions_total", 'outcome="missed"'),
            "kv_blocks": labelled_sum(metrics_text, "dplb_kv_blocks"),
            "kv_events": labelled_sum(metrics_text, "dplb_kv_events_total"),
            "kv_event_errors": labelled_sum(metrics_text, "dplb_kv_event_errors_total"),
            "kv_resets": labelled_sum(metrics_text, "dplb_kv_index_resets_total"),
            "kv_replayed": labelled_sum(metrics_text, "dplb_kv_events_replayed_total"),
            "tokenize_ok": labelled_sum(metrics_text, "dplb_tokenize_requests_total", 'outcome="ok"'),
            "tokenize_failed": labelled_sum(metrics_text, "dplb_tokenize_requests_total", 'outcome="failed"')}


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
    tag = f"{workload}-{rate}-{policy.replace('/', '_')}-{repeat}"
    oracle = policy == ORACLE
    base_policy, replicas = (policy[:-len(TWO)], 2) if policy.endswith(TWO) else (policy, 1)
    events = base_policy == EVENTS
    kv_blocks = opts.pressure_kv_blocks if workload == "pressure" else opts.kv_blocks
    scale = opts.pressure_time_scale if workload == "pressure" else opts.time_scale
    mock_args = (["--ranks", "1", "--dp", str(ENGINES), "--simulate", "--time-scale", str(scale),
                  "--kv-blocks", str(kv_blocks), "--max-num-seqs", str(opts.max_num_seqs)] + ENGINE_ARGS
                 + (["--dp-balance", "oracle", "--load-bound", str(opts.load_bound)] if oracle else [])
                 + opts.mock_args.split())
    fragments = None
    if events:
        # The KV-event ports must be known before the mock starts (dplb is told them): two blocks of ENGINES
        # free ports, engine e publishing on events + e and replaying on replay + e.
        events_port = free_port_block(ENGINES)
        replay_port = free_port_block(ENGINES, avoid=range(events_port, events_port + ENGINES))
        mock_args += ["--kv-events-port", str(events_port), "--kv-replay-port", str(replay_port)]
        fragments = [f"kv-events=tcp://127.0.0.1:{events_port}&kv-replay=tcp://127.0.0.1:{replay_port}"]
    mock, ports, admin = start_mock(opts.mock, mock_args, workdir / f"{tag}.mock.log")
    proxies = []
    dplb_ports = []
    try:
        port = ports[0]
        if not oracle:
            extra = ["--threads", "1"]
            if base_policy in ("prefix-aware", EVENTS):
                extra += opts.prefix_aware_args.split()
                if workload == "chat" and opts.affinity:
                    extra += ["--affinity-header", SESSION_HEADER]
            if events:
                extra += ["--tokenize", "engine"]
            for r in range(replicas):
                proxy, dplb_port = start_dplb(opts.dplb, "prefix-aware" if events else base_policy, ports,
                                              workdir / f"{tag}.dplb-{r}.log", extra, dp=ENGINES, fragments=fragments)
                proxies.append(proxy)
                dplb_ports.append(dplb_port)
            port = dplb_ports[0]
            if replicas > 1:
                # The client's requests split evenly between the replicas: a round-robin dplb in front of them
                # (plain backends: it adds no X-data-parallel-rank), as an L4 balancer would spread clients.
                front, port = start_dplb(opts.dplb, "round-robin", dplb_ports, workdir / f"{tag}.front.log",
                                         ["--threads", "1"])
                proxies.append(front)
        rate_args = ["--request-rate", "inf" if rate == "inf" else str(float(rate) * scale)]
        workload_args = {"groups": groups_args, "chat": chat_args, "unrelated": unrelated_args,
                         "pressure": pressure_args}[workload](opts)
        args = workload_args + rate_args + [
            "--ignore-eos", "--seed", str(opts.seed + repeat)]
        result_path = workdir / f"{tag}.json"
        started = time.monotonic()
        result = finish_bench(start_bench(opts.bench, port, args, result_path, workdir / f"{tag}.client.log"),
                              result_path)
        wall = time.monotonic() - started
        engines = engine_figures(scrape(f"http://127.0.0.1:{admin}/metrics?rank=0"))
        routers = [dplb_figures(scrape(f"http://127.0.0.1:{p}/metrics")) for p in dplb_ports]
    finally:
        for proxy in reversed(proxies):
            proxy.stop()
        mock.stop()

    if events:
        # The precise rows must really have run on the events: every replica read some and holds blocks.
        for i, figures in enumerate(routers):
            if figures["kv_events"] == 0 or figures["kv_blocks"] == 0 or figures["tokenize_ok"] == 0:
                raise RuntimeError(f"{tag}: dplb replica {i} saw no KV-cache events or tokenized nothing: {figures}")
            if figures["tokenize_failed"] or figures["kv_event_errors"] or figures["kv_resets"]:
                log(f"prefix: {tag}: replica {i}: {figures}")
    ttfts = [t * scale for t in result["ttfts"] if t is not None]
    queries = sum(engines["queries"])
    # The mock must keep up for the scaled figures to hold: its step ends' wall lag against the wall time the
    # engines' steps take (mock_step_seconds_total is simulated).
    busy_wall = sum(engines["busy_s"]) / scale
    return {
        "workload": workload, "rate": rate, "policy": policy, "repeat": repeat, "wall_s": wall,
        "replicas": replicas,
        "output_tok_s": result["output_throughput"] / scale,
        "ttft_p50_s": quantile(ttfts, 0.5) if ttfts else None,
        "ttft_p90_s": quantile(ttfts, 0.9) if ttfts else None,
        "hit_rate": sum(engines["hits"]) / queries if queries else 0.0,
        "duration_s": result["duration"] * scale,
        "lag_share": sum(engines["lag_s"]) / busy_wall if busy_wall else 0.0,
        "completed": result["completed"], "failed": result["failed"],
        "dplb": routers,
        **engines,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--policies", default=POLICIES + " " + ORACLE,
                        help="dplb policies, and 'oracle' (the mock's own balancing); those this build lacks are "
                        "skipped")
    parser.add_argument("--workloads", default="groups chat unrelated pressure",
                        help="among: " + " ".join(WORKLOADS))
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
    parser.add_argument("--pressure-groups", type=int, default=PRESSURE_GROUPS)
    parser.add_argument("--pressure-prefix-len", type=int, default=PRESSURE_PREFIX_LEN,
                        help="pressure: words of each group's prefix")
    parser.add_argument("--pressure-kv-blocks", type=int, default=PRESSURE_KV_BLOCKS,
                        help="pressure: KV-cache blocks per engine, of 16 tokens")
    parser.add_argument("--pressure-rates", default=PRESSURE_RATES,
                        help="pressure: requests per simulated second, one run each")
    parser.add_argument("--pressure-num-prompts", type=int, default=PRESSURE_NUM_PROMPTS,
                        help="pressure: requests per run")
    parser.add_argument("--pressure-time-scale", type=float, default=PRESSURE_TIME_SCALE,
                        help="pressure: the mock's --time-scale (lower than the others': two dplb replicas, a "
                        "front and /tokenize share the cores)")
    parser.add_argument("--pressure-policies", default=PRESSURE_POLICIES,
                        help=f"pressure: the one-replica rows (dplb policies, {EVENTS}, {ORACLE})")
    parser.add_argument("--replica-policies", default=REPLICA_POLICIES,
                        help="pressure: policies also run with two dplb replicas, the client's requests split "
                        "between them ('' for none)")
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

    special = (ORACLE, EVENTS)
    wanted = opts.policies.split()
    pressure_wanted = opts.pressure_policies.split()
    replica_wanted = opts.replica_policies.split()
    opts.policies = " ".join(dict.fromkeys(p for p in wanted + pressure_wanted + replica_wanted if p not in special))
    offered = set(compared_policies(opts, "prefix"))
    if ORACLE in wanted + pressure_wanted:
        if oracle_offered(opts.mock):
            offered.add(ORACLE)
        else:
            log(f"prefix: skipping {ORACLE}: {opts.mock} has no --dp-balance")
    if EVENTS in wanted + pressure_wanted + replica_wanted:
        if events_offered(opts.dplb, opts.mock):
            offered.add(EVENTS)
        else:
            log(f"prefix: skipping {EVENTS}: {opts.dplb} has no --tokenize or {opts.mock} no --kv-events-port")
    workloads = opts.workloads.split()
    for workload in workloads:
        if workload not in WORKLOADS:
            raise SystemExit(f"prefix: unknown workload {workload} (known: {' '.join(WORKLOADS)})")
    rates = {"groups": opts.rates.split(), "chat": ["inf"], "unrelated": ["inf"], "pressure": opts.pressure_rates.split()}
    policies = {w: [p for p in wanted if p in offered] for w in WORKLOADS}
    policies["pressure"] = ([p for p in pressure_wanted if p in offered]
                            + [p + TWO for p in replica_wanted if p in offered and p != ORACLE])
    cells = [(workload, rate, policy, repeat) for workload in workloads for rate in rates[workload]
             for repeat in range(opts.repeats) for policy in policies[workload]]
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
             + (f", prefix-aware with --affinity-header {SESSION_HEADER}" if opts.affinity else "") + ". "
             f"pressure: {opts.pressure_groups} groups of {opts.pressure_prefix_len}-word prefixes, "
             f"{opts.query_len}-word queries, {opts.output_len} output tokens, {opts.pressure_num_prompts} requests "
             f"per run, Poisson, --kv-blocks {opts.pressure_kv_blocks} per engine, --time-scale "
             f"{opts.pressure_time_scale:g}. {EVENTS}: dplb prefix-aware fed "
             "by the engines' KV-cache events (--tokenize engine); prefix-aware alone is the approximate index of "
             f"what dplb routed; P{TWO}: policy P on two dplb replicas, the client's requests split between them.",
             "",
             "Output tok/s and TTFT (s) simulated (the client's, scaled by the time scale); hit rate = prefix-cache "
             "hit tokens / queried tokens over the engines; ratios to least-inflight (tok/s: policy / "
             "least-inflight; TTFT: least-inflight / policy; above 1: better); oracle share = tok/s / the oracle's. "
             "Medians over runs.",
             "",
             "| workload | rate | policy | output tok/s | TTFT p50 | TTFT p90 | hit rate | requests per engine "
             "| tok/s ratio | TTFT p50 ratio | TTFT p90 ratio | oracle share |",
             "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]

    def cell_of(workload, rate):
        return {p: [r for r in records if r["workload"] == workload and r["rate"] == rate and r["policy"] == p]
                for p in policies[workload]}

    def value(cell, policy, key):
        vals = [r[key] for r in cell.get(policy, []) if r[key] is not None]
        return med(vals) if vals else None

    def ratio(num, den):
        return f"{num / den:.3f}" if num and den else "-"

    for workload in workloads:
        for rate in rates[workload]:
            cell = cell_of(workload, rate)
            for policy in policies[workload]:
                if not cell[policy]:
                    continue
                tput, p50, p90 = (value(cell, policy, k) for k in ("output_tok_s", "ttft_p50_s", "ttft_p90_s"))
                routed = "/".join(str(int(med(r["routed"][e] for r in cell[policy]))) for e in range(ENGINES))
                lines.append(
                    f"| {workload} | {rate} | {policy} | {tput:,.0f} | {p50:.2f} | {p90:.2f} "
                    f"| {value(cell, policy, 'hit_rate'):.3f} | {routed} "
                    f"| {ratio(tput, value(cell, 'least-inflight', 'output_tok_s'))} "
                    f"| {ratio(value(cell, 'least-inflight', 'ttft_p50_s'), p50)} "
                    f"| {ratio(value(cell, 'least-inflight', 'ttft_p90_s'), p90)} "
                    f"| {ratio(tput, value(cell, ORACLE, 'output_tok_s'))} |")
    if "pressure" in workloads:
        lines += ["", f"pressure: precise ({EVENTS}) against approximate (prefix-aware), the bars: tok/s >= 1.2x, "
                  "TTFT p90 <= 0.5x, >= 95% of the oracle's tok/s; with two replicas precise keeps >= 90% of its "
                  "one-replica hit rate. dplb's picks (taken: where the prefix is; overridden: that rank over the "
                  "load bound; missed: no rank had it), summed over replicas, medians over runs.", "",
                  "| rate | precise / approximate tok/s | TTFT p90 precise / approximate | precise share of the oracle "
                  "| hit rate 1 replica | hit rate 2 replicas | 2 / 1 | approximate hit 1 / 2 replicas (2 / 1) "
                  "| picks taken/overridden/missed, precise 1 / 2 replicas | approximate 1 / 2 replicas |",
                  "|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
        for rate in rates["pressure"]:
            cell = cell_of("pressure", rate)

            def picks(policy):
                if not cell.get(policy):
                    return "-"
                return "/".join(str(int(med(sum(d[k] for d in r["dplb"]) for r in cell[policy])))
                                for k in ("taken", "overridden", "missed"))

            precise_hit, precise_hit2 = value(cell, EVENTS, "hit_rate"), value(cell, EVENTS + TWO, "hit_rate")
            approx_hit, approx_hit2 = value(cell, "prefix-aware", "hit_rate"), value(cell, "prefix-aware" + TWO, "hit_rate")
            lines.append(
                f"| {rate} | {ratio(value(cell, EVENTS, 'output_tok_s'), value(cell, 'prefix-aware', 'output_tok_s'))} "
                f"| {ratio(value(cell, EVENTS, 'ttft_p90_s'), value(cell, 'prefix-aware', 'ttft_p90_s'))} "
                f"| {ratio(value(cell, EVENTS, 'output_tok_s'), value(cell, ORACLE, 'output_tok_s'))} "
                f"| {precise_hit or 0:.3f} | {precise_hit2 or 0:.3f} | {ratio(precise_hit2, precise_hit)} "
                f"| {approx_hit or 0:.3f} / {approx_hit2 or 0:.3f} ({ratio(approx_hit2, approx_hit)}) "
                f"| {picks(EVENTS)} / {picks(EVENTS + TWO)} | {picks('prefix-aware')} / {picks('prefix-aware' + TWO)} |")
    lines += ["", "Every run's output tok/s (hit rate), by seed (runs of one seed send the same requests):", ""]
    for workload in workloads:
        for rate in rates[workload]:
            for policy in policies[workload]:
                runs = sorted((r for r in records if r["workload"] == workload and r["rate"] == rate
                               and r["policy"] == policy), key=lambda r: r["repeat"])
                if runs:
                    lines.append(f"- {workload}, {rate}, {policy}: "
                                 + ", ".join(f"{r['output_tok_s']:,.0f} ({r['hit_rate']:.3f})" for r in runs))
    events_runs = [d for r in records if r["policy"].startswith(EVENTS) for d in r.get("dplb", [])]
    if events_runs:
        lines += ["", f"{EVENTS}, over every replica of every run: KV-cache events read "
                  f"{sum(d['kv_events'] for d in events_runs):,.0f}, event errors {sum(d['kv_event_errors'] for d in events_runs):.0f}, "
                  f"index resets {sum(d['kv_resets'] for d in events_runs):.0f}, events replayed "
                  f"{sum(d['kv_replayed'] for d in events_runs):,.0f}, blocks indexed at the end at least "
                  f"{min(d['kv_blocks'] for d in events_runs):,.0f} per replica; /tokenize ok "
                  f"{sum(d['tokenize_ok'] for d in events_runs):,.0f}, failed {sum(d['tokenize_failed'] for d in events_runs):.0f}."]
    lines += ["", f"Failed requests: {sum(r['failed'] for r in records)}; preemptions: "
              f"{sum(sum(r['preemptions']) for r in records):.0f}; the mock's step-end lag, at most "
              f"{max(r['lag_share'] for r in records):.1%} of its steps' wall time (the scaled figures hold while "
              "this is small)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
