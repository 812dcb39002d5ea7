#!/usr/bin/env python3
"""Two dplb replicas in front of the same engines, each fed by its own client: least-load against least-inflight.

Run through bench/replicas.sh (it documents the knobs). For each policy, and each repeat, a fresh simulated
engine (dplb-mock-engine --simulate --dp-lockstep, 4 ranks stepping together as MoE DP ranks, --max-num-seqs
per rank) and two fresh dplb replicas with that policy:

    client A --(max-concurrency CA)--> replica A --> ranks 0, 1         (a team's share of the ranks)
    client B --(max-concurrency CB)--> replica B --> ranks 0, 1, 2, 3   (everyone else)

Neither replica sees the other's requests. Both clients are closed loops (dplb-bench --max-concurrency): each
keeps its share of requests in flight, so what the engines serve per second is set by how the load is split.
Replica B under least-inflight balances only its own count, so it keeps CB/4 on every rank, also on ranks 0
and 1 that already hold CA/2 of A's each: with the defaults (CA 96, CB 128, max-num-seqs 64) ranks 0 and 1
hold 48 + 32 = 80 (64 running, 16 waiting) and ranks 2 and 3 hold 32. Under least-load each replica reads
every rank's running + waiting every 100 ms and counts what exceeds its own in-flight requests there; B then
puts 16 on ranks 0 and 1 and 48 on ranks 2 and 3: 56 everywhere, no queue. In lockstep every step is as long
as the largest padded batch (64 either way here), so the balanced split serves 224 requests a step instead of
192: 17% more tokens per step, less the slightly shorter steps of 56.

Measured, over the steady window (from --warmup-share of the run until the first client has sent all its
requests; the tail where one client runs alone is left out):
  - the engines' own imbalance: max - min over the ranks of running + waiting, read from every rank's
    /metrics (the mock's admin port) every 50 ms: mean and p95 over the window;
  - the engines' output-token throughput in the window: generated tokens / simulated busy time (exact, as in
    bench/imbalance.py), and the padded / real decode tokens;
  - each client's own figures for the whole run (dplb-bench's JSON): output tok/s, TTFT mean and p99, read
    back as simulated time (x time scale), and its per-rank split.
Ratios are least-load / least-inflight (for TTFT: least-inflight / least-load, so above 1 is better for
least-load throughout).

Standard library only; every process started here is stopped by its pid, also on errors and Ctrl-C.
"""

import argparse
import statistics
import time

from benchlib import (GaugeSampler, add_run_arguments, compared_policies, finish_bench, log, run_cells, spread,
                      start_bench, start_dplb, start_mock, window, window_throughput)

RANKS = 4
A_RANKS = 2  # replica A fronts ranks 0 .. A_RANKS-1
POLICIES = "least-inflight least-load"


def run_one(opts, workdir, policy, repeat):
    tag = f"{policy}-{repeat}"
    mock, ports, admin = start_mock(opts.mock, ["--ranks", str(RANKS), "--simulate", "--dp-lockstep", "--time-scale",
                                                str(opts.time_scale), "--max-num-seqs", str(opts.max_num_seqs),
                                                "--threads", "1"], workdir / f"{tag}.mock.log")
    procs = []
    try:
        extra = ["--threads", "1", "--stats-interval", f"{opts.stats_interval_ms}ms"]
        replica_a, port_a = start_dplb(opts.dplb, policy, ports[:A_RANKS], workdir / f"{tag}.dplb-a.log", extra)
        procs.append(replica_a)
        replica_b, port_b = start_dplb(opts.dplb, policy, ports, workdir / f"{tag}.dplb-b.log", extra)
        procs.append(replica_b)
        time.sleep(3 * opts.stats_interval_ms / 1000)  # the first stats reads are in
        sampler = GaugeSampler(admin, RANKS).start()
        common = ["--random-input-len", str(opts.input_len), "--random-output-len", str(opts.output_len),
                  "--ignore-eos", "--request-rate", "inf", "--seed", str(opts.seed + repeat)]
        clients = {}
        started = time.monotonic()
        for name, port, concurrency in (("A", port_a, opts.concurrency_a), ("B", port_b, opts.concurrency_b)):
            prompts = concurrency * opts.waves
            result = workdir / f"{tag}.client-{name.lower()}.json"
            proc = start_bench(opts.bench, port, common + ["--num-prompts", str(prompts), "--max-concurrency",
                                                           str(concurrency)], result, workdir / f"{tag}.client-{name.lower()}.log")
            procs.append(proc)
            clients[name] = (proc, result)
        first_done = None
        while any(p.proc.poll() is None for p, _ in clients.values()):
            if first_done is None and any(p.proc.poll() is not None for p, _ in clients.values()):
                first_done = time.monotonic()
            time.sleep(0.05)
        first_done = first_done or time.monotonic()
        samples = sampler.stop()
        results = {name: finish_bench(proc, path) for name, (proc, path) in clients.items()}
    finally:
        for proc in reversed(procs):
            proc.stop()
        mock.stop()

    steady = window(samples, started + opts.warmup_share * (first_done - started), first_done)
    record = {"policy": policy, "repeat": repeat, "window_s": first_done - started, "samples": len(steady),
              "load_spread": spread(steady, lambda s: [r + w for r, w in zip(s["running"], s["waiting"])]),
              "waiting_max": max((max(s["waiting"]) for s in steady), default=0),
              "mean_load": [statistics.mean(s["running"][r] + s["waiting"][r] for s in steady) if steady else 0
                            for r in range(RANKS)],
              **window_throughput(steady), "failed": 0}
    for name, result in results.items():
        record[f"client_{name}"] = {
            "per_rank": [int(result["per_rank"].get(str(r), 0)) for r in range(A_RANKS if name == "A" else RANKS)],
            # A client's wall-clock figures, read back as the simulated engine's.
            "output_tok_s": result["output_throughput"] / opts.time_scale,
            "mean_ttft_s": result["mean_ttft_ms"] / 1000 * opts.time_scale,
            "p99_ttft_s": result["p99_ttft_ms"] / 1000 * opts.time_scale,
        }
        record["failed"] += result["failed"]
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--policies", default=POLICIES, help="those this dplb lacks are skipped")
    parser.add_argument("--concurrency-a", type=int, default=96, help="client A's requests in flight (replica A)")
    parser.add_argument("--concurrency-b", type=int, default=128, help="client B's requests in flight (replica B)")
    parser.add_argument("--waves", type=int, default=12, help="each client sends waves x its concurrency requests")
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--time-scale", type=float, default=2.0)
    parser.add_argument("--stats-interval-ms", type=int, default=100)
    parser.add_argument("--warmup-share", type=float, default=0.1, help="of the window, left out at its start")
    add_run_arguments(parser)
    opts = parser.parse_args()
    policies = compared_policies(opts, "replicas")
    cells = [(policy, repeat) for repeat in range(opts.repeats) for policy in policies]
    run_cells("replicas", cells, lambda workdir, policy, repeat: run_one(opts, workdir, policy, repeat), opts,
              lambda records, elapsed: report(opts, policies, records, elapsed))


def report(opts, policies, records, elapsed):
    med = statistics.median
    lines = [f"# dplb replicas benchmark: {RANKS} lockstep ranks (mock --simulate --dp-lockstep --time-scale "
             f"{opts.time_scale:g} --max-num-seqs {opts.max_num_seqs}); replica A -> ranks 0-{A_RANKS - 1} "
             f"(client A, {opts.concurrency_a} in flight), replica B -> ranks 0-{RANKS - 1} (client B, "
             f"{opts.concurrency_b} in flight); {opts.input_len} prompt / {opts.output_len} output tokens, "
             f"streaming; stats every {opts.stats_interval_ms} ms; {opts.repeats} runs per policy, {elapsed:.0f} s",
             "",
             "Engines (steady window): max-min of running+waiting over the ranks (mean, p95), mean load per rank, "
             "most waiting on a rank, output tok/s (simulated) and padded/real decode tokens. Medians over runs.",
             "",
             "| policy | max-min mean | max-min p95 | mean load per rank | max waiting | output tok/s | padded/real | ratio |",
             "|---|---:|---:|---|---:|---:|---:|---:|"]
    out = lines.append
    ref = med(r["output_tok_s"] for r in records if r["policy"] == "least-inflight")
    for policy in policies:
        runs = [r for r in records if r["policy"] == policy]
        load = "/".join(f"{med(r['mean_load'][i] for r in runs):.0f}" for i in range(RANKS))
        tput = med(r["output_tok_s"] for r in runs)
        each = ", ".join(f"{r['output_tok_s'] / ref:.3f}" for r in runs)
        out(f"| {policy} | {med(r['load_spread']['mean'] for r in runs):.1f} | {med(r['load_spread']['p95'] for r in runs):.0f} "
            f"| {load} | {med(r['waiting_max'] for r in runs):.0f} | {tput:,.0f} | {med(r['padding'] for r in runs):.3f} "
            f"| {tput / ref:.3f} ({each}) |")
    out("")
    out("Clients (whole run, simulated time): output tok/s, TTFT mean and p99 (s), per-rank split of the requests; "
        "ratio = least-load / least-inflight for tok/s, least-inflight / least-load for TTFT (above 1: least-load better).")
    out("")
    out("| client | policy | per-rank split | output tok/s | TTFT mean s | TTFT p99 s | tok/s ratio | TTFT mean ratio | TTFT p99 ratio |")
    out("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for name in ("A", "B"):
        key = f"client_{name}"
        base = {k: med(r[key][k] for r in records if r["policy"] == "least-inflight")
                for k in ("output_tok_s", "mean_ttft_s", "p99_ttft_s")}
        for policy in policies:
            runs = [r[key] for r in records if r["policy"] == policy]
            split = "/".join(str(int(med(c["per_rank"][i] for c in runs))) for i in range(len(runs[0]["per_rank"])))
            v = {k: med(c[k] for c in runs) for k in base}
            out(f"| {name} | {policy} | {split} | {v['output_tok_s']:,.0f} | {v['mean_ttft_s']:.2f} | {v['p99_ttft_s']:.2f} "
                f"| {v['output_tok_s'] / base['output_tok_s']:.3f} | {base['mean_ttft_s'] / v['mean_ttft_s']:.3f} "
                f"| {base['p99_ttft_s'] / v['p99_ttft_s']:.3f} |")
    out("")
    windows = ", ".join(f"{r['policy']} {r['window_s']:.0f} s ({r['samples']} samples)" for r in records)
    out(f"Steady windows (wall): {windows}. Failed requests: {sum(r['failed'] for r in records)}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
