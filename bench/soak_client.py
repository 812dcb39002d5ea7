#!/usr/bin/env python3
"""Soak client for dplb: drives a large number of requests through dplb while injecting faults into
the mock engine, then checks what the clients saw against what was injected.

Started by bench/soak.sh (which starts the mock engine and dplb); usable by hand:

  python3 bench/soak_client.py --dplb 127.0.0.1:8000 --admin 127.0.0.1:29100 --ranks 4 \
      --dplb-pid 1234 --requests 1000000

Standard library only. One asyncio event loop, callback-based protocols (no coroutine per request, no
http.client): a minimal HTTP/1.1 client with keep-alive that parses Content-Length and chunked bodies.

What is injected (through the mock's admin API):
  - client disconnects: a fraction of requests close their connection on purpose (right after sending
    a non-streaming request; after the response head or the first chunk of a stream);
  - engine resets: `reset_after_events` (a stream is cut after N events: the client must see a
    truncated chunked stream) and `reset_on_request` (RST before any response byte: dplb must retry
    elsewhere, invisibly) on one rank at a time, for short periods;
  - a rank killed and restarted: `{"listening": false}`, then `true` a few seconds later, repeatedly.
Faults go only to the ranks in --fault-ranks (default 0 and 1), so that the others always have
capacity: a 502 or 503 is then never explained by a fault. With every rank faulted, dplb's passive
ejection can take all ranks out at once (503s); --fault-ranks 0,1,2,3 shows it.

Every client-visible problem is classified:
  - caused by the client or by a fault: a truncated response from a rank that had a truncating fault
    (`reset_after_events`, or killed) while the request ran; a connection the client closed itself;
  - unexpected: anything else (a non-200 status, a truncation no fault explains, a connection closed
    before any response byte, a bad body, a request that hung). Must be 0.

Tenants mode (--tenants, bench/soak.sh's SOAK_TENANTS=1, against a dplb with tenants and
--max-inflight-per-rank): each request is sent as one of the tenants (its key as `Authorization: Bearer`,
the --tenant-header naming it, or neither: `default`) with a random body `priority` (--priorities), and
--queued-disconnect-fraction of them are abandoned after a few milliseconds if nothing has come back (most
while in dplb's queue). A 429 with Retry-After is expected for a tenant of --rate-limited (its
requests_per_second), and at least one must come; a 429 for any other tenant is a failure.

At the end: every dplb_rank_inflight must be 0, dplb's accounting must match what was sent, the mock
must have no request still running, and dplb's RSS at the end must stay within --rss-slack-mib of its
RSS after the warm-up. dplb_queue_depth and every dplb_tenant_queued and dplb_tenant_in_flight must be 0;
in tenants mode dplb_tenant_requests_total must have counted every request once, under the tenant it was
sent as. Exit status 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import re
import socket
import sys
import time

from benchlib import dechunk  # bench/ is this script's directory, first on sys.path

# ---------------------------------------------------------------------------------------------------
# Small helpers


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def split_hostport(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    return host, int(port)


def rss_kib(pid: int) -> int:
    """VmRSS of a process in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


async def http_call(addr: tuple[str, int], method: str, target: str, body: bytes = b"",
                    timeout: float = 10.0) -> tuple[int, bytes]:
    """One request on its own connection (Connection: close); returns (status, body)."""
    async def go() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection(*addr)
        try:
            head = (f"{method} {target} HTTP/1.1\r\nHost: {addr[0]}:{addr[1]}\r\nConnection: close\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
            writer.write(head + body)
            await writer.drain()
            data = await reader.read()  # until the server closes
        finally:
            writer.close()
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head[9:12])
        headers = {}
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower()] = v.strip()
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            rest = dechunk(rest)
        elif b"content-length" in headers:
            rest = rest[:int(headers[b"content-length"])]
        return status, rest
    return await asyncio.wait_for(go(), timeout)


METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = METRIC_LINE.match(line)
        if not m:
            continue
        labels = dict(LABEL.findall(m.group(2) or ""))
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), labels, value))
    return out


def metric_sum(samples, name: str, **match) -> float:
    return sum(v for n, l, v in samples if n == name and all(l.get(k) == str(x) for k, x in match.items()))


# ---------------------------------------------------------------------------------------------------
# Requests

def parse_tenants(spec: str, header_name: str) -> list[tuple[str, str]]:
    """--tenants "alpha=key:K,gamma=header:gamma,default=none": [(tenant, the header line that names it)]."""
    out = []
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        name, _, how = item.partition("=")
        kind, _, value = how.partition(":")
        if kind == "key" and value:
            out.append((name, f"Authorization: Bearer {value}"))
        elif kind == "header" and value:
            out.append((name, f"{header_name}: {value}"))
        elif kind == "none":
            out.append((name, ""))
        else:
            raise SystemExit(f"--tenants: '{item}' is not NAME=key:KEY, NAME=header:VALUE or NAME=none")
    return out


HEAD, BODY = 0, 1
MAX_TOKENS = (1, 2, 3, 4)
TRUNCATING_FAULTS = ("reset_after_events", "kill")


def build_request(host: str, stream: bool, max_tokens: int, close: bool, header: str = "",
                  priority: int | None = None) -> bytes:
    """The request's bytes; `header` is one more header line ("Name: value", for the tenant), `priority` the
    body's vLLM priority (None: none)."""
    body = {"model": "mock-model", "prompt": "the quick brown fox", "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if priority is not None:
        body["priority"] = priority
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"User-Agent: dplb-soak\r\n{'Connection: close' + chr(13) + chr(10) if close else ''}"
            f"{header + chr(13) + chr(10) if header else ''}"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    return head + payload


class Request:
    __slots__ = ("stream", "max_tokens", "disconnect", "close", "t0", "t1", "phase", "status", "rank",
                 "clen", "chunked", "body", "keep_alive", "got_bytes", "chunk_left", "done", "tenant",
                 "retry_after")

    def __init__(self, stream: bool, max_tokens: int, disconnect: str | None, close: bool, tenant: str = ""):
        self.stream = stream
        self.max_tokens = max_tokens
        self.disconnect = disconnect  # None, "after_send", "after_head", "after_first_chunk", "queued"
        self.close = close            # sent with Connection: close
        self.tenant = tenant          # the tenant it was sent as (tenants mode), else ""
        self.retry_after = False      # the answer had a Retry-After header
        self.t0 = time.monotonic()
        self.t1 = 0.0
        self.phase = HEAD
        self.status = 0
        self.rank = -1
        self.clen = -1
        self.chunked = False
        self.body = bytearray()
        self.keep_alive = True
        self.got_bytes = False
        self.chunk_left = -1  # bytes of chunk data to come; -1: a chunk-size line; -2: the final CRLF
        self.done = False


class Conn(asyncio.Protocol):
    """One client connection: sends a request, parses the response, sends the next one."""

    def __init__(self, soak: "Soak", slot: int):
        self.soak = soak
        self.slot = slot
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.req: Request | None = None
        self.closing = False  # we closed it on purpose

    # asyncio callbacks -------------------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.soak.conns.add(self)
        self.soak.send_next(self)

    def data_received(self, data):
        if self.closing:
            return
        req = self.req
        if req is None:
            self.soak.unexpected("unsolicited_bytes", None, repr(bytes(data[:200])))
            self.abort()
            return
        req.got_bytes = True
        self.buf += data
        try:
            self.parse(req)
        except ValueError as e:  # a number that does not parse: the framing is broken
            self.soak.unexpected("unparseable_response", req, f"{e}; near {bytes(self.buf[:120])!r}")
            self.abort()

    def eof_received(self):
        return False  # let the transport close

    def connection_lost(self, exc):
        self.soak.conns.discard(self)
        req = self.req
        self.req = None
        if req is not None and not req.done and not self.closing:
            req.t1 = time.monotonic()
            self.soak.lost_mid_request(req, exc)
        self.soak.reconnect(self.slot)

    # parsing -----------------------------------------------------------------------------------
    def parse(self, req: Request):
        buf = self.buf
        if req.phase == HEAD:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > 65536:
                    self.soak.unexpected("head_too_long", req, "")
                    self.abort()
                return
            lines = bytes(buf[:end]).split(b"\r\n")
            del buf[:end + 4]
            status_line = lines[0]
            if not status_line.startswith(b"HTTP/1.1 "):
                self.soak.unexpected("bad_status_line", req, repr(status_line))
                self.abort()
                return
            req.status = int(status_line[9:12])
            for line in lines[1:]:
                k, _, v = line.partition(b":")
                k = k.strip().lower()
                v = v.strip()
                if k == b"content-length":
                    req.clen = int(v)
                elif k == b"transfer-encoding":
                    req.chunked = v.lower() == b"chunked"
                elif k == b"x-dplb-rank":
                    req.rank = int(v)
                elif k == b"retry-after":
                    req.retry_after = v.isdigit() and int(v) >= 1
                elif k == b"connection":
                    if b"close" in v.lower():
                        req.keep_alive = False
            req.phase = BODY
            if req.disconnect == "after_head":
                self.client_disconnect(req)
                return
            if not req.chunked and req.clen < 0:
                self.soak.unexpected("no_framing", req, "response has neither Content-Length nor chunked")
                self.abort()
                return
        # BODY
        if req.chunked:
            while True:
                if req.chunk_left == -2:  # after the last chunk: no trailers expected, only CRLF
                    if len(buf) < 2:
                        return
                    if buf[:2] != b"\r\n":
                        raise ValueError("no CRLF after the last chunk")
                    del buf[:2]
                    break
                if req.chunk_left == -1:  # a chunk-size line
                    eol = buf.find(b"\r\n")
                    if eol < 0:
                        return
                    size = int(bytes(buf[:eol]).split(b";")[0], 16)
                    del buf[:eol + 2]
                    req.chunk_left = size if size > 0 else -2
                    continue
                if len(buf) < req.chunk_left + 2:
                    return
                if buf[req.chunk_left:req.chunk_left + 2] != b"\r\n":
                    raise ValueError("chunk data not followed by CRLF")
                req.body += buf[:req.chunk_left]
                del buf[:req.chunk_left + 2]
                req.chunk_left = -1
                if req.disconnect == "after_first_chunk":
                    self.client_disconnect(req)
                    return
        else:
            if len(buf) < req.clen:
                return
            req.body += buf[:req.clen]
            del buf[:req.clen]
        self.finished(req)

    def finished(self, req: Request):
        req.done = True
        req.t1 = time.monotonic()
        self.req = None
        self.soak.completed(req)
        if self.buf:
            self.soak.unexpected("extra_bytes", req, repr(bytes(self.buf[:200])))
            self.abort()
            return
        if not req.keep_alive or req.close:
            self.closing = True
            self.transport.close()
            return
        self.soak.send_next(self)

    def client_disconnect(self, req: Request):
        req.done = True
        req.t1 = time.monotonic()
        self.soak.count[f"client_disconnect_{req.disconnect}"] += 1
        self.closing = True
        if req.disconnect in ("after_send", "queued"):
            self.transport.close()  # FIN after the request (no response byte has come)
        else:
            self.transport.abort()  # RST: unread response bytes are pending

    def abort(self):
        self.closing = True
        if self.req is not None:
            self.req.done = True
        self.transport.abort()


# ---------------------------------------------------------------------------------------------------
# The soak


class Soak:
    def __init__(self, args):
        self.args = args
        self.loop = asyncio.get_running_loop()
        self.addr = split_hostport(args.dplb)
        self.admin = split_hostport(args.admin)
        self.rng = random.Random(args.seed)
        host = f"{self.addr[0]}:{self.addr[1]}"
        self.host = host
        self.templates = {(s, m, c): build_request(host, s, m, c)
                          for s in (False, True) for m in MAX_TOKENS for c in (False, True)}
        # Tenants mode: each request is sent as one of the tenants (uniformly), with a random priority.
        self.tenants = parse_tenants(args.tenants, args.tenant_header)
        self.rate_limited = {t for t in args.rate_limited.split(",") if t}
        self.priorities = [int(p) for p in args.priorities.split(",") if p.strip()]
        self.tenant_templates: dict[tuple, bytes] = {}
        self.sent = 0
        self.completed_n = 0
        self.count = collections.Counter()
        self.unexpected_samples: list[str] = []
        self.conns: set[Conn] = set()
        self.active_slots = args.concurrency
        self.all_done = asyncio.Event()
        self.faults: list[tuple[int, str, float, float]] = []  # (rank, kind, start, end)
        self.open_faults: dict[tuple[int, str], float] = {}
        self.faults_injected = collections.Counter()
        self.killed: set[int] = set()
        self.reset_faulted: set[int] = set()
        self.stop_faults = asyncio.Event()
        self.rss_start_kib = 0
        self.rss_max_kib = 0
        self.t_start = time.monotonic()
        self.warmed_up = asyncio.Event()

    # requests ----------------------------------------------------------------------------------
    def send_next(self, conn: Conn):
        if self.sent >= self.args.requests:
            conn.closing = True
            conn.transport.close()
            return
        rng = self.rng
        stream = rng.random() < self.args.stream_fraction
        max_tokens = rng.choice(MAX_TOKENS)
        close = rng.random() < self.args.close_fraction
        disconnect = None
        if rng.random() < self.args.disconnect_fraction:
            disconnect = rng.choice(("after_head", "after_first_chunk")) if stream else "after_send"
        if self.tenants:
            tenant, header = rng.choice(self.tenants)
            priority = rng.choice(self.priorities) if self.priorities else None
            key = (stream, max_tokens, close, tenant, priority)
            data = self.tenant_templates.get(key)
            if data is None:
                data = self.tenant_templates[key] = build_request(self.host, stream, max_tokens, close, header, priority)
        else:
            tenant, data = "", self.templates[(stream, max_tokens, close)]
        req = Request(stream, max_tokens, disconnect, close, tenant)
        conn.req = req
        conn.transport.write(data)
        self.sent += 1
        if tenant:
            self.count[f"sent_as_{tenant}"] += 1
        if self.sent == self.args.warmup:
            self.warmed_up.set()
        if disconnect == "after_send":
            conn.client_disconnect(req)
        elif disconnect is None and rng.random() < self.args.queued_disconnect_fraction:
            # Abandoned after a while if nothing has come back by then: with --max-inflight-per-rank, most of
            # these are still waiting in dplb's queue (dplb must take them out of it, and count them 499).
            self.loop.call_later(rng.uniform(0.001, self.args.queued_disconnect_ms / 1000),
                                 self.abandon_if_waiting, conn, req)

    def abandon_if_waiting(self, conn: Conn, req: Request):
        if conn.req is req and not req.done and not req.got_bytes and not conn.closing:
            req.disconnect = "queued"
            conn.client_disconnect(req)

    def completed(self, req: Request):
        self.completed_n += 1
        if req.status == 429 and req.tenant in self.rate_limited:
            # Its tenant's requests_per_second: expected, with a Retry-After and vLLM's error shape.
            if not req.retry_after or b'"error"' not in req.body:
                self.unexpected("bad_429", req, f"Retry-After {'present' if req.retry_after else 'missing'}, "
                                f"body {bytes(req.body[:200])!r}")
                return
            self.count[f"rate_limited_{req.tenant}"] += 1
            return
        if req.status != 200:
            self.unexpected(f"status_{req.status}", req, bytes(req.body[:300]).decode(errors="replace"))
            return
        if req.rank < 0 or req.rank >= self.args.ranks:
            self.unexpected("no_rank_header", req, "")
            return
        body = req.body
        if req.stream:
            good = (body.count(b'"text":" tok"') == req.max_tokens and body.endswith(b"data: [DONE]\n\n")
                    and b'"completion_tokens":%d' % req.max_tokens in body)
        else:
            good = b'"completion_tokens":%d' % req.max_tokens in body
        if not good:
            self.unexpected("bad_body", req, bytes(body[:300]).decode(errors="replace"))
            return
        self.count["ok_stream" if req.stream else "ok_nonstream"] += 1

    def lost_mid_request(self, req: Request, exc):
        """The connection closed under a request we did not abandon ourselves."""
        if req.phase == HEAD:
            self.unexpected("closed_before_response_head" if not req.got_bytes else "closed_in_head", req,
                            repr(exc))
            return
        # The head arrived, the body did not end: a truncation.
        kind = self.fault_explaining(req)
        if kind is not None:
            self.count[f"truncated_after_{kind}"] += 1
            if req.status != 200:
                self.unexpected(f"truncated_status_{req.status}", req, "")
        else:
            self.unexpected("truncated_without_fault", req, f"status {req.status} stream={req.stream} "
                            f"body so far {bytes(req.body[:200])!r} exc={exc!r}")

    def fault_explaining(self, req: Request) -> str | None:
        grace = self.args.fault_grace_s
        now = time.monotonic()
        for rank, kind, start, end in self.faults:
            if rank == req.rank and kind in TRUNCATING_FAULTS and start - grace <= req.t1 and req.t0 <= end + grace:
                return kind
        for (rank, kind), start in self.open_faults.items():
            if rank == req.rank and kind in TRUNCATING_FAULTS and start - grace <= req.t1 and req.t0 <= now:
                return kind
        return None

    def unexpected(self, reason: str, req: Request | None, detail: str):
        self.count["unexpected_" + reason] += 1
        if len(self.unexpected_samples) < 30:
            where = ""
            if req is not None:
                where = (f" rank={req.rank} stream={req.stream} max_tokens={req.max_tokens} "
                         f"{'tenant=' + req.tenant + ' ' if req.tenant else ''}"
                         f"t={req.t0 - self.t_start:.3f}s..{(req.t1 or time.monotonic()) - self.t_start:.3f}s")
            self.unexpected_samples.append(f"{reason}{where}: {detail}")
            log(f"UNEXPECTED {self.unexpected_samples[-1]}")

    def reconnect(self, slot: int):
        if self.sent >= self.args.requests:
            self.active_slots -= 1
            if self.active_slots == 0:
                self.all_done.set()
            return
        self.loop.create_task(self.open_conn(slot))

    async def open_conn(self, slot: int):
        for attempt in range(50):
            try:
                await self.loop.create_connection(lambda: Conn(self, slot), *self.addr)
                return
            except OSError as e:
                self.unexpected("connect_to_dplb_failed", None, repr(e))
                await asyncio.sleep(0.1)
        log("giving up a client slot: cannot connect to dplb")
        self.active_slots -= 1
        if self.active_slots == 0:
            self.all_done.set()

    # faults ------------------------------------------------------------------------------------
    async def admin_fault(self, rank: int, fields: dict):
        status, body = await http_call(self.admin, "POST", f"/fault?rank={rank}", json.dumps(fields).encode())
        if status != 200:
            raise RuntimeError(f"admin POST /fault?rank={rank} {fields}: {status} {body[:200]!r}")

    async def fault_window(self, rank: int, kind: str, on: dict, off: dict, seconds: float):
        start = time.monotonic()
        self.open_faults[(rank, kind)] = start
        self.faults_injected[kind] += 1
        if self.args.log_faults:
            log(f"fault on  rank {rank}: {on} for {seconds:.2f} s")
        try:
            await self.admin_fault(rank, on)
            await asyncio.sleep(seconds)
        finally:
            await self.admin_fault(rank, off)
            del self.open_faults[(rank, kind)]
            end = time.monotonic()
            self.faults.append((rank, kind, start, end))
            if self.args.log_faults:
                log(f"fault off rank {rank}: {off} after {end - start:.2f} s")

    async def faults_stopped_within(self, seconds):
        """Waits up to `seconds`; True as soon as the faults are told to stop."""
        try:
            await asyncio.wait_for(self.stop_faults.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False

    async def reset_faults(self):
        """One short reset fault at a time, on a rank that is not killed."""
        a = self.args
        delay = a.reset_first_s
        while not await self.faults_stopped_within(delay):
            delay = self.rng.uniform(*a.reset_gap_s)
            candidates = [r for r in a.fault_ranks if r not in self.killed] or a.fault_ranks
            rank = self.rng.choice(candidates)
            seconds = self.rng.uniform(*a.reset_len_s)
            self.reset_faulted.add(rank)
            try:
                if self.rng.random() < 0.6:
                    n = self.rng.choice((1, 2))
                    await self.fault_window(rank, "reset_after_events", {"reset_after_events": n},
                                            {"reset_after_events": 0}, seconds)
                else:
                    await self.fault_window(rank, "reset_on_request", {"reset_on_request": True},
                                            {"reset_on_request": False}, seconds)
            finally:
                self.reset_faulted.discard(rank)

    async def kill_faults(self):
        """A rank stops listening (open connections closed), then comes back a few seconds later."""
        a = self.args
        delay = a.kill_first_s
        while not await self.faults_stopped_within(delay):
            delay = a.kill_every_s
            candidates = [r for r in a.fault_ranks if r not in self.reset_faulted] or a.fault_ranks
            rank = self.rng.choice(candidates)
            seconds = self.rng.uniform(*a.kill_len_s)
            log(f"killing rank {rank} for {seconds:.1f} s")
            self.killed.add(rank)
            try:
                await self.fault_window(rank, "kill", {"listening": False}, {"listening": True}, seconds)
            finally:
                self.killed.discard(rank)

    # monitoring --------------------------------------------------------------------------------
    async def watchdog(self):
        """Requests that hang; progress lines; RSS samples."""
        last_print = time.monotonic()
        last_done = 0
        while not self.all_done.is_set():
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for conn in list(self.conns):
                req = conn.req
                if req is not None and not req.done and now - req.t0 > self.args.request_timeout_s:
                    self.unexpected("request_hung", req, f"no complete response after {self.args.request_timeout_s} s")
                    conn.abort()
            rss = rss_kib(self.args.dplb_pid)
            self.rss_max_kib = max(self.rss_max_kib, rss)
            if not alive(self.args.dplb_pid):
                self.unexpected("dplb_died", None, f"pid {self.args.dplb_pid} is gone")
                self.stop_faults.set()
                for conn in list(self.conns):
                    conn.abort()
                self.all_done.set()
                return
            if now - last_print >= self.args.progress_s:
                rate = (self.completed_n - last_done) / (now - last_print)
                unexpected = sum(v for k, v in self.count.items() if k.startswith("unexpected_"))
                log(f"{self.sent}/{self.args.requests} sent, {rate:.0f} req/s, dplb RSS {rss / 1024:.1f} MiB, "
                    f"faults {dict(self.faults_injected)}, unexpected {unexpected}")
                last_print, last_done = now, self.completed_n

    async def run(self) -> int:
        a = self.args
        log(f"driving {a.requests} requests through dplb at {a.dplb} with {a.concurrency} connections")
        for slot in range(a.concurrency):
            self.loop.create_task(self.open_conn(slot))
        watchdog = self.loop.create_task(self.watchdog())
        fault_tasks = []
        if not a.no_faults:
            fault_tasks = [self.loop.create_task(self.reset_faults()), self.loop.create_task(self.kill_faults())]

        warm = self.loop.create_task(self.warmed_up.wait())
        done = self.loop.create_task(self.all_done.wait())
        await asyncio.wait({warm, done}, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.2)
        self.rss_start_kib = rss_kib(a.dplb_pid)
        log(f"warm-up of {a.warmup} requests done; dplb RSS {self.rss_start_kib / 1024:.1f} MiB")

        await self.all_done.wait()
        duration = time.monotonic() - self.t_start
        self.stop_faults.set()
        for t in fault_tasks:
            try:
                await t
            except Exception as e:  # an admin call failed: the soak cannot vouch for its faults
                self.unexpected("fault_injection_failed", None, repr(e))
        watchdog.cancel()
        # Every fault off, every connection closed: dplb must be idle now.
        for rank in range(a.ranks):
            await http_call(self.admin, "DELETE", f"/fault?rank={rank}")
        await asyncio.sleep(1.0)
        return await self.report(duration)

    async def report(self, duration: float) -> int:
        a = self.args
        failures = []
        status, text = await http_call(self.addr, "GET", "/metrics")
        dplb = parse_metrics(text.decode())
        engines = []
        for rank in range(a.ranks):
            s, t = await http_call(self.admin, "GET", f"/metrics?rank={rank}")
            engines.append(parse_metrics(t.decode()))
        rss_end = rss_kib(a.dplb_pid)
        self.rss_max_kib = max(self.rss_max_kib, rss_end)

        c = self.count
        expected = {k: v for k, v in sorted(c.items()) if k.startswith(("truncated_after_", "client_disconnect_"))}
        unexpected = {k: v for k, v in sorted(c.items()) if k.startswith("unexpected_")}
        inflight = {l["rank"]: v for n, l, v in dplb if n == "dplb_rank_inflight"}
        by_code = collections.Counter()
        for n, l, v in dplb:
            if n == "dplb_requests_total":
                by_code[l["code"]] += int(v)
        rejected = collections.Counter()
        for n, l, v in dplb:
            if n == "dplb_rejected_requests_total":
                rejected[l["code"]] += int(v)
        counted = sum(by_code.values()) + sum(rejected.values())
        errors_by_kind = collections.Counter()
        for n, l, v in dplb:
            if n == "dplb_upstream_errors_total" and v:
                errors_by_kind[l["kind"]] += int(v)
        running = sum(metric_sum(e, "vllm:num_requests_running") for e in engines)
        aborted = sum(metric_sum(e, "mock_requests_aborted_total") for e in engines)
        resets = sum(metric_sum(e, "mock_requests_reset_total") for e in engines)
        disconnects = sum(v for k, v in c.items() if k.startswith("client_disconnect_"))
        # dplb's queue and tenants: nothing may be left waiting or holding a slot.
        queue_depth = metric_sum(dplb, "dplb_queue_depth")
        tenant_queued = {l.get("tenant", ""): v for n, l, v in dplb if n == "dplb_tenant_queued"}
        tenant_in_flight = {l.get("tenant", ""): v for n, l, v in dplb if n == "dplb_tenant_in_flight"}
        tenant_codes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for n, l, v in dplb:
            if n == "dplb_tenant_requests_total" and v:
                tenant_codes[l.get("tenant", "")][l.get("code", "")] += int(v)

        print()
        print("=== dplb soak report ===")
        print(f"requests sent:              {self.sent} in {duration:.1f} s ({self.sent / duration:.0f} req/s), "
              f"{a.concurrency} connections, {a.stream_fraction:.0%} streaming")
        print(f"completed 200 OK:           stream {c['ok_stream']}, non-stream {c['ok_nonstream']}")
        print(f"faults injected:            {dict(sorted(self.faults_injected.items()))}; "
              f"client disconnects {disconnects}")
        print(f"client-visible, expected:   {expected or '{}'}  (caused by the client or by injected faults)")
        print(f"client-visible, UNEXPECTED: {unexpected or 0}")
        for s in self.unexpected_samples[:10]:
            print(f"    {s}")
        print(f"dplb_requests_total:        {dict(sorted(by_code.items()))}; rejected {dict(rejected) or 0}")
        print(f"dplb upstream errors:       {dict(sorted(errors_by_kind.items()))}; "
              f"retries {int(metric_sum(dplb, 'dplb_retries_total'))}, "
              f"keep-alive retries {int(metric_sum(dplb, 'dplb_upstream_keepalive_retries_total'))}, "
              f"ejections {int(metric_sum(dplb, 'dplb_rank_ejections_total'))}")
        print(f"engine (mock) side:         resets {int(resets)}, aborted {int(aborted)}, still running {int(running)}")
        print(f"dplb_rank_inflight at end:  {inflight}")
        print(f"dplb queue at end:          depth {queue_depth:.0f}; tenants queued {tenant_queued}, "
              f"in flight {tenant_in_flight}")
        if self.tenants:
            print(f"sent per tenant:            " + str({t: c[f"sent_as_{t}"] for t, _ in self.tenants}))
            print(f"dplb_tenant_requests_total: " + str({t: dict(sorted(v.items())) for t, v in sorted(tenant_codes.items())}))
            print(f"expected 429s (rate limit): " + str({t: c[f"rate_limited_{t}"] for t in sorted(self.rate_limited)}))
        print(f"dplb_client_connections:    {int(metric_sum(dplb, 'dplb_client_connections'))} (the scrape's own)")
        print(f"dplb RSS:                   start {self.rss_start_kib / 1024:.1f} MiB (after {a.warmup} requests), "
              f"end {rss_end / 1024:.1f} MiB, max {self.rss_max_kib / 1024:.1f} MiB")

        if unexpected:
            failures.append(f"{sum(unexpected.values())} unexpected client-visible errors")
        if not inflight or any(v != 0 for v in inflight.values()):
            failures.append(f"dplb_rank_inflight not all 0 at the end: {inflight}")
        if counted != self.sent:
            failures.append(f"dplb counted {counted} requests (requests_total + rejected), the client sent {self.sent}")
        if by_code.get("499", 0) > disconnects:
            failures.append(f"dplb counted {by_code['499']} 499s but the client disconnected only {disconnects} times")
        if running != 0:
            failures.append(f"the engines still run {int(running)} requests")
        if queue_depth != 0:
            failures.append(f"dplb_queue_depth is {queue_depth:.0f} at the end")
        if any(v != 0 for v in tenant_queued.values()) or any(v != 0 for v in tenant_in_flight.values()):
            failures.append(f"a tenant still has requests queued or in flight: queued {tenant_queued}, "
                            f"in flight {tenant_in_flight}")
        if self.tenants:
            # Every request counted once, under the tenant it was sent as (its key, its header, or neither).
            counted_by_tenant = {t: sum(v.values()) for t, v in tenant_codes.items()}
            sent_by_tenant = {t: c[f"sent_as_{t}"] for t, _ in self.tenants}
            if counted_by_tenant != {t: n for t, n in sent_by_tenant.items() if n}:
                failures.append(f"dplb_tenant_requests_total counted {counted_by_tenant} by tenant, the client sent "
                                f"{sent_by_tenant}")
            for t, v in tenant_codes.items():
                if v.get("429") and t not in self.rate_limited:
                    failures.append(f"tenant {t} got {v['429']} 429s, and it has no rate limit")
            for t in self.rate_limited:
                seen = c[f"rate_limited_{t}"]
                if seen == 0:
                    failures.append(f"tenant {t} was never rate-limited: the 429 path was not exercised")
                if seen > tenant_codes.get(t, {}).get("429", 0):
                    failures.append(f"the client saw {seen} 429s of tenant {t}, dplb counted "
                                    f"{tenant_codes.get(t, {}).get('429', 0)}")
        if metric_sum(dplb, "dplb_client_connections") != 1:
            failures.append(f"dplb_client_connections is {metric_sum(dplb, 'dplb_client_connections')}, expected 1")
        if rss_end == 0 or self.rss_start_kib == 0:
            failures.append("could not read dplb's RSS")
        elif rss_end > self.rss_start_kib + a.rss_slack_mib * 1024:
            failures.append(f"dplb RSS grew from {self.rss_start_kib / 1024:.1f} to {rss_end / 1024:.1f} MiB "
                            f"(more than {a.rss_slack_mib} MiB)")
        if self.sent < a.requests:
            failures.append(f"only {self.sent} of {a.requests} requests were sent")
        if not a.no_faults and (self.faults_injected["kill"] == 0 or self.faults_injected["reset_after_events"] == 0):
            failures.append(f"not every kind of fault was injected: {dict(self.faults_injected)}")

        print("RESULT: " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)))
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump({"sent": self.sent, "duration_s": duration, "counts": dict(c),
                           "faults": dict(self.faults_injected), "dplb_requests_total": dict(by_code),
                           "rejected": dict(rejected), "upstream_errors": dict(errors_by_kind),
                           "inflight_end": inflight, "queue_depth_end": queue_depth,
                           "tenant_queued_end": tenant_queued, "tenant_in_flight_end": tenant_in_flight,
                           "tenant_requests_total": {t: dict(v) for t, v in tenant_codes.items()},
                           "rss_start_kib": self.rss_start_kib, "rss_end_kib": rss_end,
                           "rss_max_kib": self.rss_max_kib, "failures": failures}, f, indent=1)
        return 0 if not failures else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dplb", required=True, help="dplb's HOST:PORT")
    p.add_argument("--admin", required=True, help="the mock engine's admin HOST:PORT")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--dplb-pid", type=int, required=True, help="for VmRSS and liveness")
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--concurrency", type=int, default=48, help="client connections")
    p.add_argument("--warmup", type=int, default=10_000, help="requests before the start RSS is taken")
    p.add_argument("--stream-fraction", type=float, default=0.5)
    p.add_argument("--disconnect-fraction", type=float, default=0.01, help="requests the client abandons on purpose")
    p.add_argument("--close-fraction", type=float, default=0.005, help="requests sent with Connection: close")
    p.add_argument("--reset-first-s", type=float, default=0.5, help="first reset fault after this")
    p.add_argument("--reset-gap-s", type=float, nargs=2, default=(1.0, 3.0), help="pause between reset faults")
    p.add_argument("--reset-len-s", type=float, nargs=2, default=(0.3, 1.5), help="length of a reset fault")
    p.add_argument("--kill-first-s", type=float, default=2.0)
    p.add_argument("--kill-every-s", type=float, default=30.0)
    p.add_argument("--kill-len-s", type=float, nargs=2, default=(3.0, 8.0))
    p.add_argument("--fault-grace-s", type=float, default=0.5,
                   help="a truncation this close to a fault window on its rank is explained by it")
    p.add_argument("--request-timeout-s", type=float, default=30.0)
    p.add_argument("--rss-slack-mib", type=float, default=20.0)
    p.add_argument("--progress-s", type=float, default=10.0)
    p.add_argument("--no-faults", action="store_true")
    p.add_argument("--quiet-faults", dest="log_faults", action="store_false",
                   help="no line for every fault set and cleared")
    p.add_argument("--fault-ranks", default="0,1",
                   help="comma-separated ranks that get reset and kill faults (default 0,1: the other ranks "
                        "always have capacity, so a 502/503 is a dplb failure; see docs/operations.md)")
    p.add_argument("--tenants", default="",
                   help="tenants mode: send each request as one of these tenants, chosen uniformly: comma-separated "
                        "NAME=key:KEY (Authorization: Bearer KEY), NAME=header:VALUE (--tenant-header: VALUE) or "
                        "NAME=none (no key, no header: the default tenant); NAME is the tenant dplb must count it as")
    p.add_argument("--tenant-header", default="X-Tenant", help="the header of NAME=header:VALUE")
    p.add_argument("--rate-limited", default="",
                   help="comma-separated tenants with a requests_per_second: their 429s (with Retry-After) are expected, "
                        "and at least one must come")
    p.add_argument("--priorities", default="", help="comma-separated body priorities, one chosen per request")
    p.add_argument("--queued-disconnect-fraction", type=float, default=0.0,
                   help="requests the client abandons after a random delay of up to --queued-disconnect-ms if no "
                        "response byte has come by then (with dplb queueing: mostly while in its queue)")
    p.add_argument("--queued-disconnect-ms", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json-out")
    args = p.parse_args()
    args.warmup = min(args.warmup, args.requests)
    args.fault_ranks = sorted({int(r) for r in args.fault_ranks.split(",") if r.strip()})
    if not args.fault_ranks or any(r < 0 or r >= args.ranks for r in args.fault_ranks):
        p.error(f"--fault-ranks must name ranks 0..{args.ranks - 1}")

    async def go():
        return await Soak(args).run()
    return asyncio.run(go())


if __name__ == "__main__":
    sys.exit(main())
