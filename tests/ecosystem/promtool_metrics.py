"""`promtool check metrics` (Prometheus' own linter) on dplb's /metrics with the optional families present too:
engine stats read, prefix-aware routing and session affinity on, traffic with successes and an engine's 404.
promtool must report nothing; it fails a counter without `_total`, a missing HELP, a bad name or unit."""

import subprocess

from ecosystem import DPLB, MOCK_ENGINE, OUTPUT, Checks, benchlib, post_json

check = Checks()
mock, ports, _ = benchlib.start_mock(MOCK_ENGINE, ["--ranks", "2"], OUTPUT / "promtool-mock.log")
dplb = None
try:
    dplb, port = benchlib.start_dplb(DPLB, "prefix-aware", ports, OUTPUT / "promtool-dplb.log",
                                     extra=["--stats-interval", "50", "--affinity-header", "x-session-id"])
    base = f"http://127.0.0.1:{port}"
    for i in range(8):
        status, _ = post_json(f"{base}/v1/completions",
                              {"model": "mock-model", "prompt": "shared prefix " * 80 + str(i), "max_tokens": 2})
        assert status == 200
    status, _ = post_json(f"{base}/v1/completions", {"model": "another-model", "prompt": "x", "max_tokens": 1})
    check(status == 404, f"an unknown model is the engine's 404 (a labelled series): {status}")
    # Engine stats: wait (bounded) until dplb has read every rank's /metrics once.
    text = benchlib.scrape_until(f"{base}/metrics", lambda t: t.count("dplb_engine_running{") >= len(ports))
    (OUTPUT / "promtool-metrics.txt").write_text(text)
    for family in ("dplb_engine_running", "dplb_prefix_decisions_total", "dplb_prefix_matched_tokens_bucket",
                   "dplb_requests_total", "dplb_time_to_first_byte_seconds_bucket", "dplb_build_info"):
        check(f"\n{family}" in text, f"/metrics has {family}")
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60)
    check(lint.returncode == 0 and not lint.stdout.strip(),
          f"promtool check metrics reports nothing (exit {lint.returncode}): {lint.stdout.strip()}")
finally:
    for process in (dplb, mock):
        if process:
            process.stop()
check.finish()
