#!/usr/bin/env python3
"""How many picks a second one Redis serves: the shared ledger's functions (--shared-state) measured alone, with
redis-benchmark, against a redis-server of the script's own (docs/scaling.md, "Where one Redis is outgrown").

Run through bench/ledger_capacity.sh. The library is the Lua text of src/ledger/ledger_functions.cpp (between
R"lua( and )lua"), loaded as dplb loads it (FUNCTION LOAD REPLACE), so the figures are those of the library as
built. Every call is the one dplb's shared_ledger sends (src/ledger/shared_ledger.cpp): the same keys, under one
hash tag `{dplb:<16 hex>}`, and the same argv layout:

  - pick over 4, 8 and 64 candidates: `FCALL dplb_pick_3 4 {..}:replicas {..}:total {..}:rr {..}:r:<replica>
    <replica> 3000 least-inflight 0 0 0 2 1024 0.25 0` then `<rank> 1 0` per candidate: least-inflight, no
    per-rank limit, no tokens (dplb sends tokens only under least-tokens). The picks are never released in a
    pick-only run, so the counts grow (to tens of thousands a rank): a pick's work does not depend on their size.
    Each run checks that every call was recorded and that the ranks' totals differ by at most 1 (exact).
  - release: `FCALL dplb_release_3 <the 4 keys> <replica> 3000 0 0 0` on rank 0, after the replica's hash and
    the total were seeded with more requests on rank 0 than the run sends, so that every release frees a slot
    and publishes it on `{..}:freed` (checked: the seed fell by exactly the calls). --subscribers connections
    listen on that channel, as every dplb replica does.
  - tenant bucket take: `FCALL dplb_bucket_3 2 {..}:bucket:tenant:<t>:requests {..}:bucket:tenant:<t>:tokens
    take <rate> <burst> 1 <rate> <burst> 300`, a tenant with both limits (requests_per_second and
    tokens_per_minute) whose buckets never run dry (so every take takes and writes both buckets back).

Each operation runs in each mode (--modes: CLIENTSxPIPELINE; dplb keeps one connection per replica and pipelines
its picks on it, so 1x1 is one replica with one pick in flight at a time, 1x16 one busy replica, 8x16 eight),
--repeats times, each run sized from a short probe to last about --seconds. Per run: redis-benchmark's requests
per second and latency (p50, p99: its own measure, client side), Redis's time in the function per call (INFO
commandstats: fcall's usec_per_call) and Redis's whole CPU per call (INFO cpu, user + sys, over the run: the
function, the protocol and the socket work), and the benchmark client's CPU per call. 1e6 / Redis's CPU per call
is the ceiling of one Redis given a core of its own. A request under least-inflight is one pick and one release:
its rate is 1 / (1/picks + 1/releases); with a tenant's limits one bucket take more.

Everything (Redis, redis-benchmark, the subscribers) shares this machine's cores with whatever else runs. Writes
<results-dir>/ledger_capacity.{md,json}. Redis is stopped by its pid at the end, also on errors and SIGTERM."""

import argparse
import json
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import benchlib
from benchlib import log

NS = "{dplb:0123456789abcdef}"  # a ledger's hash tag: 16 hex digits of the backend list's digest
REPLICA = "bench-0"
LEASE_MS = "3000"
LEDGER_KEYS = [f"{NS}:replicas", f"{NS}:total", f"{NS}:rr", f"{NS}:r:{REPLICA}"]
TENANT = "team-a"
BUCKET_KEYS = [f"{NS}:bucket:tenant:{TENANT}:requests", f"{NS}:bucket:tenant:{TENANT}:tokens"]


def library_text(source):
    text = Path(source).read_text()
    match = re.search(r'R"lua\((.*?)\)lua"', text, re.S)
    if not match or "#!lua name=dplb_ledger_" not in match.group(1):
        raise SystemExit(f"ledger_capacity: no Lua library between R\"lua( and )lua\" in {source}")
    return match.group(1)


def pick_command(ranks):
    argv = ["FCALL", "dplb_pick_3", "4", *LEDGER_KEYS, REPLICA, LEASE_MS, "least-inflight", "0", "0", "0",
            "2", "1024", "0.25", "0"]
    for rank in range(ranks):
        argv += [str(rank), "1", "0"]
    return argv


RELEASE = ["FCALL", "dplb_release_3", "4", *LEDGER_KEYS, REPLICA, LEASE_MS, "0", "0", "0"]
# Rates no benchmark run empties: 10^6 requests and 10^8 tokens a second, as much burst.
BUCKET_TAKE = ["FCALL", "dplb_bucket_3", "2", *BUCKET_KEYS, "take", "1000000", "1000000", "1",
               "100000000", "100000000", "300"]


class Redis:
    """The benchmark's redis-server and a redis-cli to drive it."""

    def __init__(self, port):
        self.port = port

    def cli(self, *args, stdin=None):
        answer = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args], input=stdin,
                                capture_output=True, text=True, timeout=30, check=True)
        if answer.stdout.startswith("(error)") or answer.stdout.startswith("ERR"):
            raise RuntimeError(f"redis-cli {' '.join(args)}: {answer.stdout.strip()}")
        return answer.stdout

    def info(self, section):
        fields = {}
        for line in self.cli("INFO", section).splitlines():
            if ":" in line and not line.startswith("#"):
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        return fields

    def cpu_seconds(self):
        cpu = self.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    def fcall_stats(self):
        raw = self.info("commandstats").get("cmdstat_fcall")
        if raw is None:
            return {"calls": 0, "usec_per_call": 0.0, "failed_calls": 0}
        stats = dict(part.split("=") for part in raw.split(","))
        return {"calls": int(stats["calls"]), "usec_per_call": float(stats["usec_per_call"]),
                "failed_calls": int(stats.get("failed_calls", 0)) + int(stats.get("rejected_calls", 0))}

    def hash(self, key):
        lines = self.cli("HGETALL", key).split()
        return dict(zip(lines[0::2], (int(v) for v in lines[1::2])))


class Operation:
    """One function call to measure: how to prepare Redis before a run and what to check after it."""

    def __init__(self, name, argv, prepare, check):
        self.name, self.argv, self.prepare, self.check = name, argv, prepare, check


def pick_operation(ranks):
    def prepare(redis, calls):
        redis.cli("FLUSHALL")

    def check(redis, calls):
        total = {k: v for k, v in redis.hash(f"{NS}:total").items() if ":" not in k}
        counts = [total.get(str(rank), 0) for rank in range(ranks)]
        if sum(counts) != calls or max(counts) - min(counts) > 1:
            raise RuntimeError(f"pick over {ranks}: {calls} calls left totals {counts}")
    return Operation(f"pick, {ranks} ranks", pick_command(ranks), prepare, check)


def release_operation():
    state = {}

    def prepare(redis, calls):
        redis.cli("FLUSHALL")
        seeded = calls + 1_000_000  # more than any pipelined overshoot: every release frees one
        redis.cli("HSET", LEDGER_KEYS[3], "0", str(seeded))
        redis.cli("HSET", LEDGER_KEYS[1], "0", str(seeded))
        state["seeded"] = seeded

    def check(redis, calls):
        held = redis.hash(LEDGER_KEYS[3]).get("0", 0)
        total = redis.hash(LEDGER_KEYS[1]).get("0", 0)
        if held != state["seeded"] - calls or total != held:
            raise RuntimeError(f"release: {calls} calls took {state['seeded']} to {held} (total {total})")
    return Operation("release", RELEASE, prepare, check)


def bucket_operation():
    def prepare(redis, calls):
        redis.cli("FLUSHALL")

    def check(redis, calls):
        answer = redis.cli("FCALL", *BUCKET_TAKE[1:]).split()
        if answer[:1] != ["1"] or not redis.hash(BUCKET_KEYS[1]):
            raise RuntimeError(f"bucket take: the last take answered {answer}, the tokens bucket is not written")
    return Operation("tenant bucket take (2 keys)", BUCKET_TAKE, prepare, check)


def redis_benchmark(port, clients, pipeline, requests, argv):
    answer = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(clients), "-P",
                             str(pipeline), "-n", str(requests), "--csv", *argv],
                            capture_output=True, text=True, timeout=600)
    if answer.returncode != 0:  # it stops at the first error reply
        raise RuntimeError(f"redis-benchmark {argv[1]} failed: {(answer.stdout + answer.stderr).strip()[-500:]}")
    rows = [line for line in answer.stdout.splitlines() if line.startswith('"') and not line.startswith('"test"')]
    if not rows:
        raise RuntimeError(f"redis-benchmark printed no result:\n{answer.stdout}{answer.stderr}")
    fields = [f.strip('"') for f in rows[-1].split('","')]
    return {"rps": float(fields[1]), "latency_avg_ms": float(fields[2]), "latency_p50_ms": float(fields[4]),
            "latency_p95_ms": float(fields[5]), "latency_p99_ms": float(fields[6]),
            "latency_max_ms": float(fields[7].rstrip('"'))}


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(redis, op, clients, pipeline, requests):
    """One run: prepare, run, read Redis's stats, check what the calls did."""
    op.prepare(redis, requests)
    redis.cli("CONFIG", "RESETSTAT")
    cpu_before, client_before = redis.cpu_seconds(), children_cpu()
    result = redis_benchmark(redis.port, clients, pipeline, requests, op.argv)
    client_cpu = children_cpu() - client_before
    redis_cpu = redis.cpu_seconds() - cpu_before
    stats = redis.fcall_stats()
    if stats["failed_calls"] or stats["calls"] < requests:
        raise RuntimeError(f"{op.name}: {stats['calls']} calls for {requests} requests, {stats['failed_calls']} failed")
    op.check(redis, stats["calls"])
    return {**result, "requests": requests, "calls": stats["calls"],
            "fcall_usec_per_call": stats["usec_per_call"],
            "redis_cpu_usec_per_call": redis_cpu * 1e6 / stats["calls"],
            "client_cpu_usec_per_call": client_cpu * 1e6 / stats["calls"]}


def sized_requests(redis, op, clients, pipeline, seconds, probe_requests):
    """Requests for a run of about `seconds`, from a short probe; a multiple of clients x pipeline (redis-benchmark
    sends whole pipelines)."""
    batch = clients * pipeline
    probe = max(probe_requests, batch * 4)
    probe -= probe % batch
    rps = measure(redis, op, clients, pipeline, probe)["rps"]
    wanted = max(batch * 4, int(rps * seconds))
    return wanted - wanted % batch


def start_subscribers(port, count, workdir):
    return [benchlib.Process(["redis-cli", "-h", "127.0.0.1", "-p", str(port), "SUBSCRIBE", f"{NS}:freed"],
                             workdir / f"subscriber-{i}.log") for i in range(count)]


def parse_modes(text):
    modes = []
    for word in text.split():
        clients, _, pipeline = word.partition("x")
        modes.append((int(clients), int(pipeline or 1)))
    return modes


def machine():
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(), "redis": version,
            "load_average_at_start": list(os.getloadavg())}


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(records, ops, modes):
    """Per operation and mode: the median and range over the repeats of each figure."""
    cells = []
    for op in ops:
        for clients, pipeline in modes:
            runs = [r for r in records if r["operation"] == op and r["clients"] == clients and r["pipeline"] == pipeline]
            if not runs:
                continue
            cells.append({"operation": op, "clients": clients, "pipeline": pipeline,
                          **{k: spread([r[k] for r in runs]) for k in
                             ("rps", "latency_p50_ms", "latency_p99_ms", "fcall_usec_per_call",
                              "redis_cpu_usec_per_call", "client_cpu_usec_per_call")}})
    return cells


def requests_per_second(cells, ranks, modes):
    """A request's rate under least-inflight (one pick and one release), and with a tenant's limits (a bucket take
    more): from the medians, per mode; and the ceiling of a Redis with a core of its own, from its CPU per call."""
    def cell(op, mode):
        return next((c for c in cells if c["operation"] == op and (c["clients"], c["pipeline"]) == mode), None)
    rows = []
    for mode in modes:
        release, bucket = cell("release", mode), cell("tenant bucket take (2 keys)", mode)
        for n in ranks:
            pick = cell(f"pick, {n} ranks", mode)
            if not (pick and release):
                continue
            row = {"ranks": n, "clients": mode[0], "pipeline": mode[1]}
            row["requests_per_second"] = 1 / (1 / pick["rps"]["median"] + 1 / release["rps"]["median"])
            cpu = pick["redis_cpu_usec_per_call"]["median"] + release["redis_cpu_usec_per_call"]["median"]
            row["ceiling_per_core"] = 1e6 / cpu
            if bucket:
                row["with_tenant_limits"] = 1 / (1 / pick["rps"]["median"] + 1 / release["rps"]["median"]
                                                 + 1 / bucket["rps"]["median"])
                row["ceiling_with_tenant_limits"] = 1e6 / (cpu + bucket["redis_cpu_usec_per_call"]["median"])
            rows.append(row)
    return rows


def report(opts, info, cells, rows, elapsed):
    def figure(s, fmt="{:,.0f}"):
        if opts.repeats == 1 or fmt.format(s["min"]) == fmt.format(s["max"]):
            return fmt.format(s["median"])
        return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"
    out = [f"# The shared ledger's capacity: one Redis (bench/ledger_capacity.sh)", "",
           f"{info['redis']}; {info['cpus']} CPUs ({info['cpu_model'] or 'unknown'}), load average at the start "
           f"{info['load_average_at_start'][0]:.2f}; Redis, redis-benchmark and {opts.subscribers} subscribers to "
           f"`{{..}}:freed` share them. {opts.repeats} run(s) per cell of about {opts.seconds} s: median "
           f"(min-max). Clients x pipeline: redis-benchmark's connections and the calls each keeps in flight.", "",
           "| operation | clients x pipeline | calls/s | p50 ms | p99 ms | in the function, us/call | Redis CPU, us/call "
           "| client CPU, us/call | one Redis core's ceiling, calls/s |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cells:
        out.append(f"| {c['operation']} | {c['clients']} x {c['pipeline']} | {figure(c['rps'])} | "
                   f"{figure(c['latency_p50_ms'], '{:.3f}')} | {figure(c['latency_p99_ms'], '{:.3f}')} | "
                   f"{figure(c['fcall_usec_per_call'], '{:.1f}')} | {figure(c['redis_cpu_usec_per_call'], '{:.1f}')} | "
                   f"{figure(c['client_cpu_usec_per_call'], '{:.1f}')} | "
                   f"{1e6 / c['redis_cpu_usec_per_call']['median']:,.0f} |")
    out += ["", "Requests a second over all replicas, per Redis (least-inflight: a pick and a release each; with a "
            "tenant's limits, a bucket take more), from the medians above; the ceiling is a Redis with a core of its own:",
            "", "| candidate ranks | clients x pipeline | requests/s | with tenant limits | ceiling | ceiling with tenant limits |",
            "|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['ranks']} | {r['clients']} x {r['pipeline']} | {r['requests_per_second']:,.0f} | "
                   f"{r.get('with_tenant_limits', 0):,.0f} | {r['ceiling_per_core']:,.0f} | "
                   f"{r.get('ceiling_with_tenant_limits', 0):,.0f} |")
    out += ["", f"Picks are never released in a pick-only run (their counts grow; a pick's work does not depend on "
            f"them). {elapsed:.0f} s in all.", ""]
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", default="src/ledger/ledger_functions.cpp")
    parser.add_argument("--ranks", default="4 8 64", help="candidate counts of the picks measured")
    parser.add_argument("--modes", default="1x1 1x16 8x16", help="CLIENTSxPIPELINE, space separated")
    parser.add_argument("--seconds", type=float, default=3.0, help="about how long each run lasts")
    parser.add_argument("--probe-requests", type=int, default=2000)
    parser.add_argument("--subscribers", type=int, default=2, help="connections listening on {..}:freed")
    benchlib.add_run_arguments(parser, repeats=2)
    opts = parser.parse_args()
    ranks = [int(n) for n in opts.ranks.split()]
    modes = parse_modes(opts.modes)
    library = library_text(opts.library)
    ops = [pick_operation(n) for n in ranks] + [release_operation(), bucket_operation()]
    info = machine()
    started = time.monotonic()
    records = []
    # SIGTERM ends the run as an error would: the finally clauses stop Redis and the subscribers by their pids.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with benchlib.work_directory("ledger_capacity", opts.keep_logs) as workdir:
        server, port = benchlib.start_redis(workdir / "redis.log")
        subscribers = []
        try:
            redis = Redis(port)
            loaded = redis.cli("-x", "FUNCTION", "LOAD", "REPLACE", stdin=library).strip()
            log(f"ledger_capacity: redis-server pid {server.pid} on port {port}, library {loaded} loaded")
            subscribers = start_subscribers(port, opts.subscribers, workdir)
            for repeat in range(opts.repeats):
                for clients, pipeline in modes:
                    for op in ops:  # the operations alternate within a repeat: a slow moment hits each alike
                        requests = sized_requests(redis, op, clients, pipeline, opts.seconds, opts.probe_requests)
                        record = measure(redis, op, clients, pipeline, requests)
                        record.update(operation=op.name, clients=clients, pipeline=pipeline, repeat=repeat)
                        log(f"ledger_capacity: {op.name}, {clients}x{pipeline}, run {repeat + 1}/{opts.repeats}: "
                            f"{record['rps']:,.0f}/s, Redis {record['redis_cpu_usec_per_call']:.1f} us/call")
                        records.append(record)
        finally:
            for s in subscribers:
                s.stop()
            server.stop()
    cells = summarise(records, [op.name for op in ops], modes)
    rows = requests_per_second(cells, ranks, modes)
    text = report(opts, info, cells, rows, time.monotonic() - started)
    results = Path(opts.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    (results / "ledger_capacity.json").write_text(json.dumps(
        {"settings": vars(opts), "machine": info, "cells": cells, "requests": rows, "runs": records}, indent=1))
    (results / "ledger_capacity.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
