#!/usr/bin/env python3
"""Prefill/decode disaggregation against co-located engines, at equal engine count, on the simulator.

Run through bench/pd.sh (it documents the knobs). Three parts, each run --repeats times with fresh processes:

1. Mixed workload, two setups of 8 simulated engines each (dplb-mock-engine --simulate --dp-lockstep: MoE DP
   ranks that step together, each step as long as the slowest rank's CUDA-graph-padded batch and prefill;
   --clocks independent: each rank on its own clock, as a dense model's DP ranks):
   - "pd": 4 prefill ranks (one mock process, --ranks 4 --kv-role prefill) and 4 decode ranks (another,
     --ranks 4 --kv-role decode) behind dplb in P/D mode (--prefill URL x4 --decode URL x4, least-inflight on
     both pools). Every request runs a prefill leg (max_tokens 1: the simulated prefill compute of its prompt,
     then the blocks are held) and a decode leg (the decode engine pulls the blocks, waits
     --kv-transfer-us-per-block per block of simulated time, and joins the decode batch without paying the
     prefill again: its first step computes the last prompt token only).
   - "colocated": 8 ranks of one mock process (--ranks 8 --kv-role both) behind dplb --policy least-inflight:
     each rank prefills and decodes, chunked prefill (--max-num-batched-tokens 8192) mixing prompt chunks
     into the decode steps, and one rank's prefill lengthening the step of all 8 (lockstep).
   The load (dplb-bench): prefill-heavy and mixed, streaming, Poisson at --rate requests per simulated second:
   --input-len prompt words (1 word = 1 token in the mock) and --output-len tokens, both +-50%
   (--range-ratio), and a --long-share of the requests with --long-input-len words and --long-output-len
   tokens (long prompts, short answers). Reported: TTFT p50/p90 and ITL p50-ish (mean) / p99 in simulated
   milliseconds (the client's wall-clock figures times --time-scale), the ratios colocated / pd (above 1:
   P/D better), output tok/s, and the decode engines' padded/real tokens.

2. Burst on the decode pool: --burst requests (64 prompt words, --burst-output-len tokens, ignore_eos,
   non-streaming), delivered as imbalance.py delivers them (spread over N x 100/62 ms, so that the
   engine-stats baseline's refreshes land inside the burst), through dplb in P/D mode; the decode mock holds
   its steps until the whole burst is there (--start-after N), so every decode request joins the first step.
   dplb picks decode ranks with --policy least-inflight (the default) and, as the baseline, with --policy
   engine-stats (vLLM's coordinator-stats balancing, refreshed every 100 ms). Reported: the split over the 4
   decode ranks (requests each served, from the engines' own counters) and the decode engines' padded/real
   tokens (1.000: no CUDA-graph padding wasted; a burst split 65/64/64/63 pads every rank to 72).

3. Multi-turn chat on the same 4 + 4 lockstep ranks: --conversations conversations of --turns turns, all running
   at once (bench/chatload.py: conversation i starts at i x --chat-start-spread-ms / C, each turn as soon as the
   previous answer is in), each with its own --chat-prefix-len-token system prefix, each turn's prompt the
   previous prompt + its answer's tokens (the mock's "tok" id, so that the engines' cached output blocks hit) +
   --user-min..--user-max new tokens, --chat-output-len tokens out, streaming completions with the prompt as token
   ids (dplb matches ids against the KV-cache events, no /tokenize). Both mocks publish their KV-cache events
   (--kv-events-port, --kv-replay-port on free fixed ports) and dplb reads them (#kv-events=&kv-replay= on every
   --prefill and --decode URL), --prefill-policy --chat-prefill-policy (prefix-aware: a turn's prefill leg goes
   where its history was prefilled and computes only the new tokens). Setups (--chat-setups): "no-skip", decode
   --policy prefix-aware, --pd-skip-prefill-ratio 0; "skip", the same with --skip-ratio (a turn whose decode rank
   holds that share of its prompt's blocks runs there in one leg: the decode engine prefills the rest itself, in
   its lockstep steps, which the ITL shows); "no-skip-li", decode --policy least-inflight, no skip. Reported: TTFT
   p50/p90 of turns 2.. and turn 1's p50, ITL mean/p99 over every turn, prefill legs (dplb_requests_total over
   the prefill ranks), skipped (dplb_pd_prefill_skipped_total), the prompt tokens the decode engines computed,
   their mean step and padded/real. Checked: prefill legs = requests - skipped = KV transfers, no block held at
   the end, dplb indexed the events' blocks (prefix-aware), and skips > 0 exactly when R > 0.

Rows whose dplb lacks P/D mode (no --prefill in dplb --help) are skipped with a note, so that the script runs
before P/D mode lands (the co-located rows alone). Every run also checks the P/D bookkeeping: every decode leg
pulled its blocks (mock_kv_transfers_total = requests, no mock_kv_transfer_errors_total) and no prefill engine
holds a block at the end (mock_kv_blocks_held 0).

Standard library only; every process started here is stopped by its pid, also on errors and Ctrl-C.
"""

import argparse
import re
import statistics
import subprocess
import time

from benchlib import (add_run_arguments, binaries, finish_bench, free_port_block, labelled_sum, log, metric_by_engine,
                      metric_sum, quantile, run_cells, scrape, start_bench, start_mock, start_router)
from chatload import run_chat

POOL = 4  # ranks per pool in P/D; the co-located setup has 2 x POOL
BURST_POLICIES = ("least-inflight", "engine-stats")
# Part 3's setups: (decode --policy, skip the prefill?); "skip" runs with --pd-skip-prefill-ratio R, the others 0.
CHAT_SETUPS = {"no-skip": ("prefix-aware", False), "skip": ("prefix-aware", True),
               "no-skip-li": ("least-inflight", False)}
# As bench/imbalance.py: requests of a burst per engine-stats refresh period (see REQUESTS_PER_REFRESH there).
REQUESTS_PER_REFRESH = 62


def pd_offered(dplb):
    """True when this dplb has P/D mode (--prefill in its --help)."""
    return "--prefill" in subprocess.run([dplb, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, timeout=30).stdout


def skip_offered(dplb):
    """True when this dplb has --pd-skip-prefill-ratio."""
    return "--pd-skip-prefill-ratio" in subprocess.run([dplb, "--help"], stdout=subprocess.PIPE,
                                                       stderr=subprocess.STDOUT, text=True, timeout=30).stdout


def urls(ports):
    return [f"http://127.0.0.1:{p}" for p in ports]


def engine_args(opts, ranks, role, start_after=0, scale=None, lockstep=True):
    return (["--ranks", str(ranks), "--simulate"] + (["--dp-lockstep"] if lockstep else [])
            + ["--time-scale", str(scale or opts.time_scale),
             "--max-num-seqs", str(opts.max_num_seqs), "--threads", "1", "--kv-role", role]
            + (["--start-after", str(start_after)] if start_after else []) + opts.mock_args.split())


def per_rank(admin, ranks, name):
    """[value of metric `name` on each rank of a mock] through its admin port."""
    return [metric_sum(scrape(f"http://127.0.0.1:{admin}/metrics?rank={r}"), name) for r in range(ranks)]


def await_released(admin, ranks, timeout=10.0):
    """Blocks still held by a prefill mock's engines, once they are 0 or after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        held = sum(per_rank(admin, ranks, "mock_kv_blocks_held"))
        if held == 0 or time.monotonic() >= deadline:
            return held
        time.sleep(0.05)


class Setup:
    """The engines and the dplb of one run; stop() stops every process started, each by its pid."""

    def __init__(self):
        self.procs = []

    def add(self, started):
        self.procs.append(started[0])
        return started

    def stop(self):
        for proc in reversed(self.procs):
            proc.stop()


def start_setup(opts, workdir, tag, setup, policy, start_after=0, scale=None, lockstep=True):
    """Engines and dplb: (Setup, dplb port, {"prefill"|"decode"|"both": (admin port, ranks)})."""
    s = Setup()
    try:
        pools = {}
        if setup == "pd":
            _, prefill_ports, prefill_admin = s.add(start_mock(opts.mock, engine_args(opts, POOL, "prefill", 0, scale, lockstep),
                                                               workdir / f"{tag}.prefill.log"))
            _, decode_ports, decode_admin = s.add(start_mock(opts.mock, engine_args(opts, POOL, "decode", start_after,
                                                                                    scale, lockstep),
                                                             workdir / f"{tag}.decode.log"))
            pools = {"prefill": (prefill_admin, POOL), "decode": (decode_admin, POOL)}
            args = ["--policy", policy, "--stats-interval", f"{opts.stats_interval_ms}ms"]
            for url in urls(prefill_ports):
                args += ["--prefill", url]
            for url in urls(decode_ports):
                args += ["--decode", url]
        else:
            _, ports, admin = s.add(start_mock(opts.mock, engine_args(opts, 2 * POOL, "both", start_after, scale, lockstep),
                                               workdir / f"{tag}.mock.log"))
            pools = {"both": (admin, 2 * POOL)}
            args = ["--policy", policy, "--stats-interval", f"{opts.stats_interval_ms}ms"]
            for url in urls(ports):
                args += ["--backend", url]
        _, port = s.add(start_router(opts.dplb, args + ["--threads", str(opts.dplb_threads)], workdir / f"{tag}.dplb.log"))
    except BaseException:
        s.stop()
        raise
    return s, port, pools


def pd_checks(tag, pools, requests):
    """The P/D bookkeeping of a run: (kv transfers, transfer errors, blocks still held); raises when wrong."""
    admin, ranks = pools["decode"]
    transfers = sum(per_rank(admin, ranks, "mock_kv_transfers_total"))
    errors = sum(per_rank(admin, ranks, "mock_kv_transfer_errors_total"))
    held = await_released(*pools["prefill"])
    if transfers != requests or errors or held:
        raise RuntimeError(f"{tag}: {transfers:.0f} KV transfers for {requests} requests, {errors:.0f} errors, "
                           f"{held:.0f} blocks still held")
    return transfers, errors, held


def lag_share(admin, ranks, scale):
    """The mock's step-end lag over its steps' wall time (the scaled figures hold while it is small)."""
    busy = per_rank(admin, ranks, "mock_step_seconds_total")[0] / scale  # lockstep: one clock
    lag = per_rank(admin, ranks, "mock_step_lag_seconds_total")[0]
    return lag / busy if busy else 0.0


def run_mixed(opts, workdir, setup, repeat):
    tag = f"mixed-{setup}-{repeat}"
    s, port, pools = start_setup(opts, workdir, tag, setup, "least-inflight", lockstep=opts.clocks == "lockstep")
    try:
        result_path = workdir / f"{tag}.json"
        bench = start_bench(opts.bench, port, [
            "--random-input-len", str(opts.input_len), "--random-output-len", str(opts.output_len),
            "--random-range-ratio", str(opts.range_ratio), "--long-share", str(opts.long_share),
            "--long-input-len", str(opts.long_input_len), "--long-output-len", str(opts.long_output_len),
            "--ignore-eos", "--num-prompts", str(opts.num_prompts), "--request-rate", str(opts.rate * opts.time_scale),
            "--seed", str(opts.seed + repeat)], result_path, workdir / f"{tag}.bench.log")
        result = finish_bench(bench, result_path)
        decode = pools["decode" if setup == "pd" else "both"]
        padded = sum(per_rank(decode[0], decode[1], "mock_padded_tokens_total"))
        even_padded = sum(per_rank(decode[0], decode[1], "mock_even_padded_tokens_total"))
        real = sum(per_rank(decode[0], decode[1], "mock_real_tokens_total"))
        busy = max(per_rank(decode[0], decode[1], "mock_step_seconds_total"))
        generated = sum(per_rank(decode[0], decode[1], "vllm:generation_tokens_total"))
        lags = [lag_share(a, r, opts.time_scale) for a, r in pools.values()]
        if setup == "pd":
            pd_checks(tag, pools, result["completed"])
    finally:
        s.stop()
    scale = opts.time_scale
    ttfts = [t * scale * 1000 for t in result["ttfts"] if t is not None]
    return {"part": "mixed", "setup": setup, "repeat": repeat, "completed": result["completed"],
            "failed": result["failed"],
            "ttft_p50_ms": quantile(ttfts, 0.5) if ttfts else None,
            "ttft_p90_ms": quantile(ttfts, 0.9) if ttfts else None,
            "itl_mean_ms": result["mean_itl_ms"] * scale, "itl_p99_ms": result["p99_itl_ms"] * scale,
            "output_tok_s": result["output_throughput"] / scale,
            "decode_padding": padded / real if real else 0.0, "decode_tok_s": generated / busy if busy else 0.0,
            "decode_padding_floor": even_padded / real if real else 0.0, "lag_share": max(lags)}


def run_burst(opts, workdir, policy, repeat):
    tag = f"burst-{policy}-{repeat}"
    s, port, pools = start_setup(opts, workdir, tag, "pd", policy, start_after=opts.burst, scale=opts.burst_time_scale)
    try:
        result_path = workdir / f"{tag}.json"
        spread_ms = opts.burst * opts.stats_interval_ms / REQUESTS_PER_REFRESH
        bench = start_bench(opts.bench, port, [
            "--random-input-len", str(opts.burst_input_len), "--random-output-len", str(opts.burst_output_len),
            "--ignore-eos", "--no-stream", "--num-prompts", str(opts.burst), "--request-rate", "inf",
            "--burst-spread-ms", f"{spread_ms:.3f}", "--seed", str(opts.seed + repeat)], result_path,
            workdir / f"{tag}.bench.log")
        result = finish_bench(bench, result_path)
        admin, ranks = pools["decode"]
        split = [int(n) for n in per_rank(admin, ranks, "vllm:request_success_total")]
        padded = sum(per_rank(admin, ranks, "mock_padded_tokens_total"))
        real = sum(per_rank(admin, ranks, "mock_real_tokens_total"))
        busy = per_rank(admin, ranks, "mock_step_seconds_total")[0]
        generated = sum(per_rank(admin, ranks, "vllm:generation_tokens_total"))
        lag = lag_share(admin, ranks, opts.burst_time_scale)
        pd_checks(tag, pools, result["completed"])
    finally:
        s.stop()
    return {"part": "burst", "setup": "pd", "policy": policy, "repeat": repeat, "completed": result["completed"],
            "failed": result["failed"], "split": split, "max_min": max(split) - min(split),
            "padding": padded / real if real else 0.0, "decode_busy_s": busy,
            "decode_tok_s": generated / busy if busy else 0.0, "lag_share": lag}


def start_chat_setup(opts, workdir, tag, policy, ratio):
    """Part 3: a prefill and a decode mock, each engine publishing its KV-cache events (and replaying them) on fixed
    free ports, and dplb in P/D mode with every pool's URLs carrying its engine's kv-events and kv-replay:
    (Setup, dplb port, pools, prefill URLs)."""
    s = Setup()
    try:
        taken = []
        blocks = []
        for _ in range(4):  # prefill events, prefill replay, decode events, decode replay
            first = free_port_block(POOL, avoid=taken)
            taken += range(first, first + POOL)
            blocks.append(first)
        pools, fragments = {}, {}
        for (role, events, replay) in (("prefill", blocks[0], blocks[1]), ("decode", blocks[2], blocks[3])):
            _, ports, admin = s.add(start_mock(opts.mock, engine_args(opts, POOL, role, scale=opts.chat_time_scale)
                                               + ["--kv-events-port", str(events), "--kv-replay-port", str(replay)],
                                               workdir / f"{tag}.{role}.log"))
            pools[role] = (admin, POOL)
            fragments[role] = [f"{url}#kv-events=tcp://127.0.0.1:{events + j}&kv-replay=tcp://127.0.0.1:{replay + j}"
                               for j, url in enumerate(urls(ports))]
        args = ["--policy", policy, "--prefill-policy", opts.chat_prefill_policy, "--pd-skip-prefill-ratio", f"{ratio:g}",
                "--threads", str(opts.dplb_threads)]
        for url in fragments["prefill"]:
            args += ["--prefill", url]
        for url in fragments["decode"]:
            args += ["--decode", url]
        _, port = s.add(start_router(opts.dplb, args, workdir / f"{tag}.dplb.log"))
    except BaseException:
        s.stop()
        raise
    return s, port, pools, [u.split("#")[0] for u in fragments["prefill"]]


def answer_token(port):
    """The id of the word the mock generates ("tok"), from a rank's /tokenize."""
    import json
    import urllib.request
    request = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=json.dumps(
        {"model": "mock-model", "prompt": "tok"}).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())["tokens"][0]


def run_chat_part(opts, workdir, setup, repeat):
    tag = f"chat-{setup}-{repeat}"
    policy, skips = CHAT_SETUPS[setup]
    ratio = opts.skip_ratio if skips else 0.0
    scale = opts.chat_time_scale
    s, port, pools, prefill_urls = start_chat_setup(opts, workdir, tag, policy, ratio)
    try:
        spec = {"conversations": opts.conversations, "turns": opts.turns, "prefix_len": opts.chat_prefix_len,
                "user_min": opts.user_min, "user_max": opts.user_max, "output_len": opts.chat_output_len,
                "answer_token": answer_token(port), "start_spread_ms": opts.chat_start_spread_ms,
                "think_ms": opts.chat_think_ms, "timeout_s": 120}
        turns, failures, wall = run_chat(port, spec, opts.seed + repeat, scale)
        router = scrape(f"http://127.0.0.1:{port}/metrics")
        (workdir / f"{tag}.dplb.metrics").write_text(router)
        decode, prefill = pools["decode"], pools["prefill"]
        figures = {name: sum(per_rank(decode[0], decode[1], metric)) for name, metric in (
            ("padded", "mock_padded_tokens_total"), ("real", "mock_real_tokens_total"),
            ("transfers", "mock_kv_transfers_total"), ("transfer_errors", "mock_kv_transfer_errors_total"),
            ("decode_queries", "vllm:prefix_cache_queries_total"), ("decode_hits", "vllm:prefix_cache_hits_total"),
            ("decode_served", "vllm:request_success_total"))}
        figures.update({name: sum(per_rank(prefill[0], prefill[1], metric)) for name, metric in (
            ("prefill_served", "vllm:request_success_total"), ("prefill_queries", "vllm:prefix_cache_queries_total"),
            ("prefill_hits", "vllm:prefix_cache_hits_total"))})
        figures["decode_busy_s"] = per_rank(decode[0], decode[1], "mock_step_seconds_total")[0]
        figures["decode_steps"] = per_rank(decode[0], decode[1], "mock_steps_total")[0]
        figures["held"] = await_released(*prefill)
        lags = [lag_share(a, r, scale) for a, r in pools.values()]
    finally:
        s.stop()
    # dplb's own counts: prefill legs (its requests to the prefill ranks), skips, what its KV index holds.
    # dplb numbers its ranks; dplb_rank_inflight{rank,url} names them.
    prefill_ranks = {rank for rank, url in re.findall(r'^dplb_rank_inflight\{rank="(\d+)",url="([^"]+)"\}', router, re.M)
                     if url in prefill_urls}
    if len(prefill_ranks) != POOL:
        raise RuntimeError(f"{tag}: found {len(prefill_ranks)} of the {POOL} prefill ranks in dplb's /metrics")
    prefill_legs = sum(labelled_sum(router, "dplb_requests_total", f'rank="{r}"') for r in prefill_ranks)
    skipped = labelled_sum(router, "dplb_pd_prefill_skipped_total")
    kv_blocks = sum(labelled_sum(router, "dplb_kv_blocks", f'rank="{r}"') for r in range(2 * POOL)
                    if str(r) not in prefill_ranks)
    completed = len(turns)
    later = [t for t in turns if t["turn"] >= 2]
    ttfts = [t["ttft"] * scale * 1000 for t in later]
    gaps = [g * scale * 1000 for t in turns for g in t["gaps"]]
    gaps_later = [g * scale * 1000 for t in later for g in t["gaps"]]
    record = {"part": "chat", "setup": setup, "repeat": repeat, "ratio": ratio, "completed": completed,
              "failed": opts.conversations * opts.turns - completed, "failures": failures[:5],
              "ttft1_p50_ms": quantile([t["ttft"] * scale * 1000 for t in turns if t["turn"] == 1], 0.5)
              if completed else None,
              "ttft_p50_ms": quantile(ttfts, 0.5) if ttfts else None,
              "ttft_p90_ms": quantile(ttfts, 0.9) if ttfts else None,
              "itl_mean_ms": statistics.mean(gaps) if gaps else None,
              "itl_p99_ms": quantile(gaps, 0.99) if gaps else None,
              "itl_p99_later_ms": quantile(gaps_later, 0.99) if gaps_later else None,
              "prefill_legs": prefill_legs, "skipped": skipped, "decode_kv_blocks": kv_blocks,
              "decode_padding": figures["padded"] / figures["real"] if figures["real"] else 0.0,
              "decode_step_ms": figures["decode_busy_s"] / figures["decode_steps"] * 1000 if figures["decode_steps"] else 0,
              "decode_hit_rate": figures["decode_hits"] / figures["decode_queries"] if figures["decode_queries"] else 0.0,
              "prefill_prefilled": figures["prefill_queries"] - figures["prefill_hits"],
              "lag_share": max(lags), "wall_s": wall, **figures}
    # The bookkeeping: one prefill leg per request not skipped, one pull per prefill leg, no block left held, the
    # decode ranks' events indexed (they name remote-prefilled blocks too), and skips exactly when R > 0.
    problems = []
    if prefill_legs != completed - skipped or figures["transfers"] != prefill_legs:
        problems.append(f"{prefill_legs:.0f} prefill legs and {figures['transfers']:.0f} KV transfers for {completed} "
                        f"requests of which {skipped:.0f} skipped the prefill")
    if figures["transfer_errors"] or figures["held"]:
        problems.append(f"{figures['transfer_errors']:.0f} transfer errors, {figures['held']:.0f} blocks still held")
    if policy == "prefix-aware" and kv_blocks == 0:
        problems.append("dplb indexed no block of the decode engines' KV-cache events")
    if (skipped > 0) != (ratio > 0) and completed:
        problems.append(f"{skipped:.0f} prefills skipped with --pd-skip-prefill-ratio {ratio:g}")
    if problems:
        raise RuntimeError(f"{tag}: " + "; ".join(problems))
    if failures:
        log(f"pd: {tag}: {len(failures)} conversation(s) failed, e.g. {failures[0]}")
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--parts", default="mixed burst chat")
    parser.add_argument("--rate", type=float, default=24.0, help="mixed: requests per simulated second (Poisson)")
    parser.add_argument("--num-prompts", type=int, default=1200)
    parser.add_argument("--input-len", type=int, default=2000)
    parser.add_argument("--output-len", type=int, default=200)
    parser.add_argument("--range-ratio", type=float, default=0.5)
    parser.add_argument("--long-share", type=float, default=0.25)
    parser.add_argument("--long-input-len", type=int, default=6000)
    parser.add_argument("--long-output-len", type=int, default=32)
    parser.add_argument("--time-scale", type=float, default=2.0,
                        help="mixed: the mocks' --time-scale (the client's wall-clock jitter counts this many times in the "
                        "figures: 4 made the P/D ITL p99 40 ms, 2 gives 27 ms, on this shared 2-core machine)")
    parser.add_argument("--clocks", choices=("lockstep", "independent"), default="lockstep",
                        help="mixed: every pool's ranks step together (MoE DP, the default) or each on its own clock "
                        "(a dense model's DP ranks); the burst is always lockstep")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--burst", type=int, default=256)
    parser.add_argument("--burst-input-len", type=int, default=64)
    parser.add_argument("--burst-output-len", type=int, default=512)
    parser.add_argument("--burst-time-scale", type=float, default=10.0)
    parser.add_argument("--stats-interval-ms", type=int, default=100,
                        help="engine-stats' refresh period; vLLM's coordinator publishes every 100 ms")
    parser.add_argument("--conversations", type=int, default=32, help="chat: conversations, all running at once")
    parser.add_argument("--turns", type=int, default=4, help="chat: turns per conversation, in sequence")
    parser.add_argument("--chat-prefix-len", type=int, default=1024,
                        help="chat: tokens of each conversation's own system prefix")
    parser.add_argument("--user-min", type=int, default=64, help="chat: fewest new user tokens per turn")
    parser.add_argument("--user-max", type=int, default=256, help="chat: most new user tokens per turn")
    parser.add_argument("--chat-output-len", type=int, default=64, help="chat: tokens of each answer")
    parser.add_argument("--chat-start-spread-ms", type=float, default=1000.0,
                        help="chat: conversation i starts at i x this / conversations (simulated ms)")
    parser.add_argument("--chat-think-ms", type=float, default=0.0,
                        help="chat: pause between an answer and the next turn (simulated ms)")
    parser.add_argument("--chat-time-scale", type=float, default=None, help="chat: the mocks' --time-scale "
                        "(default: --time-scale, as the mixed part)")
    parser.add_argument("--chat-prefill-policy", default="prefix-aware",
                        help="chat: dplb --prefill-policy (prefix-aware: a turn's prefill leg goes where its history "
                        "was prefilled, so the prefill rank computes only the new tokens)")
    parser.add_argument("--skip-ratio", type=float, default=0.5, help="chat: --pd-skip-prefill-ratio of the skip setup")
    parser.add_argument("--chat-setups", default=" ".join(CHAT_SETUPS), help="chat: among " + " ".join(CHAT_SETUPS))
    parser.add_argument("--dplb-threads", type=int, default=1)
    parser.add_argument("--mock-args", default="", help="more engine options for every mock")
    add_run_arguments(parser, repeats=1)
    opts = parser.parse_args()
    if opts.chat_time_scale is None:
        opts.chat_time_scale = opts.time_scale
    opts.dplb, opts.mock, opts.bench = binaries(opts.build_dir, "pd")
    pd = pd_offered(opts.dplb)
    if not pd:
        log(f"pd: skipping the P/D rows and the burst: {opts.dplb} has no --prefill (P/D mode)")
    parts = opts.parts.split()
    cells = []
    for repeat in range(opts.repeats):
        if "mixed" in parts:
            cells += [("mixed", setup, repeat) for setup in (("pd", "colocated") if pd else ("colocated",))]
        if "burst" in parts and pd:
            cells += [("burst", policy, repeat) for policy in BURST_POLICIES]
        if "chat" in parts and pd:
            cells += [("chat", setup, repeat) for setup in opts.chat_setups.split()]
    if "chat" in parts and pd and not skip_offered(opts.dplb):
        raise SystemExit(f"pd: {opts.dplb} has no --pd-skip-prefill-ratio (the chat part measures it)")

    def run_one(workdir, part, which, repeat):
        run = {"mixed": run_mixed, "burst": run_burst, "chat": run_chat_part}[part]
        return run(opts, workdir, which, repeat)

    records = run_cells("pd", cells, run_one, opts, lambda records, elapsed: report(opts, records, elapsed))
    bad = [r for r in records if r["part"] == "burst" and r["policy"] == "least-inflight"
           and (r["max_min"] != (0 if opts.burst % POOL == 0 else 1))]
    if bad:
        raise SystemExit(f"pd: least-inflight split a burst unevenly over the decode ranks: {[r['split'] for r in bad]}")


def report(opts, records, elapsed):
    med = statistics.median
    lines = [f"# dplb P/D benchmark: {POOL} prefill + {POOL} decode ranks (dplb --prefill/--decode) against "
             f"{2 * POOL} co-located ranks (dplb --policy least-inflight), mock --simulate "
             f"({'--dp-lockstep' if opts.clocks == 'lockstep' else 'independent clocks'} in the mixed part) "
             f"--max-num-seqs {opts.max_num_seqs}{(' ' + opts.mock_args) if opts.mock_args else ''}, "
             f"{opts.repeats} run(s) per cell, {elapsed:.0f} s", ""]
    mixed = [r for r in records if r["part"] == "mixed"]
    if mixed:
        lines += [f"## Mixed, prefill-heavy, streaming: {opts.num_prompts} requests, Poisson {opts.rate:g} req/s "
                  f"(simulated), {opts.input_len} prompt / {opts.output_len} output tokens +-{opts.range_ratio:.0%}, "
                  f"{opts.long_share:.0%} of them {opts.long_input_len} / {opts.long_output_len} "
                  f"(--time-scale {opts.time_scale:g})", "",
                  "Simulated milliseconds (the client's wall-clock figures x the time scale); ratio = co-located / P/D "
                  "(above 1: P/D better); decode padded/real = the decode engines' padded over real batch tokens; its "
                  "floor = the same had every step's sequences been split evenly over the engines that stepped together "
                  "(mock_even_padded_tokens_total: what no placement can beat for that load); decode "
                  "tok/s = their generated tokens / their simulated busy time (the busiest engine's) "
                  "(co-located: all 8 engines). Medians over runs.", "",
                  "| setup | TTFT p50 | TTFT p90 | ITL mean | ITL p99 | output tok/s | decode padded/real | its floor "
                  "| decode tok/s | failed |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        cells = {}
        for setup in ("pd", "colocated"):
            runs = [r for r in mixed if r["setup"] == setup]
            if not runs:
                continue
            cells[setup] = {k: med(r[k] for r in runs) for k in ("ttft_p50_ms", "ttft_p90_ms", "itl_mean_ms",
                                                                  "itl_p99_ms", "output_tok_s", "decode_padding",
                                                                  "decode_padding_floor", "decode_tok_s")}
            c = cells[setup]
            lines.append(f"| {'P/D 4+4' if setup == 'pd' else 'co-located 8'} | {c['ttft_p50_ms']:,.0f} "
                         f"| {c['ttft_p90_ms']:,.0f} | {c['itl_mean_ms']:,.1f} | {c['itl_p99_ms']:,.1f} "
                         f"| {c['output_tok_s']:,.0f} | {c['decode_padding']:.3f} | {c['decode_padding_floor']:.3f} "
                         f"| {c['decode_tok_s']:,.0f} "
                         f"| {sum(r['failed'] for r in runs)} |")
        if len(cells) == 2:
            co, pd = cells["colocated"], cells["pd"]
            lines += ["", f"Ratios co-located / P/D: ITL p99 {co['itl_p99_ms'] / pd['itl_p99_ms']:.2f}x, ITL mean "
                      f"{co['itl_mean_ms'] / pd['itl_mean_ms']:.2f}x, TTFT p90 {co['ttft_p90_ms'] / pd['ttft_p90_ms']:.2f}x, "
                      f"TTFT p50 {co['ttft_p50_ms'] / pd['ttft_p50_ms']:.2f}x."]
    bursts = [r for r in records if r["part"] == "burst"]
    if bursts:
        lines += ["", f"## Burst on the decode pool: {opts.burst} requests through dplb P/D, {opts.burst_input_len} "
                  f"prompt / {opts.burst_output_len} output tokens (ignore_eos), all present when the decode engines "
                  f"start (--start-after {opts.burst}), spread over {opts.burst * opts.stats_interval_ms / REQUESTS_PER_REFRESH:.0f} "
                  f"ms wall (--time-scale {opts.burst_time_scale:g})", "",
                  "split = requests each decode rank served (its vllm:request_success_total); padded/real = the decode "
                  "engines' padded over real batch tokens; decode tok/s = generated tokens / simulated decode busy time; "
                  "ratio = to least-inflight. Median run shown, every run's max-min listed.", "",
                  "| decode policy | split | max-min (all) | padded/real | decode tok/s | ratio |",
                  "|---|---|---|---:|---:|---:|"]
        reference = [r["decode_tok_s"] for r in bursts if r["policy"] == "least-inflight"]
        for policy in BURST_POLICIES:
            runs = sorted((r for r in bursts if r["policy"] == policy), key=lambda r: r["decode_tok_s"])
            if not runs:
                continue
            mid = runs[(len(runs) - 1) // 2]
            tok_s = med(r["decode_tok_s"] for r in runs)
            lines.append(f"| {policy} | {'/'.join(map(str, mid['split']))} "
                         f"| {','.join(str(r['max_min']) for r in runs)} | {med(r['padding'] for r in runs):.3f} "
                         f"| {tok_s:,.0f} | {tok_s / med(reference):.3f} |" if reference else "| - |")
    chats = [r for r in records if r["part"] == "chat"]
    if chats:
        lines += ["", f"## Multi-turn chat on P/D: skipping the prefill of a history the decode rank holds "
                  f"(--pd-skip-prefill-ratio {opts.skip_ratio:g})", "",
                  f"{opts.conversations} conversations x {opts.turns} turns, all running at once (starts spread over "
                  f"{opts.chat_start_spread_ms:g} ms, think time {opts.chat_think_ms:g} ms), a {opts.chat_prefix_len}-token "
                  f"system prefix per conversation, {opts.user_min}-{opts.user_max} new user tokens and "
                  f"{opts.chat_output_len} output tokens per turn, the history sent back as token ids; streaming "
                  f"completions; {POOL} prefill + {POOL} decode ranks (lockstep, --time-scale {opts.chat_time_scale:g}), "
                  f"dplb --prefill-policy {opts.chat_prefill_policy}, both pools' KV-cache events.", "",
                  "TTFT of turns 2.. and ITL over every turn in simulated ms; prefill legs = dplb_requests_total over "
                  "the prefill ranks; skipped = dplb_pd_prefill_skipped_total; prefill computed = prompt tokens the "
                  "prefill engines computed (prefix-cache queries - hits); decode hit rate = the decode engines' "
                  "prefix-cache hits / queries (tokens, remote-prefilled prompts included); decode busy = the decode "
                  "pool's simulated busy time, decode step its mean step. "
                  "Medians over runs (prefill legs, skipped: sums over runs).", "",
                  "| setup | TTFT p50 | TTFT p90 | turn-1 TTFT p50 | ITL mean | ITL p99 | prefill legs | skipped "
                  "| prefill computed | decode hit rate | decode busy s | decode step ms | decode padded/real | failed |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        cells = {}
        for setup in CHAT_SETUPS:
            runs = [r for r in chats if r["setup"] == setup]
            if not runs:
                continue
            policy, skips = CHAT_SETUPS[setup]
            c = cells[setup] = {k: med(r[k] for r in runs) for k in (
                "ttft_p50_ms", "ttft_p90_ms", "ttft1_p50_ms", "itl_mean_ms", "itl_p99_ms", "prefill_prefilled",
                "decode_hit_rate", "decode_busy_s", "decode_step_ms", "decode_padding")}
            name = f"{policy}, R={opts.skip_ratio:g}" if skips else f"{policy}, R=0"
            lines.append(f"| {name} | {c['ttft_p50_ms']:,.0f} | {c['ttft_p90_ms']:,.0f} "
                         f"(" + ", ".join(f"{r['ttft_p90_ms']:,.0f}" for r in runs) + f") | {c['ttft1_p50_ms']:,.0f} "
                         f"| {c['itl_mean_ms']:,.1f} | {c['itl_p99_ms']:,.1f} "
                         f"| {sum(r['prefill_legs'] for r in runs):,.0f} | {sum(r['skipped'] for r in runs):,.0f} "
                         f"| {c['prefill_prefilled']:,.0f} | {c['decode_hit_rate']:.3f} | {c['decode_busy_s']:.2f} | {c['decode_step_ms']:.1f} | {c['decode_padding']:.3f} "
                         f"| {sum(r['failed'] for r in runs)} |")
        if "no-skip" in cells and "skip" in cells:
            a, b = cells["no-skip"], cells["skip"]
            lines += ["", f"Ratios no skip / skip (prefix-aware): TTFT p90 {a['ttft_p90_ms'] / b['ttft_p90_ms']:.2f}x, "
                      f"TTFT p50 {a['ttft_p50_ms'] / b['ttft_p50_ms']:.2f}x, ITL p99 {a['itl_p99_ms'] / b['itl_p99_ms']:.2f}x, "
                      f"ITL mean {a['itl_mean_ms'] / b['itl_mean_ms']:.2f}x."]
    lines += ["", f"Failed requests: {sum(r['failed'] for r in records)}; the mocks' step-end lag, at most "
              f"{max(r['lag_share'] for r in records):.1%} of their steps' wall time (the scaled figures hold while "
              "this is small). P/D runs: every decode leg pulled its blocks, no prefill engine held a block at the end."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
