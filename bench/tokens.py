#!/usr/bin/env python3
"""least-tokens against least-inflight on a mixed long/short workload, on 4 lockstep or independent ranks.

Run through bench/tokens.sh (it documents the knobs). For each workload, policy and repeat: a fresh simulated
engine (dplb-mock-engine --simulate --dp-lockstep, 4 ranks stepping together as MoE DP ranks), a fresh dplb
with the policy, and one closed-loop client (dplb-bench --max-concurrency, --ignore-eos) whose requests come in
two classes (dplb-bench --long-share): 90% short ones and 10% long ones, drawn from the seed, so both policies
get the same requests in the same order.

Workloads (--workloads):
  prompts           10% with 8,000-word prompts, 90% with 200; 128 output tokens each; streaming.
  prompts-nostream  the same, non-streaming (the response's first byte is then its end).
  outputs           10% with 1,024 output tokens, 90% with 128; 200-word prompts; streaming.
The mock counts one token per prompt word; dplb estimates a text prompt at 4 characters a token, about 1.1
per word of dplb-bench's vocabulary, so its estimate is proportional to the engine's count.

least-tokens counts on a rank the prompt tokens of its requests until their response's first byte and their
max_tokens until their end; least-inflight counts requests. In lockstep the step is as long as the slowest
rank's: its padded decode batch (the number of requests it runs) and its prefill (the longest among the
ranks), so the two policies trade differently: least-inflight evens the batches, least-tokens the token work.

Measured, over the steady window (from --warmup-share to (1 - --warmup-share) of the run, so the ramp-up and
the drain are left out), from every rank's /metrics (the mock's admin port) every 50 ms:
  - max - min over the ranks of the outstanding tokens (the simulator's mock_prompt_tokens_pending +
    mock_decode_tokens_pending: prompt tokens not yet prefilled plus tokens still to generate, over the
    waiting and running requests), of running + waiting, and of the KV-cache tokens held
    (vllm:kv_cache_usage_perc x --kv-blocks x the block size), mean and p95;
  - the engines' output-token throughput in the window (generated tokens / simulated busy time, exact: the
    shared clock's under lockstep, the busiest rank's with independent ranks) and padded / real decode tokens;
  - the client's TTFT mean and p99 (also the short and the long requests' apart, mean and p90, told by their
    prompt length: dplb-bench's per-request input_lens and ttfts) and output tok/s (whole run, read back as
    simulated time), and the prompt
    tokens each rank prefilled (vllm:prompt_tokens_total).
Ratios: least-tokens / least-inflight for throughput, least-inflight / least-tokens for the outstanding-token
max-min and TTFT (above 1: least-tokens better); each run's against the median of least-inflight's runs, all
listed; then seed for seed (run i of both policies had the same requests in the same order), the paired ratios
and their geometric mean, which take out the run-to-run spread that the requests themselves cause
(--require-better: exit 3 unless all three geometric means are above 1); and every run's own figures.

Standard library only; every process started here is stopped by its pid, also on errors and Ctrl-C.
"""

import argparse
import math
import statistics
import time

from benchlib import (GaugeSampler, add_run_arguments, compared_policies, finish_bench, log, metric_sum, quantile,
                      run_cells, scrape, spread, start_bench, start_dplb, start_mock, window, window_throughput)

RANKS = 4


def mock_block_size(mock_args):
    """The engines' KV block size: --block-size in the mock's extra arguments, else the mock's default, 16."""
    args = mock_args.split()
    return int(args[args.index("--block-size") + 1]) if "--block-size" in args[:-1] else 16
POLICIES = "least-inflight least-tokens"
WORKLOADS = {
    "prompts": ["--random-input-len", "200", "--random-output-len", "128", "--long-share", "0.1",
                "--long-input-len", "8000"],
    "prompts-nostream": ["--random-input-len", "200", "--random-output-len", "128", "--long-share", "0.1",
                         "--long-input-len", "8000", "--no-stream"],
    "outputs": ["--random-input-len", "200", "--random-output-len", "128", "--long-share", "0.1",
                "--long-output-len", "1024"],
}


def ttft_by_class(result, time_scale):
    """{"short": {"mean", "p90"}, "long": {...}} of the TTFT (s, simulated) of the requests whose prompt is the
    short length or the long one (dplb-bench's per-request input_lens and ttfts); failed requests left out."""
    lens, ttfts = result.get("input_lens"), result.get("ttfts")
    if not lens or not ttfts:
        return {}
    cut = (min(lens) + max(lens)) / 2
    out = {}
    for name, pick in (("short", lambda n: n <= cut), ("long", lambda n: n > cut)):
        vals = [t * time_scale for n, t in zip(lens, ttfts) if t is not None and pick(n)]
        if vals and min(lens) != max(lens):
            out[name] = {"mean": statistics.fmean(vals), "p90": quantile(vals, 0.9)}
    return out


def run_one(opts, workdir, workload, policy, repeat):
    tag = f"{workload}-{policy}-{repeat}"
    lockstep = ["--dp-lockstep"] if opts.engines == "lockstep" else []
    mock, ports, admin = start_mock(opts.mock, ["--ranks", str(RANKS), "--simulate"] + lockstep + ["--time-scale",
                                                str(opts.time_scale), "--max-num-seqs", str(opts.max_num_seqs),
                                                "--kv-blocks", str(opts.kv_blocks), "--threads", "1"]
                                    + opts.mock_args.split(),
                                    workdir / f"{tag}.mock.log")
    proxy = None
    try:
        proxy, port = start_dplb(opts.dplb, policy, ports, workdir / f"{tag}.dplb.log", ["--threads", "1"])
        sampler = GaugeSampler(admin, RANKS).start()
        started = time.monotonic()
        result_path = workdir / f"{tag}.json"
        client = start_bench(opts.bench, port, WORKLOADS[workload] + [
            "--ignore-eos", "--request-rate", str(opts.request_rate * opts.time_scale), "--max-concurrency", str(opts.concurrency),
            "--num-prompts", str(opts.num_prompts), "--seed", str(opts.seed + repeat)], result_path,
            workdir / f"{tag}.client.log")
        try:
            result = finish_bench(client, result_path)
        finally:
            samples = sampler.stop()
        ended = time.monotonic()
        final = [scrape(f"http://127.0.0.1:{admin}/metrics?rank={r}") for r in range(RANKS)]
        prompt_tokens = [metric_sum(m, "vllm:prompt_tokens_total") for m in final]
        preemptions = sum(metric_sum(m, "vllm:num_preemptions_total") for m in final)
    finally:
        if proxy:
            proxy.stop()
        mock.stop()

    share = opts.warmup_share * (ended - started)
    steady = window(samples, started + share, ended - share)
    stream = "--no-stream" not in WORKLOADS[workload]
    by_class = ttft_by_class(result, opts.time_scale) if stream else {}
    return {
        "workload": workload, "policy": policy, "repeat": repeat, "run_s": ended - started, "samples": len(steady),
        "load_spread": spread(steady, lambda s: [r + w for r, w in zip(s["running"], s["waiting"])]),
        "kv_spread": spread(steady, lambda s: [kv * opts.kv_blocks * mock_block_size(opts.mock_args) for kv in s["kv"]]),
        "outstanding_spread": spread(steady, lambda s: [p + d for p, d in zip(s["prompt_pending"],
                                                                                  s["decode_pending"])]),
        "waiting_max": max((max(s["waiting"]) for s in steady), default=0),
        **window_throughput(steady, own_clocks=opts.engines == "independent"),
        "prompt_tokens": prompt_tokens,
        "preemptions": preemptions,
        "per_rank": [int(result["per_rank"].get(str(r), 0)) for r in range(RANKS)],
        # A client's wall-clock figures, read back as the simulated engine's. Without streaming TTFT is the
        # whole response.
        "client_tok_s": result["output_throughput"] / opts.time_scale,
        "mean_ttft_s": result["mean_ttft_ms"] / 1000 * opts.time_scale if stream else None,
        "p99_ttft_s": result["p99_ttft_ms"] / 1000 * opts.time_scale if stream else None,
        # The short (90%) and long (10%) requests' TTFT apart, mean and p90 (s, simulated).
        "short_ttft_s": by_class.get("short"), "long_ttft_s": by_class.get("long"),
        "mean_e2e_s": result["mean_e2el_ms"] / 1000 * opts.time_scale,
        "failed": result["failed"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--policies", default=POLICIES, help="those this dplb lacks are skipped")
    parser.add_argument("--workloads", default=" ".join(WORKLOADS), help=f"among: {' '.join(WORKLOADS)}")
    parser.add_argument("--concurrency", type=int, default=192, help="the client's requests in flight")
    parser.add_argument("--num-prompts", type=int, default=1920)
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="open loop: Poisson arrivals at this many requests per simulated second (dplb-bench "
                        "--request-rate, times --time-scale), still capped at --concurrency in flight; "
                        "default inf, a closed loop")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--kv-blocks", type=int, default=65536,
                        help="the engines' KV cache per rank, in blocks (of 16 tokens unless --mock-args sets "
                        "--block-size; the default never fills; 4096 = 64 Ki tokens makes the long prompts' KV the limit)")
    parser.add_argument("--time-scale", type=float, default=5.0)
    parser.add_argument("--mock-args", default="", help="more engine options, e.g. '--prefill-us-per-token 120' for "
                        "a prefill-heavy step cost")
    parser.add_argument("--engines", choices=["lockstep", "independent"], default="lockstep",
                        help="lockstep: MoE DP ranks stepping together (each step pads to the largest batch); "
                        "independent: a clock per rank, as the DP ranks of a dense model run")
    parser.add_argument("--warmup-share", type=float, default=0.1, help="of the run, left out at each end")
    parser.add_argument("--require-better", action="store_true",
                        help="exit 3 unless every policy beats least-inflight seed for seed (geometric mean of the "
                        "paired ratios above 1) on max-min outstanding tokens, output tok/s and TTFT mean (prompts-nostream has no "
                        "TTFT, so it cannot pass)")
    add_run_arguments(parser)
    opts = parser.parse_args()
    policies = compared_policies(opts, "tokens")
    workloads = opts.workloads.split()
    for workload in workloads:
        if workload not in WORKLOADS:
            raise SystemExit(f"tokens: unknown workload {workload} (known: {' '.join(WORKLOADS)})")
    cells = [(workload, policy, repeat) for workload in workloads for repeat in range(opts.repeats)
             for policy in policies]
    records = run_cells("tokens", cells, lambda workdir, *cell: run_one(opts, workdir, *cell), opts,
                        lambda records, elapsed: report(opts, workloads, policies, records, elapsed))
    if opts.require_better:
        require_better(workloads, policies, records)


def pair(by_class):
    return f"{by_class['mean']:.2f}, {by_class['p90']:.2f}" if by_class else "-"


def class_cells(cell, policy):
    """The short and long requests' TTFT (medians over runs), and the short ones' ratios to least-inflight's
    median (every run; above 1: the policy better) and the long ones' (median)."""
    med = statistics.median

    def part(p, key, stat):
        vals = [r[key][stat] for r in cell[p] if r.get(key)]
        return med(vals) if vals else None

    cells = []
    for key in ("short_ttft_s", "long_ttft_s"):
        mean, p90 = part(policy, key, "mean"), part(policy, key, "p90")
        cells.append(f"{mean:.2f}, {p90:.2f}" if mean is not None else "-")
    ref, ref90 = part("least-inflight", "short_ttft_s", "mean"), part("least-inflight", "short_ttft_s", "p90")
    each = [ref / r["short_ttft_s"]["mean"] for r in cell[policy] if r.get("short_ttft_s")] if ref else []
    p90 = part(policy, "short_ttft_s", "p90")
    cells.append(f"{med(each):.3f} ({', '.join(f'{e:.3f}' for e in each)}), {ref90 / p90:.3f}" if each else "-")
    long_ref, long_mean = part("least-inflight", "long_ttft_s", "mean"), part(policy, "long_ttft_s", "mean")
    cells.append(f"{long_ref / long_mean:.3f}" if long_ref and long_mean else "-")
    return " | ".join(cells)


PAIRED_MEASURES = (("max-min outstanding", lambda r: r["outstanding_spread"]["mean"], False),
                   ("output tok/s", lambda r: r["output_tok_s"], True),
                   ("TTFT mean", lambda r: r["mean_ttft_s"], False))


def geometric_mean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def paired_ratios(workloads, policies, records):
    """Run i of a policy against run i of least-inflight: the same seed, so the same requests in the same order.
    Run-to-run spread (which long prompts meet, the machine's timing) is as large as the policies' difference,
    and pairing by seed takes out the part the requests cause. Yields (workload, policy, {measure: every pair's
    ratio, above 1: the policy better; None when a run lacks it}, how many pairs are better on all three)."""
    for workload in workloads:
        ref = {r["repeat"]: r for r in records if r["workload"] == workload and r["policy"] == "least-inflight"}
        for policy in policies:
            if policy == "least-inflight":
                continue
            runs = sorted((r for r in records if r["workload"] == workload and r["policy"] == policy
                           and r["repeat"] in ref), key=lambda r: r["repeat"])
            ratios = {}
            for name, get, higher_better in PAIRED_MEASURES:
                pairs = [(get(r), get(ref[r["repeat"]])) for r in runs]
                ratios[name] = (None if not pairs or any(not ours or not theirs for ours, theirs in pairs) else
                                [ours / theirs if higher_better else theirs / ours for ours, theirs in pairs])
            all_three = sum(all(ratios[name] and ratios[name][i] > 1 for name in ratios) for i in range(len(runs)))
            yield workload, policy, ratios, all_three, len(runs)


def paired_lines(workloads, policies, records):
    lines = ["Seed for seed (run i of each policy got the same requests in the same order): paired ratios to "
             "least-inflight, above 1 better; geometric mean (every pair), pairs better.", "",
             "| workload | policy | max-min outstanding | output tok/s | TTFT mean | better on all three |",
             "|---|---|---:|---:|---:|---:|"]
    for workload, policy, ratios, all_three, runs in paired_ratios(workloads, policies, records):
        cells = [f"{geometric_mean(each):.3f} ({', '.join(f'{e:.3f}' for e in each)}), {sum(e > 1 for e in each)} "
                 f"of {len(each)}" if each else "-" for each in ratios.values()]
        lines.append(f"| {workload} | {policy} | {' | '.join(cells)} | {all_three} of {runs} |")
    return lines + [""]


def require_better(workloads, policies, records):
    """--require-better: every compared policy's paired geometric mean above 1 on all three measures, or exit 3."""
    short = [f"{workload}, {policy}: {name} {geometric_mean(each):.3f}" if each else f"{workload}, {policy}: no {name}"
             for workload, policy, ratios, _, _ in paired_ratios(workloads, policies, records)
             for name, each in ratios.items() if not each or geometric_mean(each) <= 1]
    if short:
        log("tokens: not better than least-inflight seed for seed on " + "; ".join(short) +
            " (geometric mean of the paired ratios, above 1 better)")
        raise SystemExit(3)


def report(opts, workloads, policies, records, elapsed):
    med = statistics.median
    lines = [f"# dplb tokens benchmark: {RANKS} {opts.engines} ranks (mock --simulate"
             f"{' --dp-lockstep' if opts.engines == 'lockstep' else ''} --time-scale "
             f"{opts.time_scale:g} --max-num-seqs {opts.max_num_seqs}{(' ' + opts.mock_args) if opts.mock_args else ''}), one "
             + ("closed-loop client with " if opts.request_rate == float("inf") else
                f"open-loop client (Poisson, {opts.request_rate:g} requests per simulated s) with at most ")
             + f"{opts.concurrency} in flight, {opts.num_prompts} requests per run, {opts.repeats} runs per cell, "
             f"{elapsed:.0f} s",
             "",
             "Engines (steady window; medians over runs): max-min over the ranks of the outstanding tokens (prompt "
             "not yet prefilled + tokens still to generate), of running+waiting and of KV tokens held (mean, p95), "
             "output tok/s (simulated), padded/real decode tokens; prompt tokens per rank (x1000). Client: TTFT mean "
             "and p99 (s, simulated; streaming only), mean E2E (s). Ratio: to least-inflight, above 1 better (tok/s: "
             "policy / least-inflight; outstanding max-min, TTFT, E2E: least-inflight / policy), each run's against "
             "the median of least-inflight's.",
             "",
             "| workload | policy | reqs per rank | prompt ktok per rank | max-min outstanding tok mean, p95 "
             "| max-min load mean, p95 | max-min KV tok mean, p95 | output tok/s | padded/real | TTFT mean | TTFT p99 "
             "| E2E mean | outstanding ratio (every run) | tok/s ratio (every run) | TTFT mean ratio (every run), p99 ratio "
             "| E2E ratio | short TTFT mean, p90 | long TTFT mean, p90 | short TTFT mean ratio (every run), p90 ratio "
             "| long TTFT mean ratio |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    out = lines.append
    for workload in workloads:
        cell = {p: [r for r in records if r["workload"] == workload and r["policy"] == p] for p in policies}

        def value(policy, key, part=None):
            vals = [r[key] if part is None else r[key][part] for r in cell[policy] if r[key] is not None]
            return med(vals) if vals else None

        def ratios(runs, key, ref, higher_better, part=None):
            vals = [r[key] if part is None else r[key][part] for r in runs if r[key] is not None]
            if not vals or not ref:
                return "-"
            each = [v / ref if higher_better else (ref / v if v else float("inf")) for v in vals]
            return f"{med(each):.3f} ({', '.join(f'{e:.3f}' for e in each)})"

        for policy in policies:
            runs = cell[policy]
            split = "/".join(str(int(med(r["per_rank"][i] for r in runs))) for i in range(RANKS))
            prompts = "/".join(f"{med(r['prompt_tokens'][i] for r in runs) / 1000:.0f}" for i in range(RANKS))
            tput = value(policy, "output_tok_s")
            ttft, ttft99, e2e = value(policy, "mean_ttft_s"), value(policy, "p99_ttft_s"), value(policy, "mean_e2e_s")
            ref_ttft99 = value("least-inflight", "p99_ttft_s")
            ttft_text = f"{ttft:.2f} | {ttft99:.2f}" if ttft is not None else "- | -"
            ttft_ratio = (f"{ratios(runs, 'mean_ttft_s', value('least-inflight', 'mean_ttft_s'), False)}, "
                          f"{ref_ttft99 / ttft99:.3f}") if ttft is not None else "-"
            out(f"| {workload} | {policy} | {split} | {prompts} "
                f"| {value(policy, 'outstanding_spread', 'mean'):,.0f}, {value(policy, 'outstanding_spread', 'p95'):,.0f} "
                f"| {value(policy, 'load_spread', 'mean'):.1f}, {value(policy, 'load_spread', 'p95'):.0f} "
                f"| {value(policy, 'kv_spread', 'mean'):,.0f}, {value(policy, 'kv_spread', 'p95'):,.0f} "
                f"| {tput:,.0f} | {value(policy, 'padding'):.3f} | {ttft_text} | {e2e:.2f} "
                f"| {ratios(runs, 'outstanding_spread', value('least-inflight', 'outstanding_spread', 'mean'), False, 'mean')} "
                f"| {ratios(runs, 'output_tok_s', value('least-inflight', 'output_tok_s'), True)} | {ttft_ratio} "
                f"| {value('least-inflight', 'mean_e2e_s') / e2e:.3f} | {class_cells(cell, policy)} |")
    out("")
    lines.extend(paired_lines(workloads, policies, records))
    out("Every run: max-min outstanding tokens (mean), output tok/s (engines, simulated), client tok/s, TTFT mean "
        "and p99 (s), wall s.")
    out("")
    out("| workload | policy | run | max-min outstanding tok | output tok/s | client tok/s | TTFT mean | TTFT p99 "
        "| short TTFT mean, p90 | long TTFT mean, p90 | wall s |")
    out("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in records:
        ttft = (f"{r['mean_ttft_s']:.2f} | {r['p99_ttft_s']:.2f}" if r["mean_ttft_s"] is not None else "- | -")
        out(f"| {r['workload']} | {r['policy']} | {r['repeat'] + 1} | {r['outstanding_spread']['mean']:,.0f} "
            f"| {r['output_tok_s']:,.0f} | {r['client_tok_s']:,.0f} | {ttft} | {pair(r.get('short_ttft_s'))} "
            f"| {pair(r.get('long_ttft_s'))} | {r['run_s']:.0f} |")
    out("")
    out(f"Failed requests: {sum(r['failed'] for r in records)}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
