#!/usr/bin/env python3
"""Several dplb replicas behind one Service: what stays exact and what becomes approximate (docs/scaling.md).

Run through bench/service.sh. The same 4 simulated lockstep ranks (dplb-mock-engine --simulate --dp-lockstep, MoE
DP ranks stepping together) sit behind one dplb replica, or behind two that each front all 4 ranks, as two pods
behind a Kubernetes Service. A Service balances connections, not requests: each client connection sticks to one
replica. So the load is split over the replicas by clients (one dplb-bench per replica), and the split of a burst
need not be even: kube-proxy picks a replica per connection at random.

Two scenarios, each on fresh engines and replicas, per setup (1 replica least-inflight, the exact reference; 2
replicas least-inflight; 2 replicas least-load, which reads the engines' stats and so sees the other replica's
load up to one stats interval late):
  - burst: N uniform requests all present when the engines start (mock --start-after N), delivered as
    `vllm bench serve` sends a burst, split between the replicas as given by --burst-splits (e.g. 128:128, and
    131:125, about half a standard deviation of a random split of 256). Measured: each engine's request total (its own
    vllm:request_success_total), max - min over the ranks, and padded / real decode tokens of the lockstep steps.
  - steady: two closed-loop clients (or one with both their concurrencies, with one replica), each keeping its
    requests in flight. Measured over the steady window: the engines' running + waiting max - min (mean, p95), the
    engines' request totals max - min at the end, output tokens per second (simulated, exact).
Ratios are against the 1-replica reference. Standard library only; every process is stopped by its pid.
"""

import argparse
import statistics
import time

from benchlib import (GaugeSampler, add_run_arguments, compared_policies, finish_bench, metric_sum, run_cells, scrape,
                      spread, start_bench, start_dplb, start_mock, window, window_throughput)

RANKS = 4
SETUPS = [("1 replica", 1, "least-inflight"), ("2 replicas", 2, "least-inflight"), ("2 replicas", 2, "least-load")]


def engine_totals(admin):
    return [int(metric_sum(scrape(f"http://127.0.0.1:{admin}/metrics?rank={r}"), "vllm:request_success_total"))
            for r in range(RANKS)]


def run_one(opts, workdir, scenario, setup, repeat):
    label, replicas, policy = setup
    tag = f"{scenario}-{replicas}-{policy}-{repeat}"
    if scenario.startswith("burst"):
        shares = [int(s) for s in scenario.split(" ")[1].split(":")]
        if replicas == 1:
            shares = [sum(shares)]
        mock_extra = ["--start-after", str(sum(shares))]
    else:
        shares = [opts.concurrency] * 2 if replicas == 2 else [2 * opts.concurrency]
        mock_extra = []
    mock, ports, admin = start_mock(opts.mock, ["--ranks", str(RANKS), "--simulate", "--dp-lockstep", "--time-scale",
                                                str(opts.time_scale), "--max-num-seqs", str(opts.max_num_seqs),
                                                "--threads", "1"] + mock_extra, workdir / f"{tag}.mock.log")
    procs = []
    try:
        ports_of = []
        for i in range(replicas):
            replica, port = start_dplb(opts.dplb, policy, ports, workdir / f"{tag}.dplb-{i}.log",
                                       ["--threads", "1", "--stats-interval", f"{opts.stats_interval_ms}ms"])
            procs.append(replica)
            ports_of.append(port)
        time.sleep(3 * opts.stats_interval_ms / 1000)  # the first stats reads are in
        sampler = GaugeSampler(admin, RANKS).start()
        common = ["--random-input-len", str(opts.input_len), "--random-output-len", str(opts.output_len),
                  "--ignore-eos", "--request-rate", "inf", "--seed", str(opts.seed + repeat)]
        clients = []
        started = time.monotonic()
        for i, share in enumerate(shares):
            if scenario.startswith("burst"):
                # vllm bench serve's pace for a burst (bench/imbalance.py): 1.613 ms a request, both clients at once.
                load = ["--num-prompts", str(share), "--burst-spread-ms", f"{share * 1.613:.3f}"]
            else:
                load = ["--num-prompts", str(share * opts.waves), "--max-concurrency", str(share)]
            result = workdir / f"{tag}.client-{i}.json"
            proc = start_bench(opts.bench, ports_of[i % replicas], common + load, result, workdir / f"{tag}.client-{i}.log")
            procs.append(proc)
            clients.append((proc, result))
        first_done = None
        while any(p.proc.poll() is None for p, _ in clients):
            if first_done is None and any(p.proc.poll() is not None for p, _ in clients):
                first_done = time.monotonic()
            time.sleep(0.05)
        first_done = first_done or time.monotonic()
        samples = sampler.stop()
        results = [finish_bench(proc, path) for proc, path in clients]
        totals = engine_totals(admin)
    finally:
        for proc in reversed(procs):
            proc.stop()
        mock.stop()
    record = {"scenario": scenario, "setup": label, "replicas": replicas, "policy": policy, "repeat": repeat,
              "shares": shares, "totals": totals, "totals_spread": max(totals) - min(totals),
              "failed": sum(r["failed"] for r in results)}
    if scenario.startswith("burst"):
        record.update(window_throughput(samples))
    else:
        steady = window(samples, started + 0.1 * (first_done - started), first_done)
        record.update(window_throughput(steady))
        record["load_spread"] = spread(steady, lambda s: [r + w for r, w in zip(s["running"], s["waiting"])])
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--policies", default="least-inflight least-load", help="those this dplb lacks are skipped")
    parser.add_argument("--burst-splits", default="128:128 129:127 131:125", help="how each burst is split over 2 replicas")
    parser.add_argument("--concurrency", type=int, default=96, help="steady: each replica's client's requests in flight")
    parser.add_argument("--waves", type=int, default=8, help="steady: each client sends waves x its concurrency")
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=1024)
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--stats-interval-ms", type=int, default=100)
    parser.add_argument("--no-steady", action="store_true", help="bursts only")
    add_run_arguments(parser, repeats=2)
    opts = parser.parse_args()
    policies = compared_policies(opts, "service")
    setups = [s for s in SETUPS if s[2] in policies]
    scenarios = [f"burst {split}" for split in opts.burst_splits.split()] + ([] if opts.no_steady else ["steady"])
    cells = [(scenario, setup, repeat) for repeat in range(opts.repeats) for scenario in scenarios for setup in setups]
    run_cells("service", cells, lambda workdir, scenario, setup, repeat: run_one(opts, workdir, scenario, setup, repeat),
              opts, lambda records, elapsed: report(opts, scenarios, setups, records, elapsed))


def report(opts, scenarios, setups, records, elapsed):
    med = statistics.median
    out = []
    out.append(f"# dplb behind a Service: 1 or 2 replicas in front of {RANKS} lockstep ranks (mock --simulate "
               f"--dp-lockstep --time-scale {opts.time_scale:g} --max-num-seqs {opts.max_num_seqs}); {opts.input_len} "
               f"prompt / {opts.output_len} output tokens; stats every {opts.stats_interval_ms} ms; {opts.repeats} runs "
               f"per cell, {elapsed:.0f} s")
    out.append("")
    out.append("Engine totals: requests each rank's engine served (its own counter), max - min over the ranks, every run. "
               "Output tok/s: simulated, exact; ratio to 1 replica in the same scenario (medians).")
    out.append("")
    out.append("| scenario | setup | policy | per-rank totals (first run) | totals max-min, every run | padded/real | "
               "engines' running+waiting max-min mean / p95 | output tok/s ratio |")
    out.append("|---|---|---|---|---|---:|---|---:|")
    for scenario in scenarios:
        ref = med(r["output_tok_s"] for r in records if r["scenario"] == scenario and r["replicas"] == 1)
        for label, _, policy in setups:
            runs = [r for r in records if r["scenario"] == scenario and r["setup"] == label and r["policy"] == policy]
            if not runs:
                continue
            load = (f"{med(r['load_spread']['mean'] for r in runs):.1f} / {med(r['load_spread']['p95'] for r in runs):.0f}"
                    if "load_spread" in runs[0] else "")
            ratio = f"{med(r['output_tok_s'] for r in runs) / ref:.3f}" if ref else "n/a"
            out.append(f"| {scenario} | {label} | {policy} | {'/'.join(map(str, runs[0]['totals']))} | "
                       f"{','.join(str(r['totals_spread']) for r in runs)} | {med(r['padding'] for r in runs):.3f} | {load} | "
                       f"{ratio} |")
    out.append("")
    out.append(f"Failed requests: {sum(r['failed'] for r in records)}.")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
