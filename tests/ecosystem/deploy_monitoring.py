"""The monitoring half of the deploy kit holds: `promtool check config` on deploy/prometheus/prometheus.yml (and the
rule file it loads), `promtool check rules` and `promtool test rules` on the alert rules (each alert fires on the
series that should fire it, and not on its neighbours), and the Grafana dashboard: valid JSON with the panels it
promises (the KV-cache event and shared ledger series among them), every PromQL expression parsed by promtool, and every metric that
the rules and the dashboard name present in the real dplb's /metrics (a typo'd name would leave a panel empty and an
alert silent forever): one dplb for the request, engine and queue series, one whose backends name KV-cache event
publishers (kv-events=) for the dplb_kv_* series, and one sharing its ledger in a real redis-server (--shared-state)
for the dplb_shared_state_* series."""

import http.client
import json
import re
import subprocess
import tempfile
from pathlib import Path

from ecosystem import DPLB, MOCK_ENGINE, OUTPUT, SOURCE, Checks, benchlib, free_port, post_json

check = Checks()
deploy = SOURCE / "deploy"


def promtool(*args):
    result = subprocess.run(["promtool", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=120)
    return result.returncode, result.stdout.strip()


status, out = promtool("check", "config", str(deploy / "prometheus/prometheus.yml"))
check(status == 0, f"promtool check config prometheus.yml: {out}")
status, out = promtool("check", "rules", str(deploy / "prometheus/alerts.yml"))
check(status == 0, f"promtool check rules alerts.yml: {out}")
status, out = promtool("test", "rules", str(deploy / "prometheus/alerts_test.yml"))
check(status == 0, f"promtool test rules alerts_test.yml: {out}")

rules_text = (deploy / "prometheus/alerts.yml").read_text()
alerts = re.findall(r"- alert: (\w+)", rules_text)
tested = set(re.findall(r"alertname: (\w+)", (deploy / "prometheus/alerts_test.yml").read_text()))
check(set(alerts) >= {"DplbNoUsableRank", "DplbRankDown", "DplbInflightSkewHigh", "DplbErrorRatioHigh",
                      "DplbQueueGrowing", "DplbEngineStatsStale", "DplbKvEventErrors", "DplbSharedStateDown"},
      f"the alerts cover rank down, skew, errors, queue, stale stats, KV-cache event errors, the shared ledger "
      f"unreachable: {alerts}")
check(set(alerts) == tested, f"every alert has a unit test: untested {set(alerts) - tested}")

dashboard = json.loads((deploy / "grafana/dashboards/dplb.json").read_text())
panels = dashboard["panels"]
exprs = [t["expr"] for p in panels for t in p["targets"]]
titles = " | ".join(p["title"] for p in panels).lower()
for want in ("in flight per rank", "skew", "by status", "time to first byte", "duration", "tokens per second",
             "running and waiting", "kv-cache", "blocks indexed per rank", "kv-cache events per second",
             "shared ledger: connected", "live replicas seen", "pick round trip", "errors per second by op"):
    check(want in titles, f"the dashboard has a panel for {want}")
for metric in ("dplb_kv_blocks", "dplb_kv_events_total", "dplb_kv_event_errors_total", "dplb_shared_state_up",
               "dplb_shared_state_replicas", "dplb_shared_state_pick_seconds_bucket", "dplb_shared_state_errors_total"):
    check(any(re.search(rf"\b{metric}\b", e) for e in exprs), f"the dashboard queries {metric}")
check(len({p["id"] for p in panels}) == len(panels), "panel ids are unique")
datasource_uid = re.search(r"uid: (\S+)", (deploy / "grafana/provisioning/datasources/prometheus.yml").read_text()).group(1)
check(all(t["datasource"]["uid"] == datasource_uid for p in panels for t in p["targets"]),
      f"every query uses the provisioned data source ({datasource_uid})")

# Every dashboard expression parses: promtool checks each as a recording rule (Grafana's variables filled in).
with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
    concrete = [e.replace("$__rate_interval", "1m").replace("$instance", ".*") for e in exprs]
    json.dump({"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:expr{i}", "expr": e}
                                                          for i, e in enumerate(concrete)]}]}, f)
status, out = promtool("check", "rules", f.name)
check(status == 0, f"promtool parses the dashboard's {len(exprs)} expressions: {out}")
Path(f.name).unlink()

# The metric names the rules and the dashboard use, against the real /metrics with every family present.
mock, ports, _ = benchlib.start_mock(MOCK_ENGINE, ["--ranks", "2"], OUTPUT / "monitoring-mock.log")
dplb = redis = None
shared_text, has_shared_state = "", False
try:
    dplb, port = benchlib.start_dplb(DPLB, "least-load", ports, OUTPUT / "monitoring-dplb.log",
                                     extra=["--stats-interval", "50", "--max-inflight-per-rank", "64"])
    for i in range(4):
        assert post_json(f"http://127.0.0.1:{port}/v1/completions",
                         {"model": "mock-model", "prompt": f"p{i}", "max_tokens": 2})[0] == 200
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("TRACE", "/")  # refused with 405: dplb_rejected_requests_total appears
    check(connection.getresponse().status == 405, "a TRACE is refused (a rejected request)")
    connection.close()
    text = benchlib.scrape_until(f"http://127.0.0.1:{port}/metrics", lambda t: "dplb_engine_running{" in t)
    dplb.stop()
    # Backends that name KV-cache event publishers (none listens there: dplb's subscribers keep trying), one plain
    # and one with replay, under the policy that uses them: the dplb_kv_* series, one per rank.
    events = [free_port(), free_port()]
    backends = [f"http://127.0.0.1:{ports[0]}#kv-events=tcp://127.0.0.1:{events[0]}",
                f"http://127.0.0.1:{ports[1]}#kv-events=tcp://127.0.0.1:{events[1]}&kv-replay=tcp://127.0.0.1:{free_port()}"]
    dplb, kv_text = None, ""
    try:
        dplb, port = benchlib.start_dplb(DPLB, "prefix-aware", [], OUTPUT / "monitoring-dplb-kv.log",
                                         extra=[a for b in backends for a in ("--backend", b)])
    except Exception as error:  # a dplb that refuses them fails a check, with its words, rather than the script
        check(False, f"dplb starts with backends that name KV-cache event publishers: {error}")
    else:
        kv_text = benchlib.scrape_until(f"http://127.0.0.1:{port}/metrics", lambda t: "dplb_kv_blocks{" in t)
    # A dplb sharing its ledger with a real redis-server (on a port of its own): the dplb_shared_state_* series,
    # with picks through the ledger observed. Only where this dplb has --shared-state (the flag came after the
    # rules and the dashboard that use it).
    if dplb:
        dplb.stop()
    dplb = None
    has_shared_state = "--shared-state" in subprocess.run([DPLB, "--help"], stdout=subprocess.PIPE,
                                                           stderr=subprocess.STDOUT, text=True, timeout=30).stdout
    if has_shared_state:
        redis_port = free_port()
        redis = benchlib.Process(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no"], OUTPUT / "monitoring-redis.log")
        redis.await_line(r"Ready to accept connections")
        dplb, port = benchlib.start_dplb(DPLB, "least-inflight", ports, OUTPUT / "monitoring-dplb-shared.log",
                                         extra=["--shared-state", f"redis://127.0.0.1:{redis_port}",
                                                "--replica-name", "monitoring"])
        shared_url = f"http://127.0.0.1:{port}/metrics"
        connected = benchlib.scrape_until(shared_url, lambda t: re.search(r"^dplb_shared_state_up 1", t, re.M) is not None)
        check(re.search(r"^dplb_shared_state_up 1", connected, re.M) is not None,
              "dplb reaches the ledger in redis-server within 20 s (dplb_shared_state_up 1)")
        for i in range(4):
            assert post_json(f"http://127.0.0.1:{port}/v1/completions",
                             {"model": "mock-model", "prompt": f"s{i}", "max_tokens": 2})[0] == 200
        shared_text = benchlib.scrape(shared_url)
        check(re.search(r"^dplb_shared_state_pick_seconds_count [1-9]", shared_text, re.M) is not None,
              "the picks through the ledger are observed in dplb_shared_state_pick_seconds")
    else:
        print("skipped: the dplb_shared_state_* series (this dplb has no --shared-state yet)")
finally:
    for process in (dplb, mock, redis):
        if process:
            process.stop()
exported = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )", text + "\n" + kv_text + "\n" + shared_text, re.M))
used = set(re.findall(r"\b(dplb_[a-z_]+)\b", rules_text + "\n".join(exprs)))
if not has_shared_state:
    used = {name for name in used if not name.startswith("dplb_shared_state_")}
check(bool(used), f"the rules and the dashboard use {len(used)} dplb metrics")
missing = sorted(used - exported)
check(not missing, f"every metric they name is exported by dplb: missing {missing}")
check.finish()
