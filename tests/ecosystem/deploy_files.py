"""The rest of the deploy kit holds: deploy/compose.yaml is valid (`docker-compose config`), mounts files that
exist, and starts dplb and the simulated ranks with options the real binaries accept; its profile `pd` (prefill/decode
disaggregation) adds a prefill and a decode mock in their roles and a dplb whose --prefill and --decode name their
ranks, one URL per rank, on ports apart from the default services'; its profile `replicas` adds a Redis (7 or later),
two dplb replicas sharing their ledger in it under names of their own, and an L4 round-robin splitter (HAProxy, its
configuration checked by `haproxy -c` where HAProxy is installed) in front of exactly them; every vLLM engine in it
publishes its KV-cache events (--kv-events-config) and each dplb backend that names a publisher (kv-events=,
kv-replay=) points at the port its engine's rank binds, base + DP rank; the Dockerfile's runtime
stage installs every library the binaries load, runs as a non-root user and checks /health; the systemd unit
passes `systemd-analyze verify` and its security review rates it OK. No Docker daemon or registry is needed (none
is reachable here): the image itself is not built."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from ecosystem import DPLB, MOCK_ENGINE, OUTPUT, SOURCE, Checks, benchlib, library_packages

check = Checks()
deploy = SOURCE / "deploy"

# compose.yaml
result = subprocess.run(["docker-compose", "-f", str(deploy / "compose.yaml"), "config", "-q"],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
check(result.returncode == 0, f"docker-compose config accepts compose.yaml: {result.stdout.strip()}")
compose = yaml.safe_load((deploy / "compose.yaml").read_text())
services = compose["services"]
check({"dplb", "rank0", "rank1", "rank2", "rank3", "prometheus", "grafana"} <= set(services),
      f"dplb, four ranks, Prometheus and Grafana: {sorted(services)}")
default_services = {name for name, service in services.items() if not service.get("profiles")}
pd_services = {name for name, service in services.items() if "pd" in (service.get("profiles") or [])}
check(default_services == {"dplb", "rank0", "rank1", "rank2", "rank3", "prometheus", "grafana"},
      f"without a profile, compose starts dplb, the four ranks, Prometheus and Grafana: {sorted(default_services)}")
check(pd_services == {"prefill", "decode", "dplb-pd"},
      f"profile pd adds a prefill mock, a decode mock and their dplb: {sorted(pd_services)}")
for name, service in services.items():
    for volume in service.get("volumes", []):
        source = volume.split(":")[0]
        check((deploy / source).exists(), f"{name} mounts {source}, which exists")


def option(args, name):
    """The value of a command-line option, `name value` or `name=value`; None without it."""
    values = options(args, name)
    return values[0] if values else None


def options(args, name):
    """Every value of a command-line option that may be repeated (--backend, --prefill, --decode), in order."""
    values = []
    for at, arg in enumerate(args):
        if arg == name and at + 1 < len(args):
            values.append(args[at + 1])
        elif arg.startswith(name + "="):
            values.append(arg[len(name) + 1:])
    return values


def url_list(args, name):
    """The engine URLs of --backend, --prefill or --decode: every value, each a comma-separated list."""
    return [url.strip() for value in options(args, name) for url in value.split(",") if url.strip()]


dplb_args = services["dplb"]["command"]
backends = next(a.split("=", 1)[1] for a in dplb_args if a.startswith("--backend="))
hosts = [re.match(r"http://([^:/]+)", url).group(1) for url in backends.split(",")]
check(all(h in services for h in hosts), f"dplb's backends are the compose services {hosts}")
checked = subprocess.run([DPLB, "--check-config", *dplb_args], env={**os.environ, **services["dplb"]["environment"]},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
check(checked.returncode == 0 and "configuration OK" in checked.stdout,
      f"dplb accepts its compose options and environment (--check-config): {checked.stdout.strip()}")
# The ranks' options, on loopback and an ephemeral port here instead of 0.0.0.0:8000.
rank_args = list(services["rank0"]["command"])
for flag in ("--host", "--port", "--kv-events-port", "--kv-replay-port"):
    if flag in rank_args:
        at = rank_args.index(flag)
        del rank_args[at:at + 2]
events_base = benchlib.free_port_block(2)
rank_args += ["--kv-events-port", str(events_base), "--kv-replay-port", str(events_base + 1)]
mock, ports, _ = benchlib.start_mock(MOCK_ENGINE, rank_args + ["--host", "127.0.0.1"], OUTPUT / "compose-rank.log")
mock.stop()
check(len(ports) == 1, "the mock engine starts with the ranks' compose options")

# Profile pd: the prefill and decode mocks in their roles, and dplb-pd naming each of their ranks once.
pd_args = [str(a) for a in services["dplb-pd"]["command"]]
pools = {"prefill": url_list(pd_args, "--prefill"), "decode": url_list(pd_args, "--decode")}
check(not options(pd_args, "--backend") and all(pools.values()),
      f"dplb-pd names its ranks with --prefill and --decode, without --backend: {pools}")
for role, urls in pools.items():
    endpoints = [re.match(r"http://([^:/#]+)(?::(\d+))?", url).groups() for url in urls]
    hosts_of_role = {host for host, _ in endpoints}
    for host in sorted(hosts_of_role):
        engine_args = [str(a) for a in (services.get(host) or {}).get("command") or []]
        check(host in pd_services and option(engine_args, "--kv-role") == role,
              f"dplb-pd's --{role} host {host} is a pd service running dplb-mock-engine --kv-role {role}")
        first = int(option(engine_args, "--port") or 8100)
        served = {first + i for i in range(int(option(engine_args, "--ranks") or 1))}
        listed = sorted(int(port or 80) for h, port in endpoints if h == host)
        check(listed == sorted(served),
              f"dplb-pd's --{role} lists each of {host}'s rank ports once: {listed}, served {sorted(served)}")
        # The role's options, with --simulate's absence (the roles refuse it), on ephemeral ports here.
        local = list(engine_args)
        for flag in ("--host", "--port"):
            if flag in local:
                at = local.index(flag)
                del local[at:at + 2]
        mock, ports, _ = benchlib.start_mock(MOCK_ENGINE, local + ["--host", "127.0.0.1"], OUTPUT / f"compose-{host}.log")
        mock.stop()
        check(len(ports) == len(served), f"the mock engine starts with {host}'s compose options ({len(ports)} ranks)")
pd_listen = option(pd_args, "--listen")
pd_ports = [str(p) for p in services["dplb-pd"].get("ports", [])]
check(pd_listen is not None and any(p.rsplit(":", 1)[-1] == pd_listen.rsplit(":", 1)[-1] for p in pd_ports),
      f"dplb-pd publishes the port it listens on ({pd_listen}): {pd_ports}")
published = {}
for name, service in services.items():
    for port in service.get("ports", []):
        published.setdefault(str(port).rsplit(":", 1)[0].split(":")[-1], []).append(name)
check(all(len(names) == 1 for names in published.values()),
      f"no two services publish the same host port, so profile pd runs beside the default services: {published}")
help_text = subprocess.run([DPLB, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30).stdout
if "--prefill" in help_text:
    checked = subprocess.run([DPLB, "--check-config", *pd_args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=30)
    check(checked.returncode == 0 and "configuration OK" in checked.stdout,
          f"dplb accepts dplb-pd's compose options (--check-config): {checked.stdout.strip()}")
else:
    print("skipped: dplb-pd's options against --check-config (this dplb has no --prefill yet)")

# Profile replicas: two dplb replicas sharing one ledger in a Redis of the profile, behind an L4 splitter that
# round-robins TCP connections over exactly them.
replicas_services = {name for name, service in services.items() if "replicas" in (service.get("profiles") or [])}
check(replicas_services == {"redis", "dplb-a", "dplb-b", "lb"},
      f"profile replicas adds Redis, two dplb replicas and a splitter: {sorted(replicas_services)}")
redis_image = str(services.get("redis", {}).get("image", ""))
check(re.fullmatch(r"redis:(\d+)(\..*)?", redis_image) is not None and int(redis_image.split(":")[1].split(".")[0]) >= 7,
      f"Redis is 7 or later, for the ledger's Redis Functions: {redis_image}")
replica_args = {name: [str(a) for a in services[name]["command"]] for name in ("dplb-a", "dplb-b") if name in services}
shared = {name: option(args, "--shared-state") for name, args in replica_args.items()}
check(len(set(shared.values())) == 1 and all(re.fullmatch(r"redis://(?:[^@/]*@)?redis:\d+(?:/\d+)?", s or "")
                                             for s in shared.values()),
      f"both replicas share the profile's Redis (--shared-state): {shared}")
names = {name: option(args, "--replica-name") for name, args in replica_args.items()}
check(all(names.values()) and len(set(names.values())) == len(names), f"the replicas' names differ: {names}")
check(len({tuple(url_list(args, "--backend")) for args in replica_args.values()}) == 1,
      "both replicas list the same backends (one ledger is shared by replicas of one backend list)")
check(all(h in services for args in replica_args.values()
          for h in (re.match(r"http://([^:/#]+)", u).group(1) for u in url_list(args, "--backend"))),
      "the replicas' backends are compose services")
splitter = next((v.split(":")[0] for v in services.get("lb", {}).get("volumes", []) if v.endswith("haproxy.cfg:ro")), None)
check(splitter is not None, f"the splitter mounts its HAProxy configuration: {services.get('lb', {}).get('volumes')}")
if splitter:
    cfg = (deploy / splitter).read_text()
    listens = {name: option(args, "--listen").rsplit(":", 1)[1] for name, args in replica_args.items()}
    servers = dict(re.findall(r"^\s*server\s+\S+\s+([^:\s]+):(\d+)", cfg, re.M))
    check(servers == listens, f"the splitter's servers are the replicas on the ports they listen on: {servers}, {listens}")
    check(re.search(r"^\s*mode tcp\b", cfg, re.M) and re.search(r"^\s*balance roundrobin\b", cfg, re.M),
          "the splitter is L4 (mode tcp) and round-robin")
    lb_ports = [str(p) for p in services["lb"].get("ports", [])]
    bind = re.search(r"^\s*bind\s+\S*:(\d+)", cfg, re.M)
    check(bind is not None and any(p.rsplit(":", 1)[-1] == bind.group(1) for p in lb_ports),
          f"the splitter publishes the port it binds: {lb_ports}")
    if shutil.which("haproxy"):
        # Outside compose the replicas' names do not resolve: init-addr none lets HAProxy start without them.
        result = subprocess.run(["haproxy", "-c", "-f", str(deploy / splitter)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=30)
        check(result.returncode == 0, f"haproxy -c accepts {splitter}: {result.stdout.strip()[-300:]}")
    else:
        print(f"skipped: haproxy -c on {splitter} (no haproxy here; scripts/setup.sh installs it with DPLB_SETUP_BENCH=1)")
if "--shared-state" in help_text:
    for name, args in replica_args.items():
        checked = subprocess.run([DPLB, "--check-config", *args],
                                 env={**os.environ, **(services[name].get("environment") or {})},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
        check(checked.returncode == 0 and "configuration OK" in checked.stdout,
              f"dplb accepts {name}'s compose options (--check-config): {checked.stdout.strip()}")
else:
    print("skipped: the replicas' options against --check-config (this dplb has no --shared-state yet)")

prometheus_targets = yaml.safe_load((deploy / "prometheus/prometheus.yml").read_text())["scrape_configs"]
scraped = {t.split(":")[0] for job in prometheus_targets for group in job["static_configs"] for t in group["targets"]}
check(scraped == {"dplb"} | set(hosts), f"Prometheus scrapes dplb and every rank: {sorted(scraped)}")


# KV-cache events: which services publish them (vLLM's --kv-events-config) and on which ports.
def fragment(url):
    """The options after '#' in a backend URL, `dp=4&kv-events=tcp://h:5557`, as a dict."""
    return dict(option.split("=", 1) for option in url.partition("#")[2].split("&") if option)


publishers = {}  # service: {"kv-events": base port, "kv-replay": base port or None, "ranks": [DP ranks], "block_size"}
for name, service in services.items():
    args = service.get("command") or []
    args = args.split() if isinstance(args, str) else [str(a) for a in args]
    text = option(args, "--kv-events-config")
    if str(service.get("image", "")).startswith("vllm/"):
        check(text is not None, f"{name} (vLLM) runs with --kv-events-config")
    if text is None and option(args, "--kv-events-port") is not None:
        # The simulated ranks (dplb-mock-engine): engine e of the process on --kv-events-port + e (and replay),
        # as vLLM's DP rank j on its base + j.
        engines = int(option(args, "--ranks") or 1) * int(option(args, "--dp") or 1)
        publishers[name] = {"kv-events": int(option(args, "--kv-events-port")),
                            "kv-replay": int(option(args, "--kv-replay-port")) if option(args, "--kv-replay-port") else None,
                            "ranks": list(range(engines)), "block_size": int(option(args, "--block-size") or 16)}
        continue
    if text is None:
        continue
    kv = json.loads(text)
    bases = {}
    for key, field in (("kv-events", "endpoint"), ("kv-replay", "replay_endpoint")):
        bound = re.fullmatch(r"tcp://(?:\*|0\.0\.0\.0):(\d+)", kv.get(field) or "")
        bases[key] = int(bound.group(1)) if bound else None
    size = int(option(args, "--data-parallel-size") or 1)
    rank = option(args, "--data-parallel-rank")
    ranks = [int(rank)] if rank is not None else list(range(size))
    check(kv.get("enable_kv_cache_events") is True and kv.get("publisher") == "zmq" and bases["kv-events"] is not None,
          f"{name} publishes its KV-cache events with ZMQ on tcp://*:PORT: {text}")
    if bases["kv-replay"] is not None:
        check(abs(bases["kv-replay"] - bases["kv-events"]) >= size,
              f"{name}: its replay ports and event ports (base + 0..{size - 1} each) do not overlap")
    publishers[name] = {**bases, "ranks": ranks, "block_size": int(option(args, "--block-size") or 16)}
named = 0
engine_urls = [(dplb_args, url) for url in url_list(dplb_args, "--backend")]
engine_urls += [(pd_args, url) for url in pools["prefill"] + pools["decode"]]
for args_of_dplb, url in engine_urls:
    frag, host = fragment(url), re.match(r"http://([^:/#]+)", url).group(1)
    dp = int(frag.get("dp", 1))
    for key in ("kv-events", "kv-replay"):
        if key not in frag:
            continue
        named += 1
        target = re.fullmatch(r"tcp://([^:/]+):(\d+)", frag[key])
        engine = publishers.get(host)
        # dplb connects the backend's j-th rank to PORT + j; that engine rank binds base + its DP rank.
        check(target is not None and target.group(1) == host and engine is not None and engine[key] is not None
              and len(engine["ranks"]) == dp
              and all(int(target.group(2)) + j == engine[key] + rank for j, rank in enumerate(engine["ranks"])),
              f"backend {url}: {key} reaches the publisher of each of its ranks (base + DP rank)")
    if host in publishers and {"kv-events", "kv-replay"} & set(frag):
        check(int(option(args_of_dplb, "--block-size") or 16) == publishers[host]["block_size"],
              f"dplb's --block-size is {host}'s --block-size (both 16 when unset)")
print(f"KV-cache events: {len(publishers)} publishing services ({sorted(publishers)}), {named} kv-events/kv-replay "
      "fragments in dplb's backends")

# Dockerfile: the runtime stage has every library dplb and the mock engine load.
dockerfile = (deploy / "Dockerfile").read_text()
runtime = dockerfile.split("\nFROM debian:12-slim")[1]
installed = set(re.findall(r"\b(lib[a-z0-9.+-]+|curl)\b", runtime.split("&& rm -rf")[0]))
for binary in (DPLB, MOCK_ENGINE):
    for library, packages in library_packages(binary).items():
        essential = packages & {"libc6", "libgcc-s1", "libstdc++6"}  # in debian:12-slim already
        check(bool(packages & installed or essential), f"the image has {Path(library).name} ({sorted(packages)[0]})")
check(re.search(r"^USER 10001", runtime, re.M) is not None, "the image runs as a non-root user")
check("HEALTHCHECK" in runtime and "/health" in runtime and "curl" in installed, "the image checks /health with curl")

# The systemd unit, pointed at this build's binary (verify checks that the executable exists).
unit = (deploy / "systemd/dplb.service").read_text()
local_unit = OUTPUT / "dplb.service"
local_unit.write_text(unit.replace("/usr/bin/dplb", DPLB))
verify = subprocess.run(["systemd-analyze", "verify", str(local_unit)], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, timeout=60)
check(verify.returncode == 0 and not verify.stdout.strip(), f"systemd-analyze verify: {verify.stdout.strip()}")
security = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(local_unit)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60).stdout
exposure = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", security)
check(exposure is not None and float(exposure.group(1)) <= 2.0,
      f"systemd-analyze security rates the unit's exposure at most 2.0: {exposure.group(0) if exposure else security[-300:]}")
for directive in ("ExecReload=/bin/kill -HUP $MAINPID", "RestartPreventExitStatus=2", "DynamicUser=yes"):
    check(directive in unit, f"the unit keeps {directive}")
check.finish()
