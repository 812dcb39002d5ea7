#!/usr/bin/env python3
"""Several dplb replicas behind one Service, each counting alone or all sharing one ledger in Redis
(--shared-state): what stays exact and what becomes approximate (docs/scaling.md).

Run through bench/service.sh. The same 4 simulated lockstep ranks (dplb-mock-engine --simulate --dp-lockstep, MoE
DP ranks stepping together) sit behind one dplb replica, or behind two or three that each front all 4 ranks, as
pods behind a Kubernetes Service. A Service balances connections, not requests: each client connection sticks to
one replica. So the load is split over the replicas by clients (one dplb-bench per replica), and the split of a
burst need not be even: kube-proxy picks a replica per connection at random.

The setups (--setups, each with the policies of --policies it lists): 1 replica least-inflight, the exact
reference; 2 replicas least-inflight and least-load (which reads the engines' stats and so sees the other
replica's load up to one stats interval late); 3 replicas least-inflight; and each of the multi-replica ones again
"+ shared ledger": its replicas run with --shared-state against a redis-server of the cell's own (a free loopback
port, no persistence), so that every pick is one atomic step over every replica's counts. A shared-ledger cell
starts its burst only once every replica's dplb_shared_state_up is 1 (bounded wait; else the cell fails, named).

The scenarios, each on fresh engines, replicas and Redis:
  - burst: N uniform requests all present when the engines start (mock --start-after N), delivered as
    `vllm bench serve` sends a burst, split between the replicas as given by --burst-splits (a split of k parts
    runs on the setups of k replicas, and on 1 replica as one burst of the same size; e.g. 128:128, 131:125 about
    half a standard deviation of a random split of 256, 90:87:79 a split over 3). Measured: each engine's request
    total (its own vllm:request_success_total), max - min over the ranks, and padded / real decode tokens of the
    lockstep steps. Exact: max - min 0 (1 when the burst does not divide by the ranks).
  - random splits (--random-splits N): N bursts of --burst-size split over the replicas as a Service's random
    connection choice splits them (each request to a replica drawn uniformly, seeded: a binomial split over 2,
    multinomial over 3; the same N splits for every setup of as many replicas). Reported per setup: how many
    landed exactly, the worst and mean max - min, padded/real and the lockstep throughput against 1 replica.
  - steady: closed-loop clients, one per replica, 2 x --concurrency requests in flight in all, each keeping its
    share in flight. Measured over the steady window: the engines' running + waiting max - min (mean, p95), the
    engines' request totals max - min at the end, output tokens per second (simulated, exact).
  - the ledger's pick: every shared-ledger replica's dplb_shared_state_pick_seconds (the round trip of each pick)
    and dplb_shared_state_errors_total are read before it stops; p50/p99 are estimated from the histogram's
    buckets summed over the replicas and the cells of a setup (linear within a bucket, as Prometheus does).
  - throughput (--throughput-prompts P, 0: off): one replica, and two, least-inflight in front of 4 plain mock ranks
    answering at once (no simulation, 1-token non-streaming completions), each fed by a closed-loop dplb-bench
    sending P requests; requests per second per replica, with and without the shared ledger, alternately over
    --throughput-rounds rounds (a slow moment of the machine hits both alike). Everything shares this machine's
    cores (engines, replicas, clients, Redis): the ratio is the figure, not the absolute rate.
  - sequential (--sequential-prompts P, 0: off): the same, each client with one request in flight at a time, so
    that a pick never waits behind another: the latency the ledger adds to a request (the clients' end-to-end
    p50/p99 with the ledger less without it), next to the pick histogram of these cells alone.
Ratios are against the 1-replica reference. With --require-exact the run exits 1 when a shared-ledger burst was not
exact (the smoke's check). Standard library only; every process is stopped by its pid.
"""

import argparse
import itertools
import math
import random
import shutil
import statistics
import subprocess
import time
from collections import namedtuple

from benchlib import (GaugeSampler, add_buckets, add_run_arguments, compared_policies, finish_bench,
                      histogram_buckets, histogram_quantile, labelled_sum, log, metric_sum, run_cells, scrape,
                      scrape_until, spread, start_bench, start_dplb, start_mock, start_redis, window,
                      window_throughput)

RANKS = 4
PICK_HISTOGRAM = "dplb_shared_state_pick_seconds"
LEDGER_OPS = ("connect", "pick", "release", "register", "view", "bucket")


class Setup(namedtuple("Setup", "replicas policy shared")):
    """How many replicas, with which policy, counting alone or through one shared ledger."""

    @property
    def label(self):
        return ("1 replica" if self.replicas == 1 else f"{self.replicas} replicas") + (" + shared ledger" if self.shared else "")

    @property
    def key(self):
        """Its name in --setups."""
        return f"{self.replicas}{'+shared' if self.shared else ''}"

    def __str__(self):
        return f"{self.label} {self.policy}"


SETUPS = [Setup(1, "least-inflight", False), Setup(1, "least-inflight", True),
          Setup(2, "least-inflight", False), Setup(2, "least-inflight", True),
          Setup(2, "least-load", False), Setup(2, "least-load", True),
          Setup(3, "least-inflight", False), Setup(3, "least-inflight", True)]


class LedgerDown(RuntimeError):
    """A shared-ledger replica did not report the ledger up in time: the cell cannot measure the ledger."""


def engine_totals(admin):
    return [int(metric_sum(scrape(f"http://127.0.0.1:{admin}/metrics?rank={r}"), "vllm:request_success_total"))
            for r in range(RANKS)]


def random_split(opts, index, replicas):
    """The index-th random split of a --burst-size burst over `replicas`: each request's replica drawn uniformly,
    as a Service spreads connections; seeded, and the same for every setup of as many replicas."""
    rng = random.Random(f"{opts.seed}-{index}-{replicas}")
    shares = [0] * replicas
    for _ in range(opts.burst_size):
        shares[rng.randrange(replicas)] += 1
    return shares


def burst_shares(opts, scenario, setup):
    """The requests each replica's client sends in a burst scenario ("burst 129:127" or "random 7")."""
    kind, which = scenario.split(" ")
    shares = random_split(opts, int(which), setup.replicas) if kind == "random" else [int(s) for s in which.split(":")]
    return [sum(shares)] if setup.replicas == 1 else shares


def applies(scenario, setup):
    """A fixed split runs on the setups of as many replicas (and on 1 replica, whole); random splits and steady on
    every multi-replica setup (steady on 1 replica too)."""
    kind, _, which = scenario.partition(" ")
    if kind == "burst":
        return setup.replicas in (1, len(which.split(":")))
    if kind == "random":
        return setup.replicas > 1
    return True


def exact_bound(total):
    """The least max - min a burst of `total` requests can land with on RANKS ranks."""
    return 0 if total % RANKS == 0 else 1


class Cell:
    """The processes of one cell: a mock engine, a Redis for a shared-ledger setup, the replicas; stopped by their
    pids on leaving, the replicas first and Redis last (so no replica loses the ledger while it still serves)."""

    def __init__(self, opts, workdir, tag, setup, mock_args):
        self.opts, self.workdir, self.tag, self.setup, self.mock_args = opts, workdir, tag, setup, mock_args
        self.redis = self.mock = None
        self.procs = []
        self.ports = []

    def __enter__(self):
        try:
            self.mock, backends, self.admin = start_mock(self.opts.mock, self.mock_args, self.workdir / f"{self.tag}.mock.log")
            extra = ["--threads", "1", "--stats-interval", f"{self.opts.stats_interval_ms}ms"]
            if self.setup.shared:
                self.redis, redis_port = start_redis(self.workdir / f"{self.tag}.redis.log")
                extra += ["--shared-state", f"redis://127.0.0.1:{redis_port}"]
                if self.opts.ledger_timeout_ms:
                    extra += ["--shared-state-timeout-ms", str(self.opts.ledger_timeout_ms)]
            for i in range(self.setup.replicas):
                names = ["--replica-name", f"replica-{i}"] if self.setup.shared else []
                replica, port = start_dplb(self.opts.dplb, self.setup.policy, backends,
                                           self.workdir / f"{self.tag}.dplb-{i}.log", extra + names)
                self.procs.append(replica)
                self.ports.append(port)
            if self.setup.shared:
                self.await_ledger()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_):
        for proc in reversed(self.procs):
            proc.stop()
        for proc in (self.mock, self.redis):
            if proc:
                proc.stop()

    def metrics(self, i):
        return scrape(f"http://127.0.0.1:{self.ports[i]}/metrics")

    def await_ledger(self):
        """Every replica reports the ledger up (bounded); else LedgerDown naming those that do not."""
        down = [i for i in range(self.setup.replicas)
                if metric_sum(scrape_until(f"http://127.0.0.1:{self.ports[i]}/metrics",
                                           lambda text: metric_sum(text, "dplb_shared_state_up") == 1,
                                           self.opts.ledger_wait_s), "dplb_shared_state_up") != 1]
        if down:
            raise LedgerDown(f"{self.tag}: dplb_shared_state_up not 1 within {self.opts.ledger_wait_s:g} s on "
                             f"replica(s) {down}" + (f" (logs in {self.workdir})" if self.opts.keep_logs else
                                                       " (--keep-logs keeps the logs)"))

    def ledger_figures(self):
        """The shared ledger as the replicas saw it: their pick histograms summed, errors by op, replicas seen."""
        buckets, errors, seen = [], {op: 0 for op in LEDGER_OPS}, []
        for i in range(self.setup.replicas):
            text = self.metrics(i)
            buckets = add_buckets(buckets, histogram_buckets(text, PICK_HISTOGRAM))
            for op in LEDGER_OPS:
                errors[op] += int(labelled_sum(text, "dplb_shared_state_errors_total", f'op="{op}"'))
            seen.append(int(metric_sum(text, "dplb_shared_state_replicas")))
        # Bounds as Prometheus writes them ("+Inf" last), so that the results file stays strict JSON.
        return {"pick_buckets": [["+Inf" if math.isinf(bound) else f"{bound:g}", count] for bound, count in buckets],
                "ledger_errors": errors, "replicas_seen": seen}


def run_one(opts, workdir, scenario, setup, repeat):
    tag = f"{scenario}-{setup.key}-{setup.policy}-{repeat}".replace(" ", "_").replace(":", "_")
    record = {"scenario": scenario, "setup": setup.label, "replicas": setup.replicas, "policy": setup.policy,
              "shared": setup.shared, "repeat": repeat}
    try:
        if scenario in ("throughput", "sequential"):
            record.update(run_requests(opts, workdir, tag, setup, scenario))
        else:
            record.update(run_load(opts, workdir, tag, scenario, setup, repeat))
    except LedgerDown as down:
        log(f"service: cell failed: {down}")
        record.update({"error": str(down), "failed": 1})
    return record


def run_load(opts, workdir, tag, scenario, setup, repeat):
    burst = scenario != "steady"
    if burst:
        shares = burst_shares(opts, scenario, setup)
        mock_extra = ["--start-after", str(sum(shares))]
    else:
        total = 2 * opts.concurrency
        shares = [total // setup.replicas + (1 if i < total % setup.replicas else 0) for i in range(setup.replicas)]
        mock_extra = []
    mock_args = ["--ranks", str(RANKS), "--simulate", "--dp-lockstep", "--time-scale", str(opts.time_scale),
                 "--max-num-seqs", str(opts.max_num_seqs), "--threads", "1"] + mock_extra
    with Cell(opts, workdir, tag, setup, mock_args) as cell:
        time.sleep(3 * opts.stats_interval_ms / 1000)  # the first stats reads are in
        sampler = GaugeSampler(cell.admin, RANKS).start()
        common = ["--random-input-len", str(opts.input_len), "--random-output-len", str(opts.output_len),
                  "--ignore-eos", "--request-rate", "inf", "--seed", str(opts.seed + repeat)]
        clients = []
        started = time.monotonic()
        try:
            for i, share in enumerate(shares):
                if share == 0:
                    continue
                if burst:
                    # vllm bench serve's pace for a burst (bench/imbalance.py): 1.613 ms a request, all clients at once.
                    load = ["--num-prompts", str(share), "--burst-spread-ms", f"{share * 1.613:.3f}"]
                else:
                    load = ["--num-prompts", str(share * opts.waves), "--max-concurrency", str(share)]
                result = workdir / f"{tag}.client-{i}.json"
                clients.append((start_bench(opts.bench, cell.ports[i], common + load, result,
                                            workdir / f"{tag}.client-{i}.log"), result))
            first_done = None
            while any(p.proc.poll() is None for p, _ in clients):
                if first_done is None and any(p.proc.poll() is not None for p, _ in clients):
                    first_done = time.monotonic()
                time.sleep(0.05)
            first_done = first_done or time.monotonic()
        finally:
            samples = sampler.stop()
            for proc, _ in clients:
                proc.stop()
        results = [finish_bench(proc, path) for proc, path in clients]
        totals = engine_totals(cell.admin)
        ledger = cell.ledger_figures() if setup.shared else {}
    record = {"shares": shares, "totals": totals, "totals_spread": max(totals) - min(totals),
              "failed": sum(r["failed"] for r in results), **ledger}
    if burst:
        record["exact"] = record["totals_spread"] <= exact_bound(sum(shares))
        record.update(window_throughput(samples))
    else:
        steady = window(samples, started + 0.1 * (first_done - started), first_done)
        record.update(window_throughput(steady))
        record["load_spread"] = spread(steady, lambda s: [r + w for r, w in zip(s["running"], s["waiting"])])
    return record


def run_requests(opts, workdir, tag, setup, scenario):
    """Requests per second and end-to-end latency through each replica, in front of plain mock ranks answering at
    once: many requests in flight (throughput) or one at a time (sequential)."""
    prompts, concurrency = ((opts.throughput_prompts, opts.throughput_concurrency) if scenario == "throughput"
                            else (opts.sequential_prompts, 1))
    with Cell(opts, workdir, tag, setup, ["--ranks", str(RANKS), "--threads", "1"]) as cell:
        load = ["--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
                "--no-stream", "--random-input-len", "16", "--random-output-len", "1", "--seed", str(opts.seed)]
        clients = []
        try:
            for i, port in enumerate(cell.ports):
                result = workdir / f"{tag}.client-{i}.json"
                clients.append((start_bench(opts.bench, port, load, result, workdir / f"{tag}.client-{i}.log"), result))
            results = [finish_bench(proc, path) for proc, path in clients]
        finally:
            for proc, _ in clients:
                proc.stop()
        ledger = cell.ledger_figures() if setup.shared else {}
    return {"rps": [r["request_throughput"] for r in results], "e2el_p50_ms": [r["median_e2el_ms"] for r in results],
            "e2el_p99_ms": [r["p99_e2el_ms"] for r in results], "failed": sum(r["failed"] for r in results), **ledger}


def chosen_setups(opts, policies):
    keys = opts.setups.split()
    unknown = set(keys) - {s.key for s in SETUPS}
    if unknown:
        raise SystemExit(f"service: unknown --setups {sorted(unknown)}; known: {sorted({s.key for s in SETUPS})}")
    setups = [s for s in SETUPS if s.key in keys and s.policy in policies]
    if any(s.shared for s in setups):
        if not shutil.which("redis-server"):
            raise SystemExit("service: the shared-ledger setups need redis-server (Debian redis-server); "
                             "leave them out of --setups to run without")
        helptext = subprocess.run([opts.dplb, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=30).stdout
        if "--shared-state" not in helptext:
            raise SystemExit(f"service: {opts.dplb} has no --shared-state; leave the +shared setups out of --setups")
    return setups


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--policies", default="least-inflight least-load", help="those this dplb lacks are skipped")
    parser.add_argument("--setups", default=" ".join(dict.fromkeys(s.key for s in SETUPS)),
                        help="which setups run: replicas, +shared for the shared ledger (default: all)")
    parser.add_argument("--burst-splits", default="128:128 129:127 131:125 86:85:85 90:87:79",
                        help="how each burst is split over the replicas (k parts: the setups of k replicas)")
    parser.add_argument("--random-splits", type=int, default=50, help="this many random splits of a burst per setup")
    parser.add_argument("--burst-size", type=int, default=256, help="requests in each random split's burst")
    parser.add_argument("--concurrency", type=int, default=96, help="steady: half the requests in flight in all")
    parser.add_argument("--waves", type=int, default=8, help="steady: each client sends waves x its concurrency")
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=1024)
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--stats-interval-ms", type=int, default=100)
    parser.add_argument("--no-steady", action="store_true", help="bursts only")
    parser.add_argument("--ledger-wait-s", type=float, default=10.0,
                        help="a shared-ledger cell fails unless every replica has the ledger up within this")
    parser.add_argument("--ledger-timeout-ms", type=int, default=0,
                        help="the replicas' --shared-state-timeout-ms (0: dplb's default)")
    parser.add_argument("--throughput-prompts", type=int, default=20000,
                        help="requests per replica in the throughput run (0: no throughput run)")
    parser.add_argument("--throughput-concurrency", type=int, default=32, help="each throughput client's requests in flight")
    parser.add_argument("--throughput-rounds", type=int, default=3, help="rounds of the throughput and sequential runs")
    parser.add_argument("--sequential-prompts", type=int, default=3000,
                        help="requests per replica, one at a time, in the sequential run (0: no sequential run)")
    parser.add_argument("--require-exact", action="store_true", help="exit 1 if a shared-ledger burst was not exact")
    add_run_arguments(parser, repeats=2)
    opts = parser.parse_args()
    policies = compared_policies(opts, "service")
    setups = chosen_setups(opts, policies)
    scenarios = [f"burst {split}" for split in opts.burst_splits.split()] + ([] if opts.no_steady else ["steady"])
    cells = [(scenario, setup, repeat) for repeat in range(opts.repeats) for scenario in scenarios for setup in setups
             if applies(scenario, setup)]
    # The random splits are repeats of their own: each runs once on every setup, one split after the other.
    cells += [(f"random {k}", setup, 0) for k in range(opts.random_splits) for setup in setups if applies("random", setup)]
    runs = [kind for kind, prompts in (("sequential", opts.sequential_prompts), ("throughput", opts.throughput_prompts))
            if prompts]
    for replicas in (1, 2):  # each alone and with the ledger, when both setups run
        pair = [s for s in setups if s.replicas == replicas and s.policy == "least-inflight"]
        if len(pair) == 2:
            cells += [(kind, setup, round_) for round_ in range(opts.throughput_rounds) for kind in runs for setup in pair]
    records = run_cells("service", cells, lambda workdir, scenario, setup, repeat: run_one(opts, workdir, scenario, setup, repeat),
                        opts, lambda records, elapsed: report(opts, scenarios, setups, records, elapsed))
    inexact = [r for r in records if r["shared"] and r["scenario"].startswith(("burst ", "random ")) and not r.get("exact")]
    if opts.require_exact and inexact:
        raise SystemExit("service: shared-ledger bursts not exact: " + "; ".join(
            f"{r['scenario']} {r['setup']} {r['policy']}: {r.get('error') or '/'.join(map(str, r['totals']))}"
            for r in inexact))


def quantile_ms(buckets, q):
    value = histogram_quantile(buckets, q)
    return "n/a" if value is None else f"{value * 1000:.3f}"


def report(opts, scenarios, setups, records, elapsed):
    med = statistics.median
    measured = [r for r in records if "error" not in r]
    out = []
    out.append(f"# dplb behind a Service: 1, 2 or 3 replicas, alone or sharing one ledger in Redis, in front of {RANKS} "
               f"lockstep ranks (mock --simulate --dp-lockstep --time-scale {opts.time_scale:g} --max-num-seqs "
               f"{opts.max_num_seqs}); {opts.input_len} prompt / {opts.output_len} output tokens; stats every "
               f"{opts.stats_interval_ms} ms; shared-state timeout "
               f"{f'{opts.ledger_timeout_ms} ms' if opts.ledger_timeout_ms else 'default (20 ms)'}; {opts.repeats} runs per "
               f"cell, {opts.random_splits} random splits, {elapsed:.0f} s")
    out.append("")
    out.append("Engine totals: requests each rank's engine served (its own counter), max - min over the ranks, every run. "
               "Output tok/s: simulated, exact; ratio to 1 replica in the same scenario (medians).")
    out.append("")
    out.append("| scenario | setup | policy | per-rank totals (first run) | totals max-min, every run | padded/real | "
               "engines' running+waiting max-min mean / p95 | output tok/s ratio |")
    out.append("|---|---|---|---|---|---:|---|---:|")
    for scenario in scenarios:
        refs = [r["output_tok_s"] for r in measured if r["scenario"] == scenario and r["replicas"] == 1]
        ref = med(refs) if refs else 0
        for setup in setups:
            runs = [r for r in measured if r["scenario"] == scenario and r["setup"] == setup.label and r["policy"] == setup.policy]
            if not runs:
                continue
            load = (f"{med(r['load_spread']['mean'] for r in runs):.1f} / {med(r['load_spread']['p95'] for r in runs):.0f}"
                    if "load_spread" in runs[0] else "")
            ratio = f"{med(r['output_tok_s'] for r in runs) / ref:.3f}" if ref else "n/a"
            out.append(f"| {scenario} | {setup.label} | {setup.policy} | {'/'.join(map(str, runs[0]['totals']))} | "
                       f"{','.join(str(r['totals_spread']) for r in runs)} | {med(r['padding'] for r in runs):.3f} | {load} | "
                       f"{ratio} |")
    out.extend(random_report(opts, setups, measured))
    out.extend(ledger_report(setups, measured))
    out.extend(requests_report(opts, measured))
    out.append("")
    errors = [r for r in records if "error" in r]
    out.append(f"Failed requests: {sum(r['failed'] for r in records if 'error' not in r)}. Failed cells: {len(errors)}"
               + "".join(f"\n- {r['error']}" for r in errors))
    return "\n".join(out) + "\n"


def random_report(opts, setups, measured):
    randoms = [r for r in measured if r["scenario"].startswith("random ")]
    if not randoms:
        return []
    med = statistics.median
    refs = [r["output_tok_s"] for r in measured
            if r["replicas"] == 1 and r["scenario"].startswith("burst ") and sum(r["shares"]) == opts.burst_size]
    ref = med(refs) if refs else 0
    out = ["", f"Random splits: {opts.random_splits} bursts of {opts.burst_size}, each request's replica drawn uniformly "
           f"(seed {opts.seed}; the same splits for every setup of as many replicas). Exact: max-min "
           f"{exact_bound(opts.burst_size)}. Output tok/s ratio: median, against 1 replica's bursts of {opts.burst_size}.",
           "Picks timed out: bursts in which a replica's pick got no answer from the ledger in time "
           "(dplb_shared_state_errors_total{op=\"pick\"}) and was made by that replica's own counts; exact among the "
           "other bursts.",
           "", "| setup | policy | splits (most uneven) | exact | worst max-min | mean max-min | padded/real | "
           "output tok/s ratio | picks timed out in | exact among the rest |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for setup in setups:
        runs = [r for r in randoms if r["setup"] == setup.label and r["policy"] == setup.policy]
        if not runs:
            continue
        uneven = max(runs, key=lambda r: max(r["shares"]) - min(r["shares"]))["shares"]
        spreads = [r["totals_spread"] for r in runs]
        ratio = f"{med(r['output_tok_s'] for r in runs) / ref:.3f}" if ref else "n/a"
        timed_out = [r for r in runs if r.get("ledger_errors", {}).get("pick")]
        rest = [r for r in runs if r not in timed_out]
        ledger = (f"{len(timed_out)} | {sum(r['exact'] for r in rest)}/{len(rest)}" if setup.shared else " | ")
        out.append(f"| {setup.label} | {setup.policy} | {len(runs)} ({':'.join(map(str, uneven))}) | "
                   f"{sum(r['exact'] for r in runs)}/{len(runs)} | {max(spreads)} | {statistics.mean(spreads):.2f} | "
                   f"{med(r['padding'] for r in runs):.3f} | {ratio} | {ledger} |")
    return out


def ledger_report(setups, measured):
    shared = [r for r in measured if r["shared"] and "pick_buckets" in r]
    if not shared:
        return []
    out = ["", f"The ledger's pick: {PICK_HISTOGRAM} of every replica (each pick's round trip, answered or timed out), "
           "summed over the replicas and cells; p50/p99 estimated from the buckets (linear within one). Ledger errors: "
           "dplb_shared_state_errors_total by op (a pick error is a pick made by the replica's own counts).", "",
           "| cells | setup | policy | picks | p50 ms | p99 ms | picks > 1 ms | ledger errors |",
           "|---|---|---|---:|---:|---:|---:|---|"]
    loads = "bursts, steady" if any(r["scenario"] == "steady" for r in shared) else "bursts"
    for kind, match in ((loads, lambda r: r["scenario"] not in ("throughput", "sequential")),
                        ("sequential", lambda r: r["scenario"] == "sequential"),
                        ("throughput", lambda r: r["scenario"] == "throughput")):
        for setup in setups:
            runs = [r for r in shared if match(r) and r["setup"] == setup.label and r["policy"] == setup.policy]
            if not runs:
                continue
            buckets = []
            errors = {}
            for r in runs:
                buckets = add_buckets(buckets, [(float(bound), count) for bound, count in r["pick_buckets"]])
                for op, n in r["ledger_errors"].items():
                    errors[op] = errors.get(op, 0) + n
            picks = buckets[-1][1] if buckets else 0
            within = max((count for bound, count in buckets if bound <= 0.001), default=0)
            named = ", ".join(f"{op} {n}" for op, n in errors.items() if n) or "none"
            out.append(f"| {kind} | {setup.label} | {setup.policy} | {picks:.0f} | {quantile_ms(buckets, 0.5)} | "
                       f"{quantile_ms(buckets, 0.99)} | {picks - within:.0f} | {named} |")
    return out


def requests_report(opts, measured):
    """The throughput and sequential runs: per replica, the mean of the replicas' clients, median over rounds."""
    med = statistics.median
    out = []
    for (kind, prompts, concurrency), replicas in itertools.product(
            (("sequential", opts.sequential_prompts, 1), ("throughput", opts.throughput_prompts, opts.throughput_concurrency)),
            (1, 2)):
        runs = {shared: [r for r in measured if r["scenario"] == kind and r["shared"] == shared and r["replicas"] == replicas]
                for shared in (False, True)}
        if not runs[False] or not runs[True]:
            continue
        figure = {shared: {key: med(statistics.mean(r[key]) for r in runs[shared]) for key in ("rps", "e2el_p50_ms", "e2el_p99_ms")}
                  for shared in (False, True)}
        alone, shared = figure[False], figure[True]
        named = "1 replica" if replicas == 1 else f"{replicas} replicas"
        out += ["", f"{kind.capitalize()}: {named} least-inflight in front of {RANKS} plain mock ranks answering at once, "
                f"each replica fed by its own closed-loop client ({prompts} 1-token non-streaming completions, {concurrency} "
                f"in flight); per replica (mean of the replicas' clients), median over {opts.throughput_rounds} alternating "
                "rounds. Engines, replicas, clients and Redis share this machine's cores.",
                "", "| setup | req/s per replica | every round | ratio to alone | end-to-end p50 ms | p99 ms |",
                "|---|---:|---|---:|---:|---:|"]
        for label, shared_ in ((named, False), (f"{named} + shared ledger", True)):
            f = figure[shared_]
            rounds = ", ".join(f"{statistics.mean(r['rps']):,.0f}" for r in runs[shared_])
            out.append(f"| {label} | {f['rps']:,.0f} | {rounds} "
                       f"| {f['rps'] / alone['rps']:.3f} | {f['e2el_p50_ms']:.3f} | {f['e2el_p99_ms']:.3f} |")
        out.append(f"| added by the ledger | | | | {shared['e2el_p50_ms'] - alone['e2el_p50_ms']:+.3f} | "
                   f"{shared['e2el_p99_ms'] - alone['e2el_p99_ms']:+.3f} |")
    return out


if __name__ == "__main__":
    main()
