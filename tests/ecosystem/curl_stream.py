"""`curl -N` sees a stream through dplb as it is made: with the engine spacing its tokens 100 ms apart, each SSE
event reaches curl about when the same event reaches it straight from the engine, not in a burst at the end; the
stream is chunked (no Content-Length) and ends with `data: [DONE]`."""

import json
import subprocess
import time

from ecosystem import DPLB, MOCK_ENGINE, OUTPUT, Checks, benchlib

check = Checks()
TOKENS, ITL_MS = 10, 100
BODY = json.dumps({"model": "mock-model", "prompt": "stream to me", "max_tokens": TOKENS, "stream": True})


def stream(base, name):
    """(seconds from the start at which each `data:` line reached curl, those lines, the response head)."""
    head = OUTPUT / f"curl-{name}-head.txt"
    start = time.monotonic()
    curl = subprocess.Popen(["curl", "-N", "-sS", "--max-time", "20", "-D", str(head), "-H",
                             "Content-Type: application/json", "-d", BODY, f"{base}/v1/completions"],
                            stdout=subprocess.PIPE, text=True, bufsize=1)
    times, lines = [], []
    for line in curl.stdout:  # line by line as curl prints them
        if line.startswith("data:"):
            times.append(time.monotonic() - start)
            lines.append(line.strip())
    check(curl.wait(timeout=30) == 0, f"curl exits 0 ({name})")
    return times, lines, head.read_text().lower()


mock, ports, _ = benchlib.start_mock(MOCK_ENGINE, ["--ranks", "1", "--itl-ms", str(ITL_MS)], OUTPUT / "curl-mock.log")
dplb = None
try:
    dplb, port = benchlib.start_dplb(DPLB, "least-inflight", ports, OUTPUT / "curl-dplb.log")
    direct_times, direct_lines, _ = stream(f"http://127.0.0.1:{ports[0]}", "direct")
    times, lines, head = stream(f"http://127.0.0.1:{port}", "dplb")

    check(len(lines) == len(direct_lines) == TOKENS + 1, f"{TOKENS} token events and [DONE]: {len(lines)}")
    check(lines[-1] == "data: [DONE]", "the stream ends with data: [DONE]")
    check("transfer-encoding: chunked" in head and "content-length" not in head,
          "the stream is chunked, without Content-Length")
    total = times[-1]
    check(total >= (TOKENS - 1) * ITL_MS / 1000 * 0.9, f"the stream took its {TOKENS} spaced tokens' time: {total:.2f} s")
    check(times[0] < total / 3, f"the first event arrived at {times[0]:.2f} s, long before the end at {total:.2f} s")
    # Counted from the first event (curl's own start-up differs between runs), each event arrives about when it
    # does straight from the engine: within 60 ms (ITL is 100).
    lags = [round((t - times[0]) - (d - direct_times[0]), 3) for t, d in zip(times, direct_times)]
    check(max(map(abs, lags)) < 0.06, f"each event keeps the direct stream's timing within 60 ms: lags {lags}")
    gaps = [round(b - a, 3) for a, b in zip(times, times[1:-1])]
    check(min(gaps) > ITL_MS / 1000 / 2, f"the events arrive spread out, not in bursts: gaps {gaps}")
finally:
    for process in (dplb, mock):
        if process:
            process.stop()
check.finish()
