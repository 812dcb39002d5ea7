"""A multi-turn chat load for bench/pd.py's third part: conversations that send their whole history back as token ids.

Each conversation has its own system prefix (random token ids, shared by no other conversation), then T turns in
sequence: turn k's prompt is turn k-1's prompt, its answer's tokens (the mock's answer is `max_tokens` times the
word "tok", whose id the caller passes: so the history is exactly what the engine generated, and its cached
output blocks can hit) and a new user message of random ids. Every turn is a streaming POST /v1/completions with
the prompt as a token-id array (dplb matches ids against the engines' KV-cache events directly, no /tokenize),
`ignore_eos`, on a fresh connection (Connection: close). All conversations run concurrently on one asyncio loop
(conversation i starts at i x start_spread / C), each turn as soon as the previous answer is in (plus think time).

Recorded per turn: the conversation, the turn, the prompt length, TTFT (send to the first token event) and the
gaps between token events (ITL), in wall seconds. Standard library only.
"""

import asyncio
import json
import random
import time


class TurnFailed(Exception):
    pass


async def _read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _body_pieces(reader, headers):
    """The response body as it arrives (chunked, or up to the close)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


async def one_turn(port, prompt, max_tokens, timeout):
    """One streaming completion: (ttft, [gaps between token events]) in wall seconds; raises TurnFailed."""
    body = json.dumps({"model": "mock-model", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        sent = time.monotonic()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()

        async def read():
            status, headers = await _read_head(reader)
            if status != 200:
                text = b"".join([piece async for piece in _body_pieces(reader, headers)]).decode(errors="replace")
                raise TurnFailed(f"status {status}: {text[:300]}")
            times, pending, done = [], b"", False
            async for piece in _body_pieces(reader, headers):
                now = time.monotonic()
                pending += piece
                while b"\n\n" in pending:
                    event, pending = pending.split(b"\n\n", 1)
                    data = event.strip()
                    if not data.startswith(b"data:"):
                        continue
                    data = data[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    choices = json.loads(data).get("choices") or []
                    if choices and choices[0].get("text"):
                        times.append(now)
            if not done or len(times) != max_tokens:
                raise TurnFailed(f"{len(times)} token events of {max_tokens}, [DONE] {'seen' if done else 'missing'}")
            return times[0] - sent, [b - a for a, b in zip(times, times[1:])]

        return await asyncio.wait_for(read(), timeout)
    finally:
        writer.close()


async def _conversation(i, port, spec, rng, scale, records, failures):
    await asyncio.sleep(i * spec["start_spread_ms"] / 1000 / spec["conversations"] / scale)
    history = [rng.randrange(1000, 2**31) for _ in range(spec["prefix_len"])]
    for turn in range(1, spec["turns"] + 1):
        prompt = history + [rng.randrange(1000, 2**31) for _ in range(rng.randint(spec["user_min"], spec["user_max"]))]
        try:
            ttft, gaps = await one_turn(port, prompt, spec["output_len"], spec["timeout_s"])
        except (TurnFailed, OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as error:
            failures.append(f"conversation {i} turn {turn}: {error!r}")
            return  # the later turns would carry a history that does not exist
        records.append({"conversation": i, "turn": turn, "prompt_len": len(prompt), "ttft": ttft, "gaps": gaps})
        history = prompt + [spec["answer_token"]] * spec["output_len"]
        if spec["think_ms"]:
            await asyncio.sleep(spec["think_ms"] / 1000 / scale)


def run_chat(port, spec, seed, scale):
    """Runs the conversations of `spec` against 127.0.0.1:port: (turn records, failure notes, wall seconds).
    spec: conversations, turns, prefix_len, user_min, user_max, output_len, answer_token, start_spread_ms,
    think_ms (both simulated: divided by `scale`), timeout_s."""
    records, failures = [], []

    async def main():
        await asyncio.gather(*(_conversation(i, port, spec, random.Random(seed * 100003 + i), scale, records, failures)
                               for i in range(spec["conversations"])))

    started = time.monotonic()
    asyncio.run(main())
    return records, failures, time.monotonic() - started
