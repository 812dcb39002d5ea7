"""Helpers shared by the Python benchmark drivers (imbalance.py, scale.py, replicas.py, tokens.py, prefix.py,
service.py): child processes that log to a file and are stopped by their own pid, sums and histogram quantiles
over Prometheus text, a simulated engine, dplb and a redis-server started on ephemeral ports, dplb-bench runs,
and a sampler of the engines' gauges. Standard library only."""

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Process:
    """A child whose stdout and stderr go to a log file; stopped by its own pid."""

    def __init__(self, args, log_path):
        self.log_path = log_path
        self.log_file = open(log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log_file, stderr=subprocess.STDOUT)

    @property
    def pid(self):
        return self.proc.pid

    @property
    def returncode(self):
        return self.proc.returncode

    def log_text(self):
        return Path(self.log_path).read_text()

    def await_line(self, pattern, timeout=10.0):
        """The first match of `pattern` in the log, waiting (bounded) for the line to appear."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            match = regex.search(self.log_text())
            if match:
                return match
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"timed out waiting for /{pattern}/ in {self.log_path}:\n" + self.log_text())

    def stop(self, timeout=15):
        """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


def scrape_until(url, done, seconds=20):
    """The page at `url` once done(text) holds, or as it is at the deadline. Bounded in time, not in scrapes: a
    hundred scrapes in a row can take less than dplb's first engine-stats read on a loaded machine."""
    deadline = time.monotonic() + seconds
    text = scrape(url)
    while not done(text) and time.monotonic() < deadline:
        time.sleep(0.02)  # a poll's pause: a series appearing has no event to await from outside
        text = scrape(url)
    return text


def metric_sum(text, name):
    """Sum of every sample of a metric (all label sets) in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def metric_by_engine(text, name):
    """{engine label: value} of a per-engine metric in Prometheus text (the mock labels every series engine="i")."""
    values = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            match = re.search(r'engine="(\d+)"', line)
            if match:
                values[int(match.group(1))] = values.get(int(match.group(1)), 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def percentile(values, p):
    """The p-th percentile (0-100) of `values`, nearest rank; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def quantile(values, q):
    """numpy's default (linear) quantile of a non-empty list."""
    values = sorted(values)
    at = q * (len(values) - 1)
    low = int(at)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (at - low)


def binaries(build_dir, script):
    """(dplb, mock engine, dplb-bench) under build_dir; exits with a note when one is missing."""
    build = Path(build_dir)
    paths = (str(build / "dplb"), str(build / "tools/mock_engine/dplb-mock-engine"), str(build / "tools/bench/dplb-bench"))
    for binary in paths:
        if not os.access(binary, os.X_OK):
            sys.exit(f"{script}: {binary} not found; build first (./scripts/build.sh {build_dir})")
    return paths


def offered_policies(dplb, wanted, script):
    """The policies of `wanted` (space-separated) that this dplb offers (its --help lists them on the --policy
    line); each other one is skipped with a note, so that a benchmark runs before and after a policy lands."""
    text = subprocess.run([dplb, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=30).stdout
    match = re.search(r"--policy\s+([\w|-]+)", text)
    if not match:
        sys.exit(f"{script}: no --policy line in {dplb} --help")
    offered = set(match.group(1).split("|"))
    chosen = []
    for policy in wanted.split():
        if policy in offered:
            chosen.append(policy)
        else:
            log(f"{script}: skipping policy {policy}: {dplb} does not offer it")
    return chosen


def start_mock(mock, args, log_path):
    """A mock engine on ephemeral ports: (process, [rank ports], admin port). `args` are its options after
    --port 0."""
    proc = Process([mock, "--port", "0"] + args, log_path)
    try:
        proc.await_line(r"mock-engine ready")
        text = proc.log_text()
        ports = [int(p) for p in re.findall(r"rank \d+ listening on [\d.]+:(\d+)", text)]
        admin = int(re.search(r"admin listening on [\d.]+:(\d+)", text).group(1))
    except BaseException:
        proc.stop()
        raise
    return proc, ports, admin


def start_router(dplb, args, log_path):
    """A dplb on an ephemeral port with these options (its backends among them): (process, its port)."""
    proc = Process([dplb, "--listen", "127.0.0.1:0", "--log-level", "info"] + list(args), log_path)
    try:
        port = int(proc.await_line(r"listening on 127\.0\.0\.1:(\d+)").group(1))
    except BaseException:
        proc.stop()
        raise
    return proc, port


def start_dplb(dplb, policy, backend_ports, log_path, extra=(), dp=1, fragments=None):
    """A dplb on an ephemeral port in front of 127.0.0.1:<each of backend_ports>: (process, its port). With dp > 1
    each port serves that many DP engines (`--backend URL#dp=N`, vLLM's internal LB). fragments, one per port:
    more of each backend's URL fragment (e.g. "kv-events=tcp://127.0.0.1:P&kv-replay=tcp://127.0.0.1:R")."""
    args = ["--policy", policy]
    for i, port in enumerate(backend_ports):
        parts = ([f"dp={dp}"] if dp > 1 else []) + ([fragments[i]] if fragments and fragments[i] else [])
        args += ["--backend", f"http://127.0.0.1:{port}" + ("#" + "&".join(parts) if parts else "")]
    return start_router(dplb, args + list(extra), log_path)


def labelled_sum(text, name, label=""):
    """Sum of a metric's samples whose labels contain `label` (e.g. 'outcome="ok"'), in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and label in line.split(" ")[0]:
            total += float(line.rsplit(" ", 1)[1])
    return total


def free_port_block(count, avoid=(), low=20000, high=30000, tries=200):
    """The first of `count` consecutive ports on 127.0.0.1, drawn at random in [low, high), none of them in use
    now (each bound and released) nor in `avoid`: for listeners whose ports must be known in advance (the mock's
    KV-event sockets). Another process may still take one before its owner binds it; the window is short."""
    import random
    import socket
    for _ in range(tries):
        first = random.randrange(low, high - count)
        block = range(first, first + count)
        if any(p in avoid for p in block):
            continue
        try:
            for p in block:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return first
    raise RuntimeError(f"no {count} free consecutive ports in [{low}, {high})")


def dechunk(body):
    """The payload of an HTTP/1.1 chunked body (bytes), its chunk extensions and trailers dropped."""
    out = bytearray()
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += body[:size]
        body = body[size + 2:]


def start_redis(log_path, attempts=3, port=None):
    """A redis-server of its own on 127.0.0.1 (no persistence, nothing written to disk): (process, its port),
    stopped by its pid like any Process. The port is drawn free; should another process take it first, another
    is drawn. With `port`, on that port and no other (a Redis restarted where its clients look for it), one
    attempt: raises if it cannot listen there."""
    wanted = port
    for _ in range(1 if wanted else attempts):
        port = wanted or free_port_block(1)
        proc = Process(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                        "--logfile", ""], log_path)
        try:
            proc.await_line(r"Ready to accept connections")
            return proc, port
        except RuntimeError:
            proc.stop()
            if wanted or "Address already in use" not in proc.log_text():
                raise
    raise RuntimeError(f"redis-server found no free port in {attempts} attempts; see {log_path}")


def histogram_buckets(text, name):
    """[(upper bound, cumulative count)] of a Prometheus histogram in `text`, summed over its label sets, in the
    order of the bounds (+Inf last); [] when the histogram is absent."""
    counts = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            bound = re.search(r'le="([^"]+)"', line).group(1)
            counts[float(bound)] = counts.get(float(bound), 0.0) + float(line.rsplit(" ", 1)[1])
    return sorted(counts.items())


def add_buckets(a, b):
    """The sum of two histograms' buckets (as histogram_buckets gives them; either may be [])."""
    total = dict(a)
    for bound, count in b:
        total[bound] = total.get(bound, 0.0) + count
    return sorted(total.items())


def histogram_quantile(buckets, q):
    """The q-quantile (0..1) of a histogram's cumulative buckets, as Prometheus' histogram_quantile estimates it:
    linear within the bucket the rank falls in (from 0 for the first); the last finite bound when it falls in
    +Inf. None for an empty histogram."""
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = bound, count
    return lower


def start_bench(bench, port, args, result_path, log_path, timeout_s=300):
    """dplb-bench against 127.0.0.1:port in the background (a Process; wait with finish_bench)."""
    return Process([bench, "--base-url", f"http://127.0.0.1:{port}", "--model", "mock-model", "--quiet",
                    "--result-json", str(result_path), "--timeout-s", str(timeout_s)] + list(args), log_path)


def finish_bench(proc, result_path, timeout_s=330):
    """Waits (bounded) for a start_bench run; its result JSON. Raises when it failed."""
    try:
        proc.proc.wait(timeout=timeout_s)
    finally:
        proc.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"dplb-bench failed ({proc.returncode}):\n{proc.log_text()}")
    return json.loads(Path(result_path).read_text())


class PeriodicSampler:
    """Calls sample() every `interval` s on a thread of its own, from start() to stop(), keeping what it returns
    (None: nothing this time) in `samples`."""

    def __init__(self, interval):
        self.interval = interval
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples

    def sample(self):
        raise NotImplementedError

    def _run(self):
        while not self._stop.is_set():
            taken = self.sample()
            if taken is not None:
                self.samples.append(taken)
            self._stop.wait(self.interval)


class GaugeSampler(PeriodicSampler):
    """Reads every rank's /metrics through the mock's admin port every `interval` s on a thread of its own,
    from start() to stop(): samples of {gauge: [value per rank]} for the vLLM gauges running, waiting and
    kv_cache_usage_perc (the engines' own view, whoever sent the requests), the simulated engines' outstanding
    tokens (mock_prompt_tokens_pending, mock_decode_tokens_pending), and the counters of generated tokens and
    simulated busy seconds, so that a window of the run has its own throughput."""

    GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
              "kv": "vllm:kv_cache_usage_perc", "generated": "vllm:generation_tokens_total",
              "busy_s": "mock_step_seconds_total", "padded": "mock_padded_tokens_total",
              "real": "mock_real_tokens_total", "prompt_pending": "mock_prompt_tokens_pending",
              "decode_pending": "mock_decode_tokens_pending"}

    def __init__(self, admin_port, ranks, interval=0.05):
        super().__init__(interval)
        self.urls = [f"http://127.0.0.1:{admin_port}/metrics?rank={r}" for r in range(ranks)]

    def sample(self):
        pages = [scrape(url) for url in self.urls]
        return {"t": time.monotonic(), **{key: [metric_sum(page, name) for page in pages]
                                          for key, name in self.GAUGES.items()}}


def window(samples, start, end):
    """The samples taken in [start, end] (monotonic seconds)."""
    return [s for s in samples if start <= s["t"] <= end]


def spread(samples, per_rank):
    """Mean and p95 over `samples` of max - min over the ranks of per_rank(sample) (a list, one per rank)."""
    spreads = [max(values) - min(values) for values in map(per_rank, samples)]
    return {"mean": sum(spreads) / len(spreads) if spreads else 0.0, "p95": percentile(spreads, 95),
            "samples": len(spreads)}


def window_throughput(samples, own_clocks=False):
    """Simulated output tokens per second between the first and the last sample: generated tokens over the
    simulated busy time of the window, and the padded / real decode tokens of the window. Lockstep ranks
    share one clock (rank 0's busy time is every rank's); with own_clocks (ranks stepping on their own, an
    idle one not counting time), the busiest rank's, since that much simulated time passed at least."""
    if len(samples) < 2:
        return {"output_tok_s": 0.0, "padding": 0.0}
    first, last = samples[0], samples[-1]
    busy_deltas = [b - a for a, b in zip(first["busy_s"], last["busy_s"])]
    busy = max(busy_deltas) if own_clocks else busy_deltas[0]
    real = sum(last["real"]) - sum(first["real"])
    return {"output_tok_s": (sum(last["generated"]) - sum(first["generated"])) / busy if busy else 0.0,
            "padding": (sum(last["padded"]) - sum(first["padded"])) / real if real else 0.0}


@contextlib.contextmanager
def work_directory(script, keep_logs):
    """A fresh directory for a benchmark's logs and files (dplb-<script>.XXXX in $TMPDIR), removed with its files
    afterwards, also on errors; with keep_logs it is kept, and its path logged."""
    workdir = Path(tempfile.mkdtemp(prefix=f"dplb-{script}."))
    try:
        yield workdir
    finally:
        if keep_logs:
            log(f"{script}: logs kept in {workdir}")
        else:
            for f in workdir.iterdir():
                f.unlink()
            workdir.rmdir()


def run_cells(script, cells, run_one, opts, report):
    """Runs run_one(workdir, *cell) for each cell (a tuple; alternate the policies within a repeat so that a slow
    moment of the machine hits each alike), in a work directory removed afterwards unless opts.keep_logs. Writes
    <results_dir>/<script>.json (the settings and every run's record) and <script>.md (report(records, elapsed)),
    prints the report, and exits 1 if any run had failed requests; else returns the records."""
    records = []
    started = time.monotonic()
    with work_directory(script, opts.keep_logs) as workdir:
        for cell in cells:
            log(f"{script}: {', '.join(str(part) for part in cell[:-1])}, run {cell[-1] + 1}/{opts.repeats}")
            records.append(run_one(workdir, *cell))
    results = Path(opts.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{script}.json").write_text(json.dumps({
        "settings": {k: v for k, v in vars(opts).items() if k not in ("dplb", "mock", "bench")},
        "runs": records}, indent=1))
    text = report(records, time.monotonic() - started)
    (results / f"{script}.md").write_text(text)
    print(text, end="")
    if any(r["failed"] for r in records):
        raise SystemExit(1)
    return records


def add_run_arguments(parser, repeats=2):
    """The options every comparison script shares: how many runs, the seed, where results and logs go."""
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results-dir", default="bench/results")
    parser.add_argument("--keep-logs", action="store_true")


def compared_policies(opts, script, reference="least-inflight"):
    """Finds the binaries (into opts) and the policies of opts.policies this dplb offers; the reference policy,
    which the ratios are taken against, must be among them."""
    opts.dplb, opts.mock, opts.bench = binaries(opts.build_dir, script)
    policies = offered_policies(opts.dplb, opts.policies, script)
    if reference not in policies:
        raise SystemExit(f"{script}: the policies must include {reference}, the reference")
    return policies
