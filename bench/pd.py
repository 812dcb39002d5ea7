#!/usr/bin/env python3
"""Prefill/decode disaggregation against co-located engines, at equal engine count, on the simulator.

Run through bench/pd.sh (it documents the knobs). Two parts, each run --repeats times with fresh processes:

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

Rows whose dplb lacks P/D mode (no --prefill in dplb --help) are skipped with a note, so that the script runs
before P/D mode lands (the co-located rows alone). Every run also checks the P/D bookkeeping: every decode leg
pulled its blocks (mock_kv_transfers_total = requests, no mock_kv_transfer_errors_total) and no prefill engine
holds a block at the end (mock_kv_blocks_held 0).

Standard library only; every process started here is stopped by its pid, also on errors and Ctrl-C.
"""

import argparse
import statistics
import subprocess
import time

from benchlib import (Process, add_run_arguments, binaries, finish_bench, log, metric_by_engine, metric_sum, quantile,
                      run_cells, scrape, start_bench, start_mock)

POOL = 4  # ranks per pool in P/D; the co-located setup has 2 x POOL
BURST_POLICIES = ("least-inflight", "engine-stats")
# As bench/imbalance.py: requests of a burst per engine-stats refresh period (see REQUESTS_PER_REFRESH there).
REQUESTS_PER_REFRESH = 62


def pd_offered(dplb):
    """True when this dplb has P/D mode (--prefill in its --help)."""
    return "--prefill" in subprocess.run([dplb, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, timeout=30).stdout


def start_router(dplb, args, log_path):
    """A dplb on an ephemeral port with these options: (process, its port)."""
    proc = Process([dplb, "--listen", "127.0.0.1:0", "--log-level", "info"] + args, log_path)
    try:
        port = int(proc.await_line(r"listening on 127\.0\.0\.1:(\d+)").group(1))
    except BaseException:
        proc.stop()
        raise
    return proc, port


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
        real = sum(per_rank(decode[0], decode[1], "mock_real_tokens_total"))
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
            "decode_padding": padded / real if real else 0.0, "lag_share": max(lags)}


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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--parts", default="mixed burst")
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
    parser.add_argument("--dplb-threads", type=int, default=1)
    parser.add_argument("--mock-args", default="", help="more engine options for every mock")
    add_run_arguments(parser, repeats=1)
    opts = parser.parse_args()
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

    def run_one(workdir, part, which, repeat):
        return run_mixed(opts, workdir, which, repeat) if part == "mixed" else run_burst(opts, workdir, which, repeat)

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
                  "(above 1: P/D better); decode padded/real = the decode engines' padded over real batch tokens "
                  "(co-located: all 8 engines). Medians over runs.", "",
                  "| setup | TTFT p50 | TTFT p90 | ITL mean | ITL p99 | output tok/s | decode padded/real | failed |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        cells = {}
        for setup in ("pd", "colocated"):
            runs = [r for r in mixed if r["setup"] == setup]
            if not runs:
                continue
            cells[setup] = {k: med(r[k] for r in runs) for k in ("ttft_p50_ms", "ttft_p90_ms", "itl_mean_ms",
                                                                  "itl_p99_ms", "output_tok_s", "decode_padding")}
            c = cells[setup]
            lines.append(f"| {'P/D 4+4' if setup == 'pd' else 'co-located 8'} | {c['ttft_p50_ms']:,.0f} "
                         f"| {c['ttft_p90_ms']:,.0f} | {c['itl_mean_ms']:,.1f} | {c['itl_p99_ms']:,.1f} "
                         f"| {c['output_tok_s']:,.0f} | {c['decode_padding']:.3f} | {sum(r['failed'] for r in runs)} |")
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
    lines += ["", f"Failed requests: {sum(r['failed'] for r in records)}; the mocks' step-end lag, at most "
              f"{max(r['lag_share'] for r in records):.1%} of their steps' wall time (the scaled figures hold while "
              "this is small). P/D runs: every decode leg pulled its blocks, no prefill engine held a block at the end."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
