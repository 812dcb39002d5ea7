#!/usr/bin/env python3
"""The imbalance benchmark: what each balancing policy costs 4 lockstep MoE DP ranks.

Run through bench/imbalance.sh (it documents the knobs). For every scenario and policy it starts a fresh
simulated engine (dplb-mock-engine --simulate --dp-lockstep: 4 ranks stepping together, each step as long
as the slowest rank's CUDA-graph-padded batch) and a fresh dplb with that policy, sends the load with
dplb-bench, and reads from the engine what the run cost in simulated GPU time.

A burst's t=0 is the moment its last request reaches the engine (mock --start-after N): a burst is N
requests that are all there when the engine steps, as the seed scenario has it, so the simulated cost is the
same for every policy however the requests were delivered. dplb's policy sees the burst as it arrives,
request by request, as it would in production, and the client delivers it the way `vllm bench serve` does:
spread over a few hundred ms (dplb-bench --burst-spread-ms, see burst_spread_ms below), not in the few ms a
C++ client on an idle machine needs. That fixes which stats refreshes the engine-stats baseline sees during
a burst on any machine, instead of leaving it to the race between the client and the refresh timer.

Why simulated time and not wall time: the mock's clock runs --time-scale times faster than the wall, and
its mock_step_seconds_total is the exact simulated busy time of the engine (a burst's makespan), untouched
by how fast this 2-core machine relays bytes. Output-token throughput is therefore
    generated tokens / mock_step_seconds_total
and the ratio to the balanced run is exactly the share of GPU time an imbalance wastes.
Poisson runs are bounded by their arrival rate, not by the engine, so they report the mean end-to-end
latency (simulated: wall x time scale) and the padding the engine ran instead.

Standard library only; every process started here is stopped by its pid, also on errors and Ctrl-C.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import binaries, log, metric_sum, offered_policies, scrape, start_dplb, start_mock, work_directory

RANKS = 4

# The policies compared, dplb's first; offered_policies() skips those this dplb lacks (least-load and
# least-tokens, before they land).
POLICIES = "least-inflight round-robin least-load least-tokens random engine-stats"
# dplb's policies that must split a burst onto idle ranks exactly: a rotation. The run fails otherwise.
EXACT_POLICIES = ("least-inflight", "round-robin")

# Requests of a burst the client delivers per engine-stats refresh period (dplb-bench --burst-spread-ms).
# vllm bench serve's client needs hundreds of ms for 256 requests; 62 per 100 ms (1.6 ms each) spreads a
# 256 burst over 413 ms, so at least 4 fixed-rate refreshes land inside every burst, whatever their phase,
# with at least 3 full periods between them. Why 62: during a held burst (mock --start-after) the engines
# have not stepped, so each refresh resets the baseline's estimate to gauges that count none of the burst,
# and its next picks start again from rank 0. A period of n picks then leaves rank 0 one ahead of rank 3
# unless n is a multiple of the 4 ranks; 62 = 4 * 15 + 2 is as far from one as a count gets, so a period
# a request longer or shorter (timer phase, a late wake-up of this busy machine) still leaves one ahead:
# every 256 burst ends at least 3 apart, past the capture size of 64, on every run and machine.
REQUESTS_PER_REFRESH = 62


def burst_spread_ms(opts, burst):
    """The window a burst of `burst` requests is spread over: REQUESTS_PER_REFRESH per refresh period."""
    return burst * opts.stats_interval_ms / REQUESTS_PER_REFRESH


def run_one(opts, workdir, policy, label, bench_args, start_after=0):
    """One fresh engine + dplb + load; returns the record of the run."""
    tag = f"{label}-{policy}".replace(" ", "_")
    mock, ports, admin = start_mock(opts.mock, ["--ranks", str(RANKS), "--simulate", "--dp-lockstep",
                                                "--time-scale", str(opts.time_scale), "--max-num-seqs", str(opts.max_num_seqs),
                                                "--start-after", str(start_after), "--threads", "1"] + opts.mock_args.split(),
                                    workdir / f"{tag}.mock.log")
    proxy = None
    try:
        proxy, listen_port = start_dplb(opts.dplb, policy, ports, workdir / f"{tag}.dplb.log",
                                        ["--threads", str(opts.dplb_threads), "--stats-interval", f"{opts.stats_interval_ms}ms"])
        result_path = workdir / f"{tag}.json"
        bench = subprocess.run([opts.bench, "--base-url", f"http://127.0.0.1:{listen_port}", "--model", "mock-model",
                                "--random-input-len", str(opts.input_len), "--ignore-eos", "--no-stream", "--quiet",
                                "--result-json", str(result_path), "--timeout-s", "300"]
                               + bench_args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=330)
        if bench.returncode != 0:
            raise RuntimeError(f"dplb-bench failed ({bench.returncode}) for {tag}:\n{bench.stdout}")
        result = json.loads(result_path.read_text())
        engine = {}
        for rank in range(RANKS):
            page = scrape(f"http://127.0.0.1:{admin}/metrics?rank={rank}")
            for name in ("mock_step_seconds_total", "mock_steps_total", "mock_padded_tokens_total",
                         "mock_real_tokens_total", "mock_step_lag_seconds_total", "vllm:generation_tokens_total",
                         "vllm:request_success_total"):
                engine.setdefault(name, []).append(metric_sum(page, name))
    finally:
        if proxy:
            proxy.stop()
        mock.stop()

    per_rank = [int(result["per_rank"].get(str(r), 0)) for r in range(RANKS)]
    served = [int(n) for n in engine["vllm:request_success_total"]]
    if per_rank != served:
        raise RuntimeError(f"{tag}: client saw {per_rank} per rank but the engines served {served}")
    busy = engine["mock_step_seconds_total"][0]  # lockstep: every rank has the same clock
    steps = engine["mock_steps_total"][0]
    lag = engine["mock_step_lag_seconds_total"][0]
    mean_step_wall = busy / opts.time_scale / steps if steps else 0.0
    return {
        "label": label, "policy": policy, "per_rank": per_rank, "max_min": max(per_rank) - min(per_rank),
        "generated_tokens": sum(engine["vllm:generation_tokens_total"]),
        "padded_tokens": sum(engine["mock_padded_tokens_total"]), "real_tokens": sum(engine["mock_real_tokens_total"]),
        "busy_s": busy, "steps": steps,
        "output_tok_s": sum(engine["vllm:generation_tokens_total"]) / busy if busy else 0.0,
        # A client's wall-clock latencies, read back as the simulated engine's.
        "mean_e2e_s": result["mean_e2el_ms"] / 1000 * opts.time_scale,
        "p99_e2e_s": result["p99_e2el_ms"] / 1000 * opts.time_scale,
        "failed": result["failed"],
        # The mock kept up with the time scale while step ends were handled late by a small share of a step.
        "lag_share": (lag / steps) / mean_step_wall if steps and mean_step_wall else 0.0,
    }


def median_run(runs, key):
    """The run whose `key` is the median (the lower one of the middle two for an even count)."""
    ordered = sorted(runs, key=lambda r: r[key])
    return ordered[(len(ordered) - 1) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--policies", default=POLICIES, help="those this dplb lacks are skipped")
    parser.add_argument("--bursts", default="255 256 257 1024")
    parser.add_argument("--rates", default="10 20 30", help="Poisson arrival rates, simulated req/s ('' = none)")
    parser.add_argument("--poisson-prompts", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=512)
    parser.add_argument("--poisson-output-len", type=int, default=256)
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--max-num-seqs", type=int, default=1024)
    parser.add_argument("--stats-interval-ms", type=int, default=100,
                        help="engine-stats' refresh period; vLLM's coordinator publishes every 100 ms")
    parser.add_argument("--dplb-threads", type=int, default=1)
    parser.add_argument("--mock-args", default="", help="more engine options, e.g. '--step-base-us 1000' for a step "
                        "cost dominated by the padded batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results-dir", default="bench/results")
    parser.add_argument("--keep-logs", action="store_true")
    opts = parser.parse_args()

    opts.dplb, opts.mock, opts.bench = binaries(opts.build_dir, "imbalance")
    opts.policies = " ".join(offered_policies(opts.dplb, opts.policies, "imbalance"))
    if "least-inflight" not in opts.policies.split():
        sys.exit("imbalance: the policies must include least-inflight, the balanced reference")

    records = []
    started = time.monotonic()
    with work_directory("imbalance", opts.keep_logs) as workdir:
        for burst in [int(b) for b in opts.bursts.split()]:
            for repeat in range(opts.repeats):
                # Policies alternate within a repeat, so that a slow moment of the machine hits each alike.
                for policy in opts.policies.split():
                    log(f"burst {burst}, {policy}, run {repeat + 1}/{opts.repeats}")
                    rec = run_one(opts, workdir, policy, f"burst {burst}",
                                  ["--num-prompts", str(burst), "--request-rate", "inf",
                                   "--burst-spread-ms", f"{burst_spread_ms(opts, burst):.3f}",
                                   "--random-output-len", str(opts.output_len), "--seed", str(opts.seed + repeat)],
                                  start_after=burst)
                    rec.update(kind="burst", load=burst, repeat=repeat)
                    records.append(rec)
        for rate in [float(r) for r in opts.rates.split()]:
            for repeat in range(opts.repeats):
                for policy in opts.policies.split():
                    log(f"poisson {rate:g} req/s, {policy}, run {repeat + 1}/{opts.repeats}")
                    # The client's clock is the wall: the simulated rate is sent time-scale times faster.
                    rec = run_one(opts, workdir, policy, f"poisson {rate:g}",
                                  ["--num-prompts", str(opts.poisson_prompts),
                                   "--request-rate", str(rate * opts.time_scale),
                                   "--random-output-len", str(opts.poisson_output_len), "--seed", str(opts.seed + repeat)])
                    rec.update(kind="poisson", load=rate, repeat=repeat)
                    records.append(rec)

    results = Path(opts.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    (results / "imbalance.json").write_text(json.dumps({
        "settings": {k: v for k, v in vars(opts).items() if k not in ("dplb", "mock", "bench")},
        "runs": records}, indent=1))
    report(opts, records, results, time.monotonic() - started)


def report(opts, records, results, elapsed):
    lines = []
    out = lines.append
    out(f"# dplb imbalance benchmark: {RANKS} lockstep ranks (mock --simulate --dp-lockstep "
        f"--time-scale {opts.time_scale:g} --max-num-seqs {opts.max_num_seqs}{(' ' + opts.mock_args) if opts.mock_args else ''}), "
        f"engine-stats refreshed every {opts.stats_interval_ms} ms wall, bursts of N spread over "
        f"N x {opts.stats_interval_ms / REQUESTS_PER_REFRESH:.3f} ms wall, {opts.repeats} runs per cell, {elapsed:.0f} s")
    out("")
    out(f"## Bursts: N requests, all present when the engine starts, {opts.input_len} prompt tokens, "
        f"{opts.output_len} output tokens (ignore_eos)")
    out("Output tok/s = generated tokens / simulated engine busy time; ratio = to least-inflight (the balanced run);")
    out("the per-rank split and max-min are those of the median run; max-min (all) lists every run's.")
    out("")
    out("| N | policy | per-rank split | max-min (all) | padded/real tokens | output tok/s | ratio |")
    out("|---:|---|---|---|---:|---:|---:|")
    tsv = ["kind\tload\tpolicy\tratio\tratio_min\tratio_max\tmax_min\tpadding_ratio\tmean_e2e_s"]
    for kind in ("burst", "poisson"):
        loads = sorted({r["load"] for r in records if r["kind"] == kind})
        if kind == "poisson" and loads:
            out("")
            out(f"## Poisson arrivals: {opts.poisson_prompts} requests at R req/s (simulated), "
                f"{opts.input_len} prompt / {opts.poisson_output_len} output tokens")
            out("Mean E2E = mean end-to-end latency in simulated seconds; ratio = least-inflight's mean E2E / this "
                "policy's (below 1: slower).")
            out("")
            out("| R | policy | per-rank split | max-min (all) | padded/real tokens | mean E2E s | ratio |")
            out("|---:|---|---|---|---:|---:|---:|")
        for load in loads:
            cell = {p: [r for r in records if r["kind"] == kind and r["load"] == load and r["policy"] == p]
                    for p in opts.policies.split()}
            key = "output_tok_s" if kind == "burst" else "mean_e2e_s"
            reference = statistics.median(r[key] for r in cell["least-inflight"])
            for policy, runs in cell.items():
                mid = median_run(runs, key)
                ratios = [(r[key] / reference) if kind == "burst" else (reference / r[key]) for r in runs]
                ratio = statistics.median(ratios)
                padding = statistics.median(r["padded_tokens"] / r["real_tokens"] for r in runs)
                split = "/".join(str(n) for n in mid["per_rank"])
                spreads = ",".join(str(r["max_min"]) for r in runs)
                value = f"{statistics.median(r[key] for r in runs):,.0f}" if kind == "burst" \
                    else f"{statistics.median(r[key] for r in runs):.2f}"
                out(f"| {load:g} | {policy} | {split} | {spreads} | {padding:.3f} | {value} | "
                    f"{ratio:.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")
                tsv.append(f"{kind}\t{load:g}\t{policy}\t{ratio:.4f}\t{min(ratios):.4f}\t{max(ratios):.4f}\t"
                           f"{mid['max_min']}\t{padding:.4f}\t{statistics.median(r['mean_e2e_s'] for r in runs):.3f}")
    worst_lag = max(r["lag_share"] for r in records)
    failed = sum(r["failed"] for r in records)
    out("")
    out(f"Mock fidelity: step ends were handled late by at most {worst_lag:.0%} of a mean step (keep it well below "
        f"100%; else lower --time-scale). Failed requests: {failed}.")
    inexact = burst_checks(opts, records, out)
    text = "\n".join(lines) + "\n"
    (results / "imbalance.md").write_text(text)
    (results / "imbalance.tsv").write_text("\n".join(tsv) + "\n")
    print(text, end="")
    if failed or inexact:
        sys.exit(1)


def burst_checks(opts, records, out):
    """Per burst size: whether dplb's policies split it exactly in every run, and how often the engine-stats
    baseline did not. Returns the number of runs in which an EXACT_POLICIES policy was not exact."""
    out("")
    out("## Checks (bursts): exact = max-min 0, or 1 when N is not a multiple of the ranks")
    inexact = 0
    for load in sorted({r["load"] for r in records if r["kind"] == "burst"}):
        best = 0 if load % RANKS == 0 else 1
        for policy in opts.policies.split():
            runs = [r for r in records if r["kind"] == "burst" and r["load"] == load and r["policy"] == policy]
            uneven = sum(r["max_min"] > best for r in runs)
            spreads = ",".join(str(r["max_min"]) for r in runs)
            verdict = f"exact in {len(runs) - uneven}/{len(runs)} runs (max-min {spreads})"
            if policy in EXACT_POLICIES and uneven:
                inexact += uneven
                verdict += " -- FAILED: dplb's policy must split a burst onto idle ranks exactly"
            out(f"- N={load:g} {policy}: {verdict}")
    return inexact


if __name__ == "__main__":
    main()
