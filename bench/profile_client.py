#!/usr/bin/env python3
"""Load client for bench/profile.sh: an exact number of requests over a fixed set of keep-alive connections,
with a pause between a warm-up and the measured phase so that the script can zero (callgrind) or attach
(strace) while every connection is already open, and another pause before the connections close.

  requests  N POSTs /v1/completions with max_tokens 1 (bench/overhead.lua's body) over K connections,
            each connection sending its next request as soon as its previous answer is read
  streams   M connections, each with one SSE stream of T tokens (stream: true, ignore_eos, include_usage,
            as `vllm bench serve` and dplb-bench ask); the warm-up is one 1-token stream per connection,
            all at once, so that the proxy holds M engine connections before the measured phase

Handshake with the script, through files in --sync-dir (each wait bounded by --sync-timeout-s):
  the client writes `ready` after the warm-up and waits for `go`;
  it writes `done` after the measured phase and waits for `close`;
  then it closes its connections and writes --result (JSON) and exits 0 when every request of both phases
  was answered 200 (and every stream relayed exactly T + 2 events: T tokens, the usage event, [DONE]),
  1 otherwise. Standard library only.

  python3 bench/profile_client.py requests --port P --connections 16 --requests 10000 --warmup 1000 \
      --sync-dir DIR --result out.json
  python3 bench/profile_client.py streams --port P --streams 32 --tokens 200 --sync-dir DIR --result out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

PLAIN_BODY = b'{"model":"mock-model","prompt":"hi","max_tokens":1}'
# Per stream: one event per token, the usage event (include_usage) and `data: [DONE]`.
EXTRA_EVENTS_PER_STREAM = 2


def stream_body(tokens: int) -> bytes:
    return (
        '{"model":"mock-model","prompt":"hi","max_tokens":%d,"stream":true,"ignore_eos":true,'
        '"stream_options":{"include_usage":true}}' % tokens
    ).encode()


class Failure(Exception):
    pass


class Connection:
    """One keep-alive HTTP/1.1 connection; every read bounded by `timeout` seconds."""

    def __init__(self, host: str, port: int, timeout: float):
        self.host, self.port, self.timeout = host, port, timeout
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, limit=1 << 20), self.timeout)

    async def _read(self, coro):
        try:
            return await asyncio.wait_for(coro, self.timeout)
        except asyncio.IncompleteReadError as e:
            raise Failure("the connection closed mid-response") from e
        except asyncio.TimeoutError as e:
            raise Failure(f"no answer within {self.timeout} s") from e

    async def request(self, body: bytes) -> tuple[int, bytes]:
        """Sends one POST /v1/completions; returns the status and the whole (de-chunked) body."""
        assert self.reader and self.writer
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        await self.writer.drain()
        raw_head = await self._read(self.reader.readuntil(b"\r\n\r\n"))
        lines = raw_head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise Failure(f"not an HTTP/1.x status line: {lines[0]!r}")
        status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        if headers.get("connection", "").lower() == "close":
            raise Failure("the proxy closed the keep-alive connection (Connection: close)")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks = []
            while True:
                size_line = await self._read(self.reader.readuntil(b"\r\n"))
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while (await self._read(self.reader.readuntil(b"\r\n"))) != b"\r\n":
                        pass  # trailer fields
                    break
                chunks.append((await self._read(self.reader.readexactly(size + 2)))[:-2])
            body_in = b"".join(chunks)
        elif "content-length" in headers:
            body_in = await self._read(self.reader.readexactly(int(headers["content-length"])))
        else:
            raise Failure("a response with neither Content-Length nor chunked framing")
        return status, body_in

    async def close(self) -> None:
        if self.writer:
            self.writer.close()
            try:
                await asyncio.wait_for(self.writer.wait_closed(), self.timeout)
            except (OSError, asyncio.TimeoutError):
                pass


class Tally:
    def __init__(self):
        self.requests = 0
        self.ok = 0
        self.statuses: dict[str, int] = {}
        self.events = 0
        self.bad_streams = 0
        self.errors: list[str] = []

    def as_dict(self) -> dict:
        return {"requests": self.requests, "ok": self.ok, "statuses": self.statuses, "events": self.events,
                "bad_streams": self.bad_streams, "errors": self.errors[:5]}


async def plain_phase(conns: list[Connection], count: int, tally: Tally) -> None:
    """`count` plain requests, each connection sending its next one as soon as its answer is in."""
    remaining = [count]

    async def worker(conn: Connection) -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            tally.requests += 1
            status, _ = await conn.request(PLAIN_BODY)
            tally.statuses[str(status)] = tally.statuses.get(str(status), 0) + 1
            if status == 200:
                tally.ok += 1

    await asyncio.gather(*(worker(c) for c in conns))


async def stream_phase(conns: list[Connection], tokens: int, tally: Tally) -> None:
    """One stream of `tokens` tokens on every connection, all at once."""
    expected = tokens + EXTRA_EVENTS_PER_STREAM

    async def one(conn: Connection) -> None:
        tally.requests += 1
        status, body = await conn.request(stream_body(tokens))
        tally.statuses[str(status)] = tally.statuses.get(str(status), 0) + 1
        events = [e for e in body.split(b"\n\n") if e.startswith(b"data:")]
        tally.events += len(events)
        if status == 200 and len(events) == expected and events[-1].strip() == b"data: [DONE]":
            tally.ok += 1
        else:
            tally.bad_streams += 1
            tally.errors.append(f"stream: status {status}, {len(events)} events (expected {expected})")

    await asyncio.gather(*(one(c) for c in conns))


async def await_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise Failure(f"the script did not write {path} within {timeout} s")
        await asyncio.sleep(0.005)


async def run(args) -> dict:
    sync = Path(args.sync_dir)
    n_conns = args.connections if args.mode == "requests" else args.streams
    conns = [Connection(args.host, args.port, args.timeout_s) for _ in range(n_conns)]
    await asyncio.gather(*(c.open() for c in conns))
    warm, measured = Tally(), Tally()
    result = {"mode": args.mode, "connections": n_conns}
    try:
        if args.mode == "requests":
            await plain_phase(conns, max(args.warmup, n_conns), warm)
        else:
            await stream_phase(conns, 1, warm)
        (sync / "ready").write_text("")
        await await_file(sync / "go", args.sync_timeout_s)
        started = time.monotonic()
        if args.mode == "requests":
            await plain_phase(conns, args.requests, measured)
        else:
            await stream_phase(conns, args.tokens, measured)
        result["seconds"] = time.monotonic() - started
        (sync / "done").write_text("")
        await await_file(sync / "close", args.sync_timeout_s)
    except (Failure, OSError) as e:
        result["failure"] = str(e)
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    result["warmup"] = warm.as_dict()
    result["measured"] = measured.as_dict()
    if args.mode == "streams":
        result["tokens"] = args.tokens
        result["expected_events"] = args.streams * (args.tokens + EXTRA_EVENTS_PER_STREAM)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["requests", "streams"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--connections", type=int, default=16, help="requests: keep-alive connections")
    p.add_argument("--requests", type=int, default=10000, help="requests: measured requests")
    p.add_argument("--warmup", type=int, default=1000, help="requests: warm-up requests")
    p.add_argument("--streams", type=int, default=32, help="streams: concurrent streams")
    p.add_argument("--tokens", type=int, default=200, help="streams: tokens per stream")
    p.add_argument("--timeout-s", type=float, default=60.0, help="bound on every connect and read")
    p.add_argument("--sync-dir", required=True)
    p.add_argument("--sync-timeout-s", type=float, default=120.0)
    p.add_argument("--result", required=True, help="JSON written here")
    args = p.parse_args()
    result = asyncio.run(run(args))
    m = result["measured"]
    expected = args.requests if args.mode == "requests" else args.streams
    passed = ("failure" not in result and result["warmup"]["ok"] == result["warmup"]["requests"]
              and m["requests"] == expected and m["ok"] == expected)
    result["passed"] = passed
    Path(args.result).write_text(json.dumps(result, indent=1) + "\n")
    if not passed:
        print(f"profile_client: FAILED: {json.dumps(result)}", file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
