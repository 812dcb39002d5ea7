"""Debian's Prometheus scrapes a running dplb on loopback, and its HTTP API shows every per-rank series with the
values dplb's traffic implies: 40 completions over 4 ranks in strict rotation are 10 per rank with status 200, the
rank and url labels name the right engine, nothing is left in flight, every rank is healthy, and the token
counters hold what the engine's usage said."""

import json
import shutil
import tempfile
import time
import urllib.parse
import urllib.request

from ecosystem import DPLB, MOCK_ENGINE, OUTPUT, Checks, benchlib, free_port, post_json

check = Checks()
REQUESTS, RANKS, MAX_TOKENS = 40, 4, 5

mock, ports, _ = benchlib.start_mock(MOCK_ENGINE, ["--ranks", str(RANKS)], OUTPUT / "prometheus-mock.log")
dplb = prometheus = None
storage = tempfile.mkdtemp(prefix="dplb-prometheus-")
try:
    dplb, port = benchlib.start_dplb(DPLB, "round-robin", ports, OUTPUT / "prometheus-dplb.log")
    prompt_tokens = completion_tokens = 0
    for i in range(REQUESTS):
        status, body = post_json(f"http://127.0.0.1:{port}/v1/completions",
                                 {"model": "mock-model", "prompt": f"request number {i}", "max_tokens": MAX_TOKENS})
        assert status == 200, body
        prompt_tokens += body["usage"]["prompt_tokens"]
        completion_tokens += body["usage"]["completion_tokens"]

    config = OUTPUT / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "dplb", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
    }))
    for attempt in range(5):  # the free port may be taken between the probe and Prometheus' bind
        web = free_port()
        prometheus = benchlib.Process(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={storage}",
             f"--web.listen-address=127.0.0.1:{web}"], OUTPUT / "prometheus.log")
        try:
            prometheus.await_line(r"Server is ready to receive web requests", timeout=30)
            break
        except RuntimeError:
            prometheus.stop()
            prometheus = None
    assert prometheus, "Prometheus did not start: see prometheus.log"

    def query(expr):
        url = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as answer:
            reply = json.loads(answer.read())
        assert reply["status"] == "success", reply
        return reply["data"]["result"]

    # Bounded wait for a scrape that saw all the traffic: the target is up and the counters are in.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        total = query('sum(dplb_requests_total{code="200"})')
        if total and float(total[0]["value"][1]) == REQUESTS:
            break
        time.sleep(0.2)
    check(query('up{job="dplb"}')[0]["value"][1] == "1", "Prometheus scrapes dplb (up == 1)")

    by_rank = {s["metric"]["rank"]: float(s["value"][1]) for s in query('dplb_requests_total{code="200"}')}
    check(by_rank == {str(r): REQUESTS / RANKS for r in range(RANKS)},
          f"dplb_requests_total{{code=\"200\"}} is {REQUESTS // RANKS} on each of the {RANKS} ranks: {by_rank}")
    urls = {s["metric"]["rank"]: s["metric"]["url"] for s in query("dplb_rank_inflight")}
    check(urls == {str(r): f"http://127.0.0.1:{ports[r]}" for r in range(RANKS)},
          f"dplb_rank_inflight's url label names each rank's engine: {urls}")
    inflight = [float(s["value"][1]) for s in query("dplb_rank_inflight")]
    check(inflight == [0.0] * RANKS, f"nothing left in flight: {inflight}")
    healthy = {s["metric"]["rank"]: s["value"][1] for s in query("dplb_rank_healthy")}
    check(healthy == {str(r): "1" for r in range(RANKS)}, f"every rank healthy: {healthy}")
    completion = float(query("sum(dplb_completion_tokens_total)")[0]["value"][1])
    check(completion == completion_tokens == REQUESTS * MAX_TOKENS,
          f"dplb_completion_tokens_total sums to the usage's {completion_tokens}: {completion}")
    prompt = float(query("sum(dplb_prompt_tokens_total)")[0]["value"][1])
    check(prompt == prompt_tokens, f"dplb_prompt_tokens_total sums to the usage's {prompt_tokens}: {prompt}")
    count = float(query("sum(dplb_request_duration_seconds_count)")[0]["value"][1])
    check(count == REQUESTS, f"the duration histogram counted every request: {count}")
    build = query("dplb_build_info")
    check(len(build) == 1 and build[0]["metric"]["policy"] == "round-robin", f"dplb_build_info names the policy: {build}")
finally:
    for process in (prometheus, dplb, mock):
        if process:
            process.stop()
    shutil.rmtree(storage, ignore_errors=True)
check.finish()
