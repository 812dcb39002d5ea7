"""The rest of the deploy kit holds: deploy/compose.yaml is valid (`docker-compose config`), mounts files that
exist, and starts dplb and the simulated ranks with options the real binaries accept; the Dockerfile's runtime
stage installs every library the binaries load, runs as a non-root user and checks /health; the systemd unit
passes `systemd-analyze verify` and its security review rates it OK. No Docker daemon or registry is needed (none
is reachable here): the image itself is not built."""

import os
import re
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
for name, service in services.items():
    for volume in service.get("volumes", []):
        source = volume.split(":")[0]
        check((deploy / source).exists(), f"{name} mounts {source}, which exists")
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
for option in ("--host", "--port"):
    at = rank_args.index(option)
    del rank_args[at:at + 2]
mock, ports, _ = benchlib.start_mock(MOCK_ENGINE, rank_args + ["--host", "127.0.0.1"], OUTPUT / "compose-rank.log")
mock.stop()
check(len(ports) == 1, "the mock engine starts with the ranks' compose options")
prometheus_targets = yaml.safe_load((deploy / "prometheus/prometheus.yml").read_text())["scrape_configs"]
scraped = {t.split(":")[0] for job in prometheus_targets for group in job["static_configs"] for t in group["targets"]}
check(scraped == {"dplb"} | set(hosts), f"Prometheus scrapes dplb and every rank: {sorted(scraped)}")

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
