#!/usr/bin/env python3
"""Chaos soak of the shared ledger (--shared-state): two dplb replicas share one ledger in Redis while Redis is killed and
restarted empty, and a replica is SIGKILLed and restarted under its name, one fault every --fault-every-s seconds.

Run through bench/ledger_soak.sh (its header lists the environment). What runs, all on 127.0.0.1, ephemeral ports:
  - 4 mock ranks (dplb-mock-engine, no simulation: a request is in flight in its engine from its head to its last
    byte), answering slowly (--ttft-ms, --itl-ms, max_tokens drawn in --max-tokens), so that each request lasts a
    second or more and the counts hold still between a request's start and end;
  - one redis-server (no persistence) on a port that stays the same across its restarts;
  - replicas a and b: the same backend list, --shared-state redis://127.0.0.1:PORT, --replica-name a / b, tenants
    from a config file (alpha and beta by API key, gamma by the X-Tenant header and rate-limited, and the default
    tenant) and --max-inflight-per-rank, so that some requests wait in the ledger's line; each on a port that stays
    the same across its restarts;
  - a closed-loop client (--concurrency connections, in this process): each connection opens to a replica (a and
    b in turn), sends 1 to 4 requests (half streaming; each as one of the tenants, drawn), then closes;
    --abandon-fraction of the streams are closed by the client after their first chunk.
The faults alternate: (1) Redis SIGKILLed, restarted empty on its port --redis-down-s later; (2) a replica (a, then
b, ...) SIGKILLed, restarted under the same --replica-name on its port --replica-down-s later. Each down time
is taken in turn from its list: by default Redis 1 then 4 s, a replica 2 s (its restart replaces its entry in the
ledger) then 6 s (its lease runs out first).

What is checked (exit status 0 only if everything holds):
  - No unexpected client error. Expected are: gamma's 429 (with Retry-After and an OpenAI-style error body); a
    request cut, or a connection refused, by the replica it went to while that replica was killed (from the kill
    to its restart listening, plus --cut-grace-s); the streams the client abandons itself. Anything else (another
    status, a bad or truncated body, a reset or refusal from a live replica, a request that hangs) is unexpected.
  - The ledger's counts equal the engines' in flight within --match-within-s of each fault. A sampler reads, in a
    loop: every engine's vllm:num_requests_running + vllm:num_requests_waiting (through the mock's admin port), then
    the ledger straight from Redis (its own connection: SCAN for `{dplb:*}:total`, then HGETALL; an absent key is
    all 0; the fields that are rank numbers), then the engines again. A sample matches when both engine readings
    are equal (nothing started or ended meanwhile) and the ledger equals them, rank by rank, with load on (some
    request in flight) and one ledger in Redis. A fault's clock starts where the contract starts it: at the kill
    for a replica (a dead replica leaves the ledger within 5 s, or is replaced by its restart), at the restart
    (Redis answering again) for Redis (every replica back and registered within 5 s). The time from it to the end
    of the first matching sample is the fault's time to match (after a kill, samples begun before --kill-notice-s
    do not count: the engines may not have dropped the dead replica's requests yet, and ledger and engines would
    still agree on them); none within --match-within-s fails the fault. The time from the kill is reported too.
  - At the end, load stopped: every dplb_rank_inflight 0 on both replicas, dplb_shared_state_up 1 and
    dplb_shared_state_replicas 2 on both, the ledger's total all 0 (or absent), the engines idle; waited for,
    bounded (--settle-s).
Standard library only; every process is stopped by its own pid, on failure and on SIGINT/SIGTERM too.
"""

import argparse
import asyncio
import collections
import datetime
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Process, dechunk, metric_sum, start_mock, start_redis

RANKS = 4
REPLICAS = ("a", "b")
TENANTS = (("alpha", "Authorization: Bearer sk-ledger-soak-alpha"),
           ("beta", "Authorization: Bearer sk-ledger-soak-beta"),
           ("gamma", "X-Tenant: gamma"),
           ("default", ""))
RATE_LIMITED = "gamma"


def log(msg):
    print(f"[ledger-soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Small asyncio clients: HTTP/1.1 (Connection: close) for scrapes, RESP for Redis.


async def http_get(port, target, timeout=5.0):
    """GET on its own connection; the body as text. Raises on any failure."""
    async def go():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            data = await reader.read()
        finally:
            writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"GET {target} on {port}: {head[:40]!r}")
        if b"transfer-encoding: chunked" in head.lower():
            body = dechunk(body)
        return body.decode()
    return await asyncio.wait_for(go(), timeout)


def resp_command(*parts):
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


async def resp_reply(reader):
    line = await reader.readuntil(b"\r\n")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError("redis: " + rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = await reader.readexactly(n + 2)
        return data[:-2].decode()
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [await resp_reply(reader) for _ in range(n)]
    raise RuntimeError(f"redis: unexpected reply {line!r}")


async def read_ledger(port, timeout=1.0):
    """The ledger's total, {rank: requests} (every rank present, an absent field or key being 0), read straight from
    Redis; and the total keys found (normally one). None when Redis does not answer."""
    async def go():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            keys, cursor = [], "0"
            while True:
                writer.write(resp_command("SCAN", cursor, "MATCH", "{dplb:*}:total", "COUNT", "1000"))
                cursor, found = await resp_reply(reader)
                keys += found
                if cursor == "0":
                    break
            counts = {r: 0 for r in range(RANKS)}
            for key in keys:
                writer.write(resp_command("HGETALL", key))
                flat = await resp_reply(reader)
                for field, value in zip(flat[::2], flat[1::2]):
                    if field.isdigit():  # "<rank>"; "<rank>:p" and "<rank>:c" are tokens (least-tokens)
                        counts[int(field)] = counts.get(int(field), 0) + int(value)
            return counts, sorted(keys)
        finally:
            writer.close()
    try:
        return await asyncio.wait_for(go(), timeout)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, RuntimeError):
        return None


async def engines_in_flight(admin_port):
    """{rank: running + waiting} as every engine reports it (the mock's admin port serves each rank's /metrics)."""
    pages = await asyncio.gather(*(http_get(admin_port, f"/metrics?rank={r}") for r in range(RANKS)))
    return {r: int(metric_sum(page, "vllm:num_requests_running") + metric_sum(page, "vllm:num_requests_waiting"))
            for r, page in enumerate(pages)}


# ---------------------------------------------------------------------------------------------------------------
# The processes


class Replica:
    """One dplb replica: its name, its port (the same across restarts), its process and its incarnations."""

    def __init__(self, name):
        self.name = name
        self.port = 0
        self.proc = None
        self.starts = 0
        self.down_since = None           # monotonic time of the kill, while it is down
        self.down_windows = []           # [(killed at, listening again at)]

    def was_down(self, start, end, grace):
        """Whether this replica was killed at some time in [start - grace, end + grace] (or is down now)."""
        if self.down_since is not None and self.down_since <= end + grace:
            return True
        return any(k - grace <= end and start <= b + grace for k, b in self.down_windows)


class Fleet:
    """Every process of the soak, each stopped by its own pid (stop_all, also on errors and signals)."""

    def __init__(self, opts, workdir):
        self.opts, self.workdir = opts, workdir
        self.mock = self.redis = None
        self.redis_port = 0
        self.redis_starts = 0
        self.replicas = {name: Replica(name) for name in REPLICAS}
        self.backends = []
        self.admin = 0

    def start(self):
        o = self.opts
        self.mock, ports, self.admin = start_mock(
            o.mock, ["--ranks", str(RANKS), "--threads", "1", "--ttft-ms", str(o.ttft_ms), "--itl-ms", str(o.itl_ms)],
            self.workdir / "mock.log")
        self.backends = [f"http://127.0.0.1:{p}" for p in ports]
        self.start_redis()
        beta_digest = hashlib.sha256(b"sk-ledger-soak-beta").hexdigest()
        (self.workdir / "tenants.json").write_text(json.dumps({"tenants": [
            {"name": "alpha", "api_keys": ["sk-ledger-soak-alpha"], "weight": 3},
            {"name": "beta", "api_key_sha256": [beta_digest], "weight": 1, "max_queued": 1000},
            {"name": "gamma", "weight": 2, "requests_per_second": o.gamma_rps, "burst": o.gamma_burst}]}))
        for replica in self.replicas.values():
            self.start_replica(replica)

    def start_redis(self):
        self.redis_starts += 1
        self.redis, self.redis_port = start_redis(self.workdir / f"redis.{self.redis_starts}.log",
                                                  port=self.redis_port or None)

    def replica_args(self, replica):
        o = self.opts
        args = ["--backend", ",".join(self.backends), "--threads", "1",
                "--shared-state", f"redis://127.0.0.1:{self.redis_port}", "--replica-name", replica.name,
                "--config", str(self.workdir / "tenants.json"), "--tenant-header", "X-Tenant",
                "--max-inflight-per-rank", str(o.max_inflight)] + o.dplb_args.split()
        # The first start takes an ephemeral port; a restart takes that one again, where the client and the
        # scrapes look for the replica.
        return [o.dplb, "--listen", f"127.0.0.1:{replica.port}", "--log-level", "info"] + args

    def start_replica(self, replica):
        replica.starts += 1
        proc = Process(self.replica_args(replica), self.workdir / f"dplb-{replica.name}.{replica.starts}.log")
        try:
            replica.port = int(proc.await_line(r"listening on 127\.0\.0\.1:(\d+)").group(1))
        except BaseException:
            proc.stop()
            raise
        replica.proc = proc

    def stop_all(self):
        for proc in [r.proc for r in self.replicas.values()] + [self.mock, self.redis]:
            if proc is not None:
                proc.stop(timeout=5)


def sigkill(proc):
    """SIGKILL, by pid, and reap it."""
    proc.proc.kill()
    proc.proc.wait()
    proc.log_file.close()


# ---------------------------------------------------------------------------------------------------------------
# The load


class Outcome:
    OK_STREAM, OK_PLAIN = "ok_stream", "ok_nonstream"


class Client:
    """The closed-loop client: --concurrency connections, each to a replica in turn, 1 to 4 requests each."""

    def __init__(self, opts, fleet, t0):
        self.opts, self.fleet, self.t0 = opts, fleet, t0
        self.rng = random.Random(opts.seed)
        self.stop = asyncio.Event()
        self.count = collections.Counter()
        self.by_replica = collections.Counter()
        self.connections = collections.Counter()
        # Per replica: seconds from sending to the whole answer, less the engine's own time for it (ttft + tokens x
        # itl): mostly the wait in the ledger's line (--max-inflight-per-rank), which a replica's share depends on.
        self.waits = collections.defaultdict(list)
        self.samples = []

    def unexpected(self, reason, detail):
        self.count["unexpected_" + reason] += 1
        if len(self.samples) < 30:
            self.samples.append(f"{reason} t={time.monotonic() - self.t0:.2f}s: {detail}")
            log("UNEXPECTED " + self.samples[-1])

    async def slot(self, index):
        rng = random.Random(f"{self.opts.seed}-{index}")
        # Each connection to the other replica than the slot's last one (half the slots start with each): the
        # replicas take even shares of connections, whatever the draws; one refused, the next goes to the other.
        for turn in itertools.count(index):
            if self.stop.is_set():
                break
            replica = self.fleet.replicas[REPLICAS[turn % len(REPLICAS)]]
            started = time.monotonic()
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", replica.port), 5)
            except (OSError, asyncio.TimeoutError) as e:
                if replica.was_down(started, time.monotonic(), self.opts.cut_grace_s):
                    self.count[f"refused_while_down_{replica.name}"] += 1
                else:
                    self.unexpected("connect_failed", f"replica {replica.name}: {e!r}")
                await asyncio.sleep(0.05)  # a client backing off before it tries again
                continue
            self.connections[replica.name] += 1
            try:
                for left in range(rng.randint(1, 4), 0, -1):
                    if self.stop.is_set():
                        break
                    if not await self.request(rng, replica, reader, writer, last=(left == 1)):
                        break
            finally:
                writer.close()

    async def request(self, rng, replica, reader, writer, last):
        """One request on an open connection; True when the connection may carry the next one."""
        o = self.opts
        tenant, header = rng.choice(TENANTS)
        stream = rng.random() < 0.5
        max_tokens = rng.randint(*o.max_tokens)
        abandon = stream and rng.random() < o.abandon_fraction
        body = json.dumps({"model": "mock-model", "prompt": "the quick brown fox", "max_tokens": max_tokens,
                           "stream": stream}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{replica.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                + (f"{header}\r\n" if header else "") + ("Connection: close\r\n" if last else "") + "\r\n")
        t0 = time.monotonic()
        status, got_head, text = None, False, b""
        try:
            async def exchange():
                nonlocal status, got_head, text
                writer.write(head.encode() + body)
                await writer.drain()
                raw_head = await reader.readuntil(b"\r\n\r\n")
                got_head = True
                lines = raw_head.decode(errors="replace").split("\r\n")
                status = int(lines[0].split(" ")[1])
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
                if headers.get("transfer-encoding", "").lower() == "chunked":
                    while True:
                        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                        if size == 0:
                            await reader.readuntil(b"\r\n")
                            break
                        text += (await reader.readexactly(size + 2))[:-2]
                        if abandon:
                            return headers, "abandoned"
                else:
                    text = await reader.readexactly(int(headers.get("content-length", "0")))
                return headers, headers.get("connection", "").lower()
            headers, connection = await asyncio.wait_for(exchange(), o.request_timeout_s)
        except asyncio.TimeoutError:
            self.unexpected("request_hung", f"replica {replica.name} tenant {tenant} stream={stream} status={status}: "
                            f"nothing complete after {o.request_timeout_s} s")
            return False
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            if replica.was_down(t0, time.monotonic(), o.cut_grace_s):
                self.count[f"cut_by_kill_{replica.name}"] += 1
            else:
                self.unexpected("connection_lost", f"replica {replica.name} tenant {tenant} stream={stream} "
                                f"head={'yes' if got_head else 'no'} status={status} after "
                                f"{time.monotonic() - t0:.2f} s: {e!r}")
            return False
        self.count[f"sent_as_{tenant}"] += 1
        if connection == "abandoned":
            self.count["abandoned_by_client"] += 1
            return False
        if status == 429 and tenant == RATE_LIMITED:
            if "retry-after" in headers and b'"error"' in text:
                self.count["rate_limited_" + tenant] += 1
            else:
                self.unexpected("bad_429", f"Retry-After {headers.get('retry-after')}, body {text[:200]!r}")
            return connection != "close"
        if status != 200:
            self.unexpected(f"status_{status}", f"replica {replica.name} tenant {tenant}: {text[:300]!r}")
            return connection != "close"
        if stream:
            good = text.count(b'"text":" tok"') == max_tokens and text.endswith(b"data: [DONE]\n\n")
        else:
            good = b'"completion_tokens":%d' % max_tokens in text
        if not good:
            self.unexpected("bad_body", f"replica {replica.name} stream={stream}: {text[:300]!r}")
            return False
        self.count[Outcome.OK_STREAM if stream else Outcome.OK_PLAIN] += 1
        self.by_replica[replica.name] += 1
        self.waits[replica.name].append(time.monotonic() - t0 - (o.ttft_ms + (max_tokens - 1) * o.itl_ms) / 1000)
        return connection != "close"


# ---------------------------------------------------------------------------------------------------------------
# The sampler: engines, ledger, engines


class Sampler:
    def __init__(self, opts, fleet, t0):
        self.opts, self.fleet, self.t0 = opts, fleet, t0
        self.samples = []   # dicts: start, end, engines, ledger (None: Redis silent), engines_after, keys, match
        self.stop = asyncio.Event()

    async def sample_once(self):
        start = time.monotonic()
        try:
            before = await engines_in_flight(self.fleet.admin)
            read = await read_ledger(self.fleet.redis_port)
            after = await engines_in_flight(self.fleet.admin)
        except (OSError, asyncio.TimeoutError, RuntimeError, ValueError):
            return None
        ledger, keys = read if read else (None, [])
        match = (ledger is not None and before == after and ledger == before and sum(before.values()) > 0
                 and len(keys) <= 1)
        return {"start": start, "end": time.monotonic(), "engines": before, "ledger": ledger, "engines_after": after,
                "keys": keys, "match": match}

    async def run(self):
        while not self.stop.is_set():
            s = await self.sample_once()
            if s is not None:
                self.samples.append(s)
            try:
                await asyncio.wait_for(self.stop.wait(), self.opts.sample_every_s)
            except asyncio.TimeoutError:
                pass


# ---------------------------------------------------------------------------------------------------------------
# The faults


class Faults:
    def __init__(self, opts, fleet, t0):
        self.opts, self.fleet, self.t0 = opts, fleet, t0
        self.done = []   # dicts: kind, target, killed, back, clock (when the ledger must be right again at the latest)

    def schedule(self):
        """The fault times (seconds after the load's start) that leave each fault its whole window before the end."""
        o = self.opts
        times, t = [], o.fault_every_s
        while t + max(o.redis_down_s + o.replica_down_s) + o.match_within_s + 1 <= o.duration_s:
            times.append(t)
            t += o.fault_every_s
        return times

    async def run(self, times):
        loop = asyncio.get_running_loop()
        next_replica = 0
        for i, at in enumerate(times):
            await asyncio.sleep(max(0.0, self.t0 + at - time.monotonic()))
            if i % 2 == 0:
                down = self.opts.redis_down_s[(i // 2) % len(self.opts.redis_down_s)]
                killed = time.monotonic()
                sigkill(self.fleet.redis)
                log(f"fault {i + 1}: Redis (pid {self.fleet.redis.pid}) killed; back in {down:g} s, "
                    f"empty, on port {self.fleet.redis_port}")
                await asyncio.sleep(down)
                await loop.run_in_executor(None, self.fleet.start_redis)
                back = time.monotonic()
                self.done.append({"kind": "redis", "target": "redis", "killed": killed, "back": back, "clock": back})
            else:
                replica = self.fleet.replicas[REPLICAS[next_replica % len(REPLICAS)]]
                down = self.opts.replica_down_s[next_replica % len(self.opts.replica_down_s)]
                next_replica += 1
                replica.down_since = killed = time.monotonic()
                sigkill(replica.proc)
                log(f"fault {i + 1}: replica {replica.name} (pid {replica.proc.pid}) killed; back in "
                    f"{down:g} s on port {replica.port}")
                await asyncio.sleep(down)
                await loop.run_in_executor(None, self.fleet.start_replica, replica)
                back = time.monotonic()
                replica.down_windows.append((killed, back))
                replica.down_since = None
                self.done.append({"kind": "replica", "target": replica.name, "killed": killed, "back": back,
                                  "clock": killed})


LOST_LINE = re.compile(r"^(\S+) warning dplb: shared state: lost the connection to Redis")


def ledger_drops(workdir, faults, wall_minus_mono):
    """Each replica's drops of its ledger connection outside the Redis faults (from a kill to 1 s after the restart):
    a command's deadline (--shared-state-timeout-ms) missed. For that reconnection's 100 ms and more the replica
    picks by its own counts, which may pass --max-inflight-per-rank over the replicas. {replica: [monotonic times]}"""
    windows = [(f["killed"], f["back"] + 1.0) for f in faults if f["kind"] == "redis"]
    out = {}
    for name in REPLICAS:
        times = []
        for path in sorted(workdir.glob(f"dplb-{name}.*.log")):
            for line in path.read_text(errors="replace").splitlines():
                m = LOST_LINE.match(line)
                if m:
                    at = datetime.datetime.fromisoformat(m.group(1)).timestamp() - wall_minus_mono
                    if not any(a <= at <= b for a, b in windows):
                        times.append(at)
        out[name] = sorted(times)
    return out


def time_to_match(fault, samples, horizon, notice_s):
    """Seconds from the fault's clock to the end of the first matching sample, looking up to `horizon` seconds on;
    (None, None) if none. After a replica's kill a sample counts only from `notice_s` on: the engines notice the
    dead replica's connections close within milliseconds, and a sample taken before they do would see the engines
    and the ledger both still counting its requests, a match that shows nothing."""
    earliest = fault["clock"] + (notice_s if fault["kind"] == "replica" else 0.0)
    for s in samples:
        if s["start"] >= earliest and s["end"] <= fault["clock"] + horizon and s["match"]:
            return s["end"] - fault["clock"], s
    return None, None


# ---------------------------------------------------------------------------------------------------------------
# The end


async def replica_metrics(fleet):
    out = {}
    for name, r in fleet.replicas.items():
        try:
            text = await http_get(r.port, "/metrics")
        except (OSError, asyncio.TimeoutError, RuntimeError) as e:
            out[name] = {"error": repr(e)}
            continue
        inflight = {}
        for line in text.splitlines():
            if line.startswith("dplb_rank_inflight{"):
                rank = re.search(r'rank="([^"]+)"', line).group(1)
                inflight[rank] = float(line.rsplit(" ", 1)[1])
        errors = {}
        for line in text.splitlines():
            if line.startswith("dplb_shared_state_errors_total{"):
                op = re.search(r'op="([^"]+)"', line).group(1)
                errors[op] = int(float(line.rsplit(" ", 1)[1]))
        out[name] = {"inflight": inflight, "up": metric_sum(text, "dplb_shared_state_up"),
                     "replicas": metric_sum(text, "dplb_shared_state_replicas"), "errors": errors}
    return out


def settled(end):
    reps = end["replicas"]
    return (all("error" not in m and m["inflight"] and all(v == 0 for v in m["inflight"].values()) and m["up"] == 1
                and m["replicas"] == len(REPLICAS) for m in reps.values())
            and end["ledger"] is not None and all(v == 0 for v in end["ledger"].values())
            and end["engines"] is not None and all(v == 0 for v in end["engines"].values()))


async def end_state(fleet, settle_s):
    deadline = time.monotonic() + settle_s
    while True:
        read = await read_ledger(fleet.redis_port)
        try:
            engines = await engines_in_flight(fleet.admin)
        except (OSError, asyncio.TimeoutError, RuntimeError):
            engines = None
        end = {"replicas": await replica_metrics(fleet), "ledger": read[0] if read else None,
               "ledger_keys": read[1] if read else [], "engines": engines}
        if settled(end) or time.monotonic() > deadline:
            end["settled"] = settled(end)
            return end
        await asyncio.sleep(0.1)


# ---------------------------------------------------------------------------------------------------------------


async def soak(opts, fleet):
    t0 = time.monotonic()
    # The ledger must be up on both replicas before the load starts (bounded).
    deadline = t0 + 10
    while True:
        metrics = await replica_metrics(fleet)
        if all(m.get("up") == 1 for m in metrics.values()):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"ledger_soak: dplb_shared_state_up not 1 on both replicas within 10 s: {metrics}")
        await asyncio.sleep(0.05)

    t0 = time.monotonic()
    client, sampler, faults = Client(opts, fleet, t0), Sampler(opts, fleet, t0), Faults(opts, fleet, t0)
    times = faults.schedule()
    log(f"load: {opts.concurrency} connections over replicas a (port {fleet.replicas['a'].port}) and b (port "
        f"{fleet.replicas['b'].port}) for {opts.duration_s:g} s; {len(times)} faults at {times} s")
    slots = [asyncio.create_task(client.slot(i)) for i in range(opts.concurrency)]
    sampling = asyncio.create_task(sampler.run())
    faulting = asyncio.create_task(faults.run(times))
    progress_at = t0
    while time.monotonic() - t0 < opts.duration_s:
        await asyncio.sleep(1.0)
        if time.monotonic() - progress_at >= 10:
            progress_at = time.monotonic()
            unexpected = sum(v for k, v in client.count.items() if k.startswith("unexpected_"))
            ok = client.count[Outcome.OK_STREAM] + client.count[Outcome.OK_PLAIN]
            matched = sum(s["match"] for s in sampler.samples)
            log(f"t={progress_at - t0:.0f}s: {ok} requests served, {len(faults.done)} faults, unexpected {unexpected}, "
                f"samples {matched}/{len(sampler.samples)} matching")
    await faulting
    load_end = time.monotonic()
    client.stop.set()
    _, hung = await asyncio.wait(slots, timeout=opts.request_timeout_s + 5)
    for task in hung:
        task.cancel()
    sampler.stop.set()
    await sampling
    end = await end_state(fleet, opts.settle_s)
    drops = ledger_drops(fleet.workdir, faults.done, time.time() - time.monotonic())
    return report(opts, client, sampler, faults, end, load_end - t0, bool(hung), drops)


def report(opts, client, sampler, faults, end, duration, hung, drops):
    failures = []
    c = client.count
    samples = sampler.samples
    print()
    print("=== dplb ledger chaos soak ===")
    print(f"load:        {duration:.0f} s, {opts.concurrency} connections over replicas a and b, half streaming, "
          f"{opts.max_tokens[0]}-{opts.max_tokens[1]} tokens at {opts.itl_ms} ms, --max-inflight-per-rank "
          f"{opts.max_inflight}; a fault every {opts.fault_every_s:g} s")
    rows = []
    for i, f in enumerate(faults.done):
        took, s = time_to_match(f, samples, opts.match_within_s, opts.kill_notice_s)
        late, _ = (None, None) if took is not None else time_to_match(f, samples, opts.fault_every_s,
                                                                      opts.kill_notice_s)
        window = [x for x in samples if f["clock"] <= x["start"] and x["end"] <= f["clock"] + opts.match_within_s]
        rows.append({"fault": i + 1, "kind": f["kind"], "target": f["target"], "at_s": f["killed"] - client.t0,
                     "down_s": f["back"] - f["killed"], "time_to_match_s": took,
                     "from_kill_s": (s["end"] - f["killed"]) if s else None, "late_match_s": late,
                     "samples": len(window), "matching": sum(x["match"] for x in window),
                     "engines_at_match": s["engines"] if s else None})
        r = rows[-1]
        what = "Redis killed, restarted empty" if f["kind"] == "redis" else f"replica {f['target']} killed, restarted"
        clock = "restart" if f["kind"] == "redis" else "kill"
        if took is None:
            failures.append(f"fault {i + 1} ({what}): no match within {opts.match_within_s:g} s"
                            + (f" (first match after {late:.2f} s)" if late is not None else ""))
            found = "NO MATCH" + (f" (late: {late:.2f} s)" if late is not None else "")
            last = window[-1] if window else None
            if last:
                found += f"; last sample engines {last['engines']} ledger {last['ledger']} keys {last['keys']}"
        else:
            found = (f"match {took:.2f} s after the {clock} ({r['from_kill_s']:.2f} s after the kill), "
                     f"engines {s['engines']}")
        print(f"  fault {i + 1:2d} t={r['at_s']:6.1f}s {what:38s} down {r['down_s']:.2f} s: {found}; "
              f"{r['matching']}/{r['samples']} samples matching in the window")
    times = [r["time_to_match_s"] for r in rows if r["time_to_match_s"] is not None]
    if times:
        print(f"time to match: max {max(times):.2f} s, median {statistics.median(times):.2f} s over {len(times)} of "
              f"{len(rows)} faults (clock: Redis's restart, a replica's kill)")
        for kind in ("redis", "replica"):
            k = [r["time_to_match_s"] for r in rows if r["kind"] == kind and r["time_to_match_s"] is not None]
            if k:
                print(f"  {kind:8s} max {max(k):.2f} s, median {statistics.median(k):.2f} s ({len(k)} faults)")
    kinds = collections.Counter(f["kind"] for f in faults.done)
    if kinds["redis"] == 0 or kinds["replica"] == 0:
        failures.append(f"not every kind of fault happened: {dict(kinds)}")
    # Away from faults (no fault within the last match_within_s + down time), how often the sampler saw a match:
    # the share lost to counts moving between the reads, not a check.
    quiet = [s for s in samples if not any(f["killed"] <= s["start"] <= f["back"] + opts.match_within_s
                                           for f in faults.done)]
    if quiet:
        print(f"samples away from faults: {sum(s['match'] for s in quiet)}/{len(quiet)} matching "
              f"({100 * sum(s['match'] for s in quiet) / len(quiet):.0f}%; the rest saw a count move between reads); "
              f"{len(samples)} samples in all, one every {opts.sample_every_s:g} s")
        # A figure, not a check: a pick the ledger does not answer within --shared-state-timeout-ms is made by the
        # replica's own counts, which may pass the global bound.
        most = max(max(s["engines"].values()) for s in quiet)
        over = [s for s in quiet if max(s["engines"].values()) > opts.max_inflight]
        episodes = [s["start"] - client.t0 for i, s in enumerate(over)
                    if i == 0 or s["start"] - over[i - 1]["end"] > 0.5]
        print(f"engines' in flight on a rank away from faults: at most {most} (--max-inflight-per-rank "
              f"{opts.max_inflight}; {len(over)} of {len(quiet)} samples above it"
              + (f", in {len(episodes)} episodes from t=" + ", ".join(f"{t:.1f}" for t in episodes[:10]) + " s"
                 if over else "") + ")")
    print("ledger connection dropped outside Redis faults (a command past --shared-state-timeout-ms; the replica "
          "then picks alone for 100 ms or more): " + "; ".join(
              f"{n} {len(t)} times" + (" at t=" + ", ".join(f"{x - client.t0:.1f}" for x in t[:10]) + " s" if t else "")
              for n, t in drops.items()))
    extra_keys = {tuple(s["keys"]) for s in samples if len(s["keys"]) > 1}
    if extra_keys:
        failures.append(f"more than one ledger total in Redis: {sorted(extra_keys)}")

    ok = c[Outcome.OK_STREAM] + c[Outcome.OK_PLAIN]
    expected = {k: v for k, v in sorted(c.items())
                if k.startswith(("rate_limited_", "cut_by_kill_", "refused_while_down_", "abandoned_by_client"))}
    unexpected = {k: v for k, v in sorted(c.items()) if k.startswith("unexpected_")}
    print(f"requests:    {ok} served 200 (stream {c[Outcome.OK_STREAM]}, non-stream {c[Outcome.OK_PLAIN]}; "
          f"through a {client.by_replica['a']}, b {client.by_replica['b']}); by tenant "
          f"{ {t: c['sent_as_' + t] for t, _ in TENANTS} }")
    for n in REPLICAS:
        waits = sorted(client.waits[n]) or [0.0]
        print(f"  replica {n}: {client.connections[n]} connections, {client.by_replica[n]} served; wait beyond the "
              f"engine's own time mean {statistics.mean(waits):.2f} s, p90 {waits[int(0.9 * (len(waits) - 1))]:.2f} s")
    print(f"expected:    {expected}")
    print(f"UNEXPECTED:  {unexpected or 0}")
    for s in client.samples[:10]:
        print(f"    {s}")
    if unexpected:
        failures.append(f"{sum(unexpected.values())} unexpected client errors: {unexpected}")
    if hung:
        failures.append("client connections still busy after the load stopped")
    if c["rate_limited_" + RATE_LIMITED] == 0:
        failures.append(f"tenant {RATE_LIMITED} was never rate-limited: its 429 path was not exercised")
    if ok == 0:
        failures.append("no request served")

    print(f"end:         engines in flight {end['engines']}; ledger total {end['ledger']} (keys {end['ledger_keys']})")
    for name, m in end["replicas"].items():
        print(f"  replica {name}: " + (m["error"] if "error" in m else
              f"dplb_rank_inflight {m['inflight']}, dplb_shared_state_up {m['up']:g}, "
              f"dplb_shared_state_replicas {m['replicas']:g}, dplb_shared_state_errors_total (this incarnation) "
              f"{m['errors']}"))
    if not end["settled"]:
        failures.append(f"not idle and up within {opts.settle_s:g} s of the load's end (see 'end' above)")

    print("RESULT: " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)))
    summary = {"duration_s": duration, "faults": rows,
               "ledger_drops_s": {n: [x - client.t0 for x in t] for n, t in drops.items()},
               "time_to_match_max_s": max(times) if times else None,
               "time_to_match_median_s": statistics.median(times) if times else None,
               "counts": dict(c), "by_replica": dict(client.by_replica), "end": end, "failures": failures,
               "settings": {k: v for k, v in vars(opts).items() if k not in ("dplb", "mock")}}
    return summary


def seconds_list(text):
    values = [float(x) for x in text.split(",") if x.strip()]
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of seconds")
    return values


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build-dir", default="build")
    p.add_argument("--duration-s", type=float, default=300)
    p.add_argument("--fault-every-s", type=float, default=20)
    p.add_argument("--redis-down-s", type=seconds_list, default=[1.0, 4.0],
                   help="from Redis's kill to its restart: comma-separated seconds, taken in turn (4 s lets the "
                        "replicas' reconnect back off to its longest pause)")
    p.add_argument("--replica-down-s", type=seconds_list, default=[2.0, 6.0],
                   help="from a replica's kill to its restart: comma-separated seconds, taken in turn (2 s: its "
                        "restart replaces its entry; 6 s: its lease runs out first)")
    p.add_argument("--match-within-s", type=float, default=5.0)
    p.add_argument("--kill-notice-s", type=float, default=0.5,
                   help="after a replica's kill, samples count from this on (the engines have dropped its requests)")
    p.add_argument("--concurrency", type=int, default=24)
    p.add_argument("--max-inflight", type=int, default=5, help="dplb's --max-inflight-per-rank")
    p.add_argument("--ttft-ms", type=int, default=20)
    p.add_argument("--itl-ms", type=int, default=40)
    p.add_argument("--max-tokens", type=int, nargs=2, default=(25, 75), help="each request's, drawn uniformly")
    p.add_argument("--gamma-rps", type=float, default=1.0, help="the rate-limited tenant's requests_per_second")
    p.add_argument("--gamma-burst", type=int, default=2)
    p.add_argument("--abandon-fraction", type=float, default=0.02, help="streams closed by the client mid-way")
    p.add_argument("--cut-grace-s", type=float, default=0.5,
                   help="a request cut this close to its replica's down time is explained by it")
    p.add_argument("--sample-every-s", type=float, default=0.05)
    p.add_argument("--request-timeout-s", type=float, default=40)
    p.add_argument("--settle-s", type=float, default=10)
    p.add_argument("--dplb-args", default="", help="more options for both replicas")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep-logs", action="store_true")
    p.add_argument("--json-out")
    opts = p.parse_args()
    build = Path(opts.build_dir)
    opts.dplb, opts.mock = str(build / "dplb"), str(build / "tools/mock_engine/dplb-mock-engine")
    for binary in (opts.dplb, opts.mock):
        if not os.access(binary, os.X_OK):
            sys.exit(f"ledger_soak: {binary} not found; build first (./scripts/build.sh {opts.build_dir})")
    if not shutil.which("redis-server"):
        sys.exit("ledger_soak: needs redis-server (Debian redis-server)")

    # SIGTERM ends the soak as Ctrl-C does (asyncio.run cancels the soak's task on a SIGINT, then raises
    # KeyboardInterrupt): through the finally below, every process stopped by its pid.
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    workdir = Path(tempfile.mkdtemp(prefix="dplb-ledger-soak."))
    fleet = Fleet(opts, workdir)
    passed = False
    try:
        fleet.start()
        log(f"mock ranks {fleet.backends}, Redis on {fleet.redis_port}, replicas a on {fleet.replicas['a'].port} "
            f"and b on {fleet.replicas['b'].port}; logs in {workdir}")
        summary = asyncio.run(soak(opts, fleet))
        passed = not summary["failures"]
        if opts.json_out:
            Path(opts.json_out).write_text(json.dumps(summary, indent=1))
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        fleet.stop_all()
        if passed and not opts.keep_logs:
            shutil.rmtree(workdir)
        else:
            log(f"logs kept in {workdir}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
