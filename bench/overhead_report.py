#!/usr/bin/env python3
"""Summarises one bench/overhead.sh run: reads RESULTS/raw/ (wrk.tsv, stream.tsv, dplb-bench JSONs,
settings.tsv), prints the tables and writes, for bench/plot.sh and anything else:

  RESULTS/wrk.tsv      target, connections: median req/s, p50/p99 latency, proxy CPU per request, vs direct
  RESULTS/stream.tsv   target, streams: proxy CPU s per million events, TTFT/ITL p50/p99 and added to direct
  RESULTS/ratios.tsv   connections: req/s of each dplb target relative to each peer
  RESULTS/overhead.json  all of the above, the settings and the target checks

  python3 bench/overhead_report.py RESULTS_DIR

Medians over the rounds, metric by metric. "Added" latencies are paired by round (target minus the
direct run of the same round), then the median of those differences. Exit status 1 when any request of
any run failed, else 0. Standard library only.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

PROXIES = ["dplb1", "dplb1_log", "haproxy", "haproxy_nd", "nginx", "dplb2", "dplb1_base"]
PEERS = ["haproxy", "nginx"]
# Streaming peers: HAProxy with `option http-no-delay` when measured. Without it HAProxy holds SSE events
# back for up to ~200 ms and relays them in bursts: fewer, larger writes, so its CPU per event is not
# the cost of streaming, and no LLM deployment would accept the added TTFT.
STREAM_PEERS = ["haproxy_nd", "nginx"]
DPLBS = ["dplb1", "dplb1_log", "dplb2"]
# dplb1_log is dplb1 with --access-log: its ratio to dplb1 is the access log's cost. dplb1_base is an earlier
# build (OVERHEAD_BASELINE_DPLB): dplb1's ratio to it is the change's cost or gain, measured in the same rounds.
BASELINES = {"dplb1_log": ["dplb1"], "dplb1": ["dplb1_base"]}
# Events a stream relays: one per token, the usage event (dplb-bench asks for include_usage, as
# `vllm bench serve` does), and `data: [DONE]`.
EXTRA_EVENTS_PER_STREAM = 2
# Direct must beat every proxy by this much for the mock not to be the bottleneck of part 1.
MOCK_HEADROOM = 1.2
TTFT_BUDGET_MS = 0.2


def read_tsv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def write_tsv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with path.open("w") as f:
        f.write("\t".join(columns) + "\n")
        for row in rows:
            f.write("\t".join(fmt_tsv(row.get(c)) for c in columns) + "\n")


def fmt_tsv(v) -> str:
    if v is None:
        return "NA"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def fmt(v, spec: str = ".2f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def ordered(targets: list[str], present: set[str]) -> list[str]:
    return [t for t in targets if t in present]


def summarise_wrk(raw: list[dict[str, str]], targets: list[str]) -> tuple[list[dict], int]:
    runs: dict[tuple[str, int], list[dict]] = {}
    errors = 0
    for r in raw:
        duration = float(r["duration_s"])
        requests = int(r["requests"])
        errors += int(r["errors"])
        runs.setdefault((r["target"], int(r["connections"])), []).append({
            "round": int(r["round"]),
            "rps": requests / duration if duration > 0 else 0.0,
            "p50_ms": int(r["p50_us"]) / 1e3,
            "p99_ms": int(r["p99_us"]) / 1e3,
            "errors": int(r["errors"]),
            "cpu_us_per_req": float(r["proxy_cpu_s"]) / requests * 1e6 if requests else None,
            "mock_cpu_us_per_req": float(r["mock_cpu_s"]) / requests * 1e6 if requests else None,
        })
    rows = []
    for conns in sorted({c for _, c in runs}):
        direct = runs.get(("direct", conns))
        direct_rps = median([x["rps"] for x in direct]) if direct else None
        for target in targets:
            samples = runs.get((target, conns))
            if not samples:
                continue
            rps = median([x["rps"] for x in samples])
            rows.append({
                "target": target,
                "connections": conns,
                "rounds": len(samples),
                "rps": rps,
                "rps_min": min(x["rps"] for x in samples),
                "rps_max": max(x["rps"] for x in samples),
                "p50_ms": median([x["p50_ms"] for x in samples]),
                "p99_ms": median([x["p99_ms"] for x in samples]),
                "proxy_cpu_us_per_req": None if target == "direct" else median(
                    [x["cpu_us_per_req"] for x in samples if x["cpu_us_per_req"] is not None]),
                "mock_cpu_us_per_req": median(
                    [x["mock_cpu_us_per_req"] for x in samples if x["mock_cpu_us_per_req"] is not None]),
                "rps_vs_direct": rps / direct_rps if direct_rps else None,
                "errors": sum(x["errors"] for x in samples),
            })
    return rows, errors


def load_result(results: Path, name: str) -> dict | None:
    return None if name in ("", "-") else json.loads((results / "raw" / name).read_text())


def events_of(result: dict | None) -> int:
    """SSE events a run relayed: its tokens (one event each), plus the usage event and [DONE] of each stream."""
    if not result:
        return 0
    return int(result.get("total_output_tokens", 0)) + EXTRA_EVENTS_PER_STREAM * int(result.get("completed", 0))


def failures_of(result: dict | None) -> int:
    if not result:
        return 0
    return int(result.get("failed", 0)) + (1 if result.get("setup_error") else 0)


LATENCY_KEYS = ["ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "probe_ttft_p50_ms", "probe_ttft_p99_ms"]


def summarise_stream(results: Path, raw: list[dict[str, str]], targets: list[str]) -> tuple[list[dict], int]:
    runs: dict[tuple[str, int], dict[int, dict]] = {}
    failed_total = 0
    for r in raw:
        main_run = load_result(results, r["result_json"])
        probe = load_result(results, r["probe_json"])
        failed = failures_of(main_run) + failures_of(probe)
        failed_total += failed
        # The proxy relayed the probe's events too (a few dozen next to the main run's thousands).
        events = events_of(main_run) + events_of(probe)
        runs.setdefault((r["target"], int(r["streams"])), {})[int(r["round"])] = {
            "events": events,
            "failed": failed,
            "cpu_s_per_mevents": float(r["proxy_cpu_s"]) / events * 1e6 if events else None,
            "mock_cpu_s_per_mevents": float(r["mock_cpu_s"]) / events * 1e6 if events else None,
            "ttft_p50_ms": main_run.get("median_ttft_ms"),
            "ttft_p99_ms": main_run.get("p99_ttft_ms"),
            "itl_p50_ms": main_run.get("median_itl_ms"),
            "itl_p99_ms": main_run.get("p99_itl_ms"),
            "probe_ttft_p50_ms": probe.get("median_ttft_ms") if probe else None,
            "probe_ttft_p99_ms": probe.get("p99_ttft_ms") if probe else None,
        }
    rows = []
    for n in sorted({n for _, n in runs}):
        direct = runs.get(("direct", n), {})
        for target in targets:
            by_round = runs.get((target, n))
            if not by_round:
                continue
            samples = list(by_round.values())
            row = {
                "target": target,
                "streams": n,
                "rounds": len(samples),
                "events": median([x["events"] for x in samples]),
                "failed": sum(x["failed"] for x in samples),
                "cpu_s_per_mevents": None if target == "direct" else median(
                    [x["cpu_s_per_mevents"] for x in samples if x["cpu_s_per_mevents"] is not None]),
                "mock_cpu_s_per_mevents": median(
                    [x["mock_cpu_s_per_mevents"] for x in samples if x["mock_cpu_s_per_mevents"] is not None]),
            }
            for key in LATENCY_KEYS:
                row[key] = median([x[key] for x in samples if x[key] is not None])
                # Paired by round: this target's value minus the direct run's of the same round.
                diffs = [x[key] - direct[rnd][key] for rnd, x in by_round.items()
                         if rnd in direct and x[key] is not None and direct[rnd][key] is not None]
                row["added_" + key] = None if target == "direct" else median(diffs)
            rows.append(row)
    return rows, failed_total


def ratios(wrk_rows: list[dict]) -> list[dict]:
    rps = {(r["target"], r["connections"]): r["rps"] for r in wrk_rows}
    out = []
    for conns in sorted({r["connections"] for r in wrk_rows}):
        for dplb in DPLBS:
            for peer in PEERS + ["direct"] + BASELINES.get(dplb, []):
                a, b = rps.get((dplb, conns)), rps.get((peer, conns))
                if a is not None and b:
                    out.append({"connections": conns, "target": dplb, "versus": peer, "rps_ratio": a / b})
    return out


def checks(wrk_rows: list[dict], stream_rows: list[dict]) -> list[dict]:
    """The performance targets, each per load point; a check with no data is left out."""
    out = []
    rps = {(r["target"], r["connections"]): r["rps"] for r in wrk_rows}
    p50 = {(r["target"], r["connections"]): r["p50_ms"] for r in wrk_rows}
    if ("dplb1", 1) in p50 and ("direct", 1) in p50:
        # One request at a time: the latency dplb adds with nothing else going on (the same path a
        # stream's first token takes, minus the streaming).
        added = p50[("dplb1", 1)] - p50[("direct", 1)]
        out.append({"check": f"added p50 latency dplb1 <= {TTFT_BUDGET_MS} ms, one request at a time",
                    "point": "c=1", "value": added, "bound": TTFT_BUDGET_MS, "pass": added <= TTFT_BUDGET_MS})
    for conns in sorted({r["connections"] for r in wrk_rows}):
        peers = [rps[(p, conns)] for p in PEERS if (p, conns) in rps]
        if ("dplb1", conns) in rps and peers:
            out.append({"check": "req/s dplb1 >= max(haproxy, nginx)", "point": f"c={conns}",
                        "value": rps[("dplb1", conns)], "bound": max(peers),
                        "pass": rps[("dplb1", conns)] >= max(peers)})
        if ("dplb1", conns) in rps and ("dplb1_base", conns) in rps:
            out.append({"check": "req/s dplb1 >= dplb1_base (an earlier build)", "point": f"c={conns}",
                        "value": rps[("dplb1", conns)], "bound": rps[("dplb1_base", conns)],
                        "pass": rps[("dplb1", conns)] >= rps[("dplb1_base", conns)]})
        proxies = [rps[(p, conns)] for p in PROXIES if (p, conns) in rps]
        if ("direct", conns) in rps and proxies:
            out.append({"check": f"mock headroom: direct >= {MOCK_HEADROOM} x best proxy", "point": f"c={conns}",
                        "value": rps[("direct", conns)], "bound": MOCK_HEADROOM * max(proxies),
                        "pass": rps[("direct", conns)] >= MOCK_HEADROOM * max(proxies)})
    by = {(r["target"], r["streams"]): r for r in stream_rows}
    for n in sorted({r["streams"] for r in stream_rows}):
        dplb = by.get(("dplb1", n))
        if not dplb:
            continue
        names = STREAM_PEERS if ("haproxy_nd", n) in by else PEERS
        peers = [by[(p, n)]["cpu_s_per_mevents"] for p in names
                 if (p, n) in by and by[(p, n)]["cpu_s_per_mevents"] is not None]
        if peers and dplb["cpu_s_per_mevents"] is not None:
            out.append({"check": f"stream CPU/event dplb1 <= min({', '.join(names)})", "point": f"N={n}",
                        "value": dplb["cpu_s_per_mevents"], "bound": min(peers),
                        "pass": dplb["cpu_s_per_mevents"] <= min(peers)})
        base = by.get(("dplb1_base", n))
        if base and base["cpu_s_per_mevents"] is not None and dplb["cpu_s_per_mevents"] is not None:
            out.append({"check": "stream CPU/event dplb1 <= dplb1_base (an earlier build)", "point": f"N={n}",
                        "value": dplb["cpu_s_per_mevents"], "bound": base["cpu_s_per_mevents"],
                        "pass": dplb["cpu_s_per_mevents"] <= base["cpu_s_per_mevents"]})
        for key, what in (("added_probe_ttft_p50_ms", "under load (probe)"), ("added_ttft_p50_ms", "burst of N")):
            if dplb[key] is not None:
                out.append({"check": f"added TTFT p50 dplb1 <= {TTFT_BUDGET_MS} ms, {what}", "point": f"N={n}",
                            "value": dplb[key], "bound": TTFT_BUDGET_MS, "pass": dplb[key] <= TTFT_BUDGET_MS})
    return out


def print_tables(settings: dict[str, str], wrk_rows, stream_rows, ratio_rows, check_rows) -> None:
    print()
    print(f"Part 1: non-streaming POST /v1/completions (max_tokens 1), wrk -t1, {settings['duration_s']} s per run,"
          f" median of {settings['rounds']} round(s)")
    print(f"{'conns':>5} {'target':<10} {'req/s':>9} {'min..max':>15} {'vs direct':>9} {'p50 ms':>7} {'p99 ms':>7}"
          f" {'proxy CPU':>9} {'mock CPU':>8} {'errors':>6}")
    print(f"{'':>5} {'':<10} {'':>9} {'':>15} {'':>9} {'':>7} {'':>7} {'us/req':>9} {'us/req':>8}")
    last = None
    for r in wrk_rows:
        if last is not None and r["connections"] != last:
            print()
        last = r["connections"]
        print(f"{r['connections']:>5} {r['target']:<10} {r['rps']:>9.0f} {r['rps_min']:>7.0f}..{r['rps_max']:<7.0f}"
              f" {fmt(r['rps_vs_direct'], '.3f'):>9} {r['p50_ms']:>7.3f} {r['p99_ms']:>7.3f}"
              f" {fmt(r['proxy_cpu_us_per_req'], '.1f'):>9} {fmt(r['mock_cpu_us_per_req'], '.1f'):>8} {r['errors']:>6}")
    print()
    print("Ratios of req/s (dplb target / other)")
    conns_list = sorted({r["connections"] for r in ratio_rows})
    versus = ["haproxy", "nginx", "direct"]
    print(f"{'':<20}" + "".join(f"{'c=' + str(c):>9}" for c in conns_list))
    lookup = {(r["target"], r["versus"], r["connections"]): r["rps_ratio"] for r in ratio_rows}
    for dplb in DPLBS:
        for peer in versus + BASELINES.get(dplb, []):
            if any((dplb, peer, c) in lookup for c in conns_list):
                print(f"{dplb + ' / ' + peer:<20}" + "".join(f"{fmt(lookup.get((dplb, peer, c)), '.3f'):>9}"
                                                          for c in conns_list))
    print()
    print(f"Part 2: streaming, N concurrent SSE streams of {settings['output_len']} tokens at {settings['itl_ms']} ms"
          f" (+ usage + [DONE] events), all starting at once; probe: {settings['probes']} one-token streams"
          f" at a steady rate while the N run. Median of {settings['rounds']} round(s); +x = added to direct,"
          f" same round")
    print(f"{'':>4} {'':<10} {'proxy CPU':>9} {'mock CPU':>8} | {'TTFT, burst of N':^31} |"
          f" {'ITL':^31} | {'TTFT, probe under load':^31} |")
    print(f"{'N':>4} {'target':<10} {'s/M ev':>9} {'s/M ev':>8} |"
          + f" {'p50':>7} {'p99':>7} {'+p50':>7} {'+p99':>7} |" * 3 + f" {'failed':>6}")
    last = None
    for r in stream_rows:
        if last is not None and r["streams"] != last:
            print()
        last = r["streams"]
        cells = ""
        for key in ("ttft", "itl", "probe_ttft"):
            cells += (f" {fmt(r[key + '_p50_ms'], '.3f'):>7} {fmt(r[key + '_p99_ms'], '.2f'):>7}"
                      f" {fmt(r['added_' + key + '_p50_ms'], '+.3f'):>7} {fmt(r['added_' + key + '_p99_ms'], '+.2f'):>7} |")
        print(f"{r['streams']:>4} {r['target']:<10} {fmt(r['cpu_s_per_mevents'], '.2f'):>9}"
              f" {fmt(r['mock_cpu_s_per_mevents'], '.2f'):>8} |{cells} {r['failed']:>6}")
    print("(latencies in ms)")
    print()
    print("Targets")
    for c in check_rows:
        print(f"  {'PASS' if c['pass'] else 'FAIL'}  {c['check']:<56} {c['point']:<6}"
              f" {c['value']:>10.4g} vs {c['bound']:.4g}")
    print()


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    results = Path(sys.argv[1])
    settings = {r["key"]: r["value"] for r in read_tsv(results / "raw" / "settings.tsv")}
    wrk_rows, wrk_errors = summarise_wrk(read_tsv(results / "raw" / "wrk.tsv"), settings["wrk_targets"].split())
    stream_rows, stream_failed = summarise_stream(results, read_tsv(results / "raw" / "stream.tsv"),
                                                  settings["stream_targets"].split())
    ratio_rows = ratios(wrk_rows)
    check_rows = checks(wrk_rows, stream_rows)

    write_tsv(results / "wrk.tsv", wrk_rows,
              ["target", "connections", "rounds", "rps", "rps_min", "rps_max", "rps_vs_direct", "p50_ms", "p99_ms",
               "proxy_cpu_us_per_req", "mock_cpu_us_per_req", "errors"])
    write_tsv(results / "stream.tsv", stream_rows,
              ["target", "streams", "rounds", "events", "cpu_s_per_mevents", "mock_cpu_s_per_mevents"]
              + LATENCY_KEYS + ["added_" + k for k in LATENCY_KEYS] + ["failed"])
    write_tsv(results / "ratios.tsv", ratio_rows, ["connections", "target", "versus", "rps_ratio"])
    (results / "overhead.json").write_text(json.dumps({
        "settings": settings, "wrk": wrk_rows, "stream": stream_rows, "ratios": ratio_rows, "checks": check_rows,
        "errors": {"wrk_errors": wrk_errors, "stream_failed": stream_failed},
    }, indent=2) + "\n")

    print_tables(settings, wrk_rows, stream_rows, ratio_rows, check_rows)
    for part in ("wrk", "stream"):
        loads = [float(r["loadavg"]) for r in read_tsv(results / "raw" / f"{part}.tsv") if r.get("loadavg")]
        if loads:
            print(f"machine load average (1 min) at the start of the {part} runs: {min(loads):.2f} .. {max(loads):.2f}"
                  f" (this script's own processes account for up to ~3)")
    if wrk_errors or stream_failed:
        print(f"overhead: {wrk_errors} wrk error(s), {stream_failed} failed stream(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
