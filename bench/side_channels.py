#!/usr/bin/env python3
"""Side channels and the request path: what reading and parsing a 16 MiB engine /metrics page adds to the
latency of proxied requests.

Run through bench/side_channels.sh. One dplb with one worker thread (--threads 1, where a stall shows most
clearly) in front of one fake engine run by this script: it answers GET /health, POST /v1/completions (a
small JSON reply at once) and GET /metrics with a page of --page-mib MiB (histogram bucket series, the
gauges dplb balances on last, so the whole page is parsed). A client sends --rate completions a second on
schedule (open loop, over 32 keep-alive connections) for --seconds and times each from the moment it was
due, so that a stall of dplb's one worker delays every request due during it, with dplb
  no-reads  --stats-interval 0: the engine's /metrics is never read (the baseline), and
  reads     --stats-interval MS (default 500): dplb reads and parses the page every MS.
The added latency is reads minus no-reads, per percentile; --repeats rounds of every run, interleaved, so
that the machine's own hiccups (other processes) weigh on every run alike, and the medians are shown. Each binary given with --dplb LABEL=PATH is
measured the same way, so a build before a change and one after it can be compared in one run.

Standard library only. The fake engine listens on 127.0.0.1 on an ephemeral port; every dplb is stopped by its
pid.
"""

import argparse
import asyncio
import http.server
import json
import re
import socketserver
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchlib import Process, log, percentile


def metrics_page(mib):
    lines = []
    size = 0
    i = 0
    while size < mib * (1 << 20):
        line = (f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="{i % 4096}.0",'
                f'model_name="mock-model-{i // 4096}"}} {i * 7}\n')
        lines.append(line)
        size += len(line)
        i += 1
    lines.append('vllm:num_requests_running{engine="0",model_name="mock-model"} 0\n')
    lines.append('vllm:num_requests_waiting{engine="0",model_name="mock-model"} 0\n')
    return "".join(lines).encode()


class FakeEngine(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def __init__(self, page):
        self.page = page
        self.metrics_reads = 0
        self.pages_sent = 0  # whole pages written (a read dplb gave up on breaks its write)
        super().__init__(("127.0.0.1", 0), EngineHandler)


class EngineHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    completion = json.dumps({"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}).encode()

    def log_message(self, *args):
        pass

    def handle_error(self, *args):
        pass  # dplb gave up on a read (its timeout): the write breaks, as expected

    def reply(self, body, content_type):
        # Head and body in one write: no small segment left waiting for a delayed ACK.
        head = f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        self.wfile.write(head.encode() + body)

    def do_GET(self):
        if self.path == "/counters":  # this script's own: how many pages were asked for and written whole
            counters = {"metrics_reads": self.server.metrics_reads, "pages_sent": self.server.pages_sent}
            self.reply(json.dumps(counters).encode(), "application/json")
        elif self.path == "/metrics":
            self.server.metrics_reads += 1
            self.reply(self.server.page, "text/plain; version=0.0.4")
            self.server.pages_sent += 1
        else:
            self.reply(b"", "text/plain")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.reply(self.completion, "application/json")


async def open_loop_latencies_ms(port, rate, seconds, connections=32):
    """Requests at a fixed rate, each timed from the moment it was due (open loop): a stall of the proxy
    delays every request due during it, as it would delay real traffic, instead of only the one a closed
    loop happened to have in flight."""
    body = json.dumps({"model": "mock-model", "prompt": "x", "max_tokens": 1}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: dplb\r\nContent-Type: application/json\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    idle = asyncio.Queue()
    for _ in range(connections):
        idle.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    loop = asyncio.get_running_loop()
    out = []

    async def one(due):
        reader, writer = await idle.get()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"dplb answered {head.splitlines()[0]!r}")
        length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
        await reader.readexactly(length)
        out.append((loop.time() - due) * 1000)
        idle.put_nowait((reader, writer))

    period = 1.0 / rate
    start = loop.time()
    tasks = []
    for i in range(int(rate * seconds)):
        due = start + i * period
        await asyncio.sleep(max(0.0, due - loop.time()))
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    while not idle.empty():
        _, writer = idle.get_nowait()
        writer.close()
    return out


def latencies_ms(port, rate, seconds):
    return asyncio.run(open_loop_latencies_ms(port, rate, seconds))


def engine_counters(engine_port):
    with urllib.request.urlopen(f"http://127.0.0.1:{engine_port}/counters", timeout=10) as response:
        counters = json.load(response)
    return counters["metrics_reads"], counters["pages_sent"]


def run_one(dplb, engine_port, stats_interval, rate, seconds, log_path):
    args = [dplb, "--listen", "127.0.0.1:0", "--threads", "1", "--policy", "least-load", "--log-level", "info",
            "--stats-interval", str(stats_interval), "--backend", f"http://127.0.0.1:{engine_port}"]
    proc = Process(args, log_path)
    try:
        port = int(proc.await_line(r"listening on 127\.0\.0\.1:(\d+)").group(1))
        latencies_ms(port, rate, 1.0)  # warm-up: connections made, the first reads done
        reads_before, pages_before = engine_counters(engine_port)
        values = latencies_ms(port, rate, seconds)
        reads_after, pages_after = engine_counters(engine_port)
        reads = (reads_after - reads_before, pages_after - pages_before)
    finally:
        proc.stop()
    if stats_interval and reads[1] < reads[0] // 2:
        log(f"only {reads[1]} of {reads[0]} pages were read whole: dplb's log says why\n" + proc.log_text()[-2000:])
    return values, reads


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dplb", action="append", metavar="LABEL=PATH",
                        help="a dplb binary to measure (repeatable); default: current=build/dplb")
    parser.add_argument("--page-mib", type=float, default=15.5, help="size of the /metrics page (dplb reads <= 16)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per run")
    parser.add_argument("--rate", type=float, default=200, help="requests per second, sent on schedule")
    parser.add_argument("--stats-interval", type=int, default=500,
                        help="ms between reads in the reads runs (dplb's read timeout is the smaller of this and "
                             "--health-check-timeout-ms: at 100, a loaded machine cannot always deliver 16 MiB in time)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds of every run, interleaved; the table shows the median of each figure")
    parser.add_argument("--results-dir", default="bench/results")
    parser.add_argument("--serve-engine", action="store_true", help=argparse.SUPPRESS)  # the fake engine's process
    opts = parser.parse_args()
    if opts.serve_engine:
        engine = FakeEngine(metrics_page(opts.page_mib))
        print(f"fake engine listening on 127.0.0.1:{engine.server_address[1]}", flush=True)
        engine.serve_forever()
        return 0
    binaries = [entry.split("=", 1) for entry in (opts.dplb or ["current=build/dplb"])]

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # A process of its own: in this one, the client's loop would hold the interpreter lock from it.
        engine = Process([sys.executable, __file__, "--serve-engine", "--page-mib", str(opts.page_mib)],
                         Path(tmp) / "engine.log")
        try:
            engine_port = int(engine.await_line(r"listening on 127\.0\.0\.1:(\d+)", timeout=60).group(1))
            for repeat in range(opts.repeats):
                for label, path in binaries:
                    for name, interval in (("no-reads", 0), ("reads", opts.stats_interval)):
                        log(f"round {repeat + 1}: {label} {name}: {opts.seconds:g} s of {opts.rate:g} requests/s")
                        values, reads = run_one(path, engine_port, interval, opts.rate, opts.seconds,
                                                Path(tmp) / f"{label}-{name}.log")
                        rows.append({"dplb": label, "run": name, "round": repeat + 1, "requests": len(values),
                                     "metrics_reads": reads[0], "pages_sent": reads[1],
                                     "p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99),
                                     "p999_ms": percentile(values, 99.9), "max_ms": max(values)})
        finally:
            engine.stop()

    lines = [f"/metrics page {opts.page_mib:g} MiB, --threads 1, reads every {opts.stats_interval} ms "
             f"in the reads runs, {opts.rate:g} requests/s on schedule (open loop) for {opts.seconds:g} s per run; "
             f"latency from the moment each was due; median of {opts.repeats} interleaved rounds "
             "(each round's p99 in brackets)", "",
             "| dplb | run | /metrics reads (whole) | p50 ms | p99 ms | p99.9 ms | max ms | added p50 ms | added p99 ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    baseline = {}
    for label, _ in binaries:
        for name in ("no-reads", "reads"):
            runs = [row for row in rows if row["dplb"] == label and row["run"] == name]
            med = {key: statistics.median(row[key] for row in runs)
                   for key in ("metrics_reads", "pages_sent", "p50_ms", "p99_ms", "p999_ms", "max_ms")}
            if name == "no-reads":
                baseline = med
            rounds = ", ".join(f"{row['p99_ms']:.1f}" for row in runs)
            lines.append(f"| {label} | {name} | {med['metrics_reads']:g} ({med['pages_sent']:g}) | {med['p50_ms']:.2f} | "
                         f"{med['p99_ms']:.2f} [{rounds}] | {med['p999_ms']:.2f} | {med['max_ms']:.2f} | "
                         f"{med['p50_ms'] - baseline['p50_ms']:+.2f} | {med['p99_ms'] - baseline['p99_ms']:+.2f} |")
    report = "\n".join(lines) + "\n"
    results = Path(opts.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    (results / "side_channels.md").write_text(report)
    (results / "side_channels.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(report)


if __name__ == "__main__":
    sys.exit(main())
