"""The Debian package: scripts/package.sh builds it; `dpkg -i` installs it; the installed dplb answers
--version and proxies a request to the installed mock engine; the package declares every shared library the
binaries load (so a clean Debian 12 that resolves its Depends has them); `dpkg -r` removes the binaries and
keeps the edited configuration, `dpkg --purge` removes that too. Needs root (dpkg), as CI runs."""

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from ecosystem import OUTPUT as output, SOURCE as source, Checks, benchlib, library_packages, run

build_dir = Path(os.environ["DPLB_BUILD_DIR"])
check = Checks()




def installed():
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "dplb"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True).stdout
    return "install ok installed" in status


if os.geteuid() != 0:
    sys.exit("package_deb: dpkg -i needs root; run the tests as root (CI does)")
if installed():
    maintainer = run("dpkg-query", "-W", "-f=${Maintainer}", "dplb")
    if "dplb@localhost" not in maintainer:
        sys.exit(f"package_deb: another package named dplb is installed ({maintainer}); not touching it")

version = re.search(r"project\(dplb VERSION ([\d.]+)", (source / "CMakeLists.txt").read_text()).group(1)
deb = Path(run(str(source / "scripts/package.sh"), str(build_dir)).strip().splitlines()[-1])
check(deb.name == f"dplb_{version}_amd64.deb", f"package.sh made {deb.name}")

fields = run("dpkg-deb", "-f", str(deb), "Package", "Version", "Depends")
depends = {re.sub(r"\s*\(.*\)", "", d).strip() for d in re.search(r"Depends: (.*)", fields).group(1).split(",")}
check(f"Version: {version}" in fields, f"the package's version is {version}")
conffiles = run("sh", "-c", f"dpkg-deb --ctrl-tarfile {deb} | tar -xO ./conffiles")
check("/etc/dplb/dplb.json" in conffiles.split(), "/etc/dplb/dplb.json is a conffile")

try:
    run("dpkg", "-i", str(deb))
    check(installed(), "dpkg -i installed it")
    check(run("/usr/bin/dplb", "--version").strip() == f"dplb {version}", "the installed dplb says its version")
    check("configuration OK" in run("/usr/bin/dplb", "--check-config", "--config", "/etc/dplb/dplb.json"),
          "the installed configuration passes --check-config")
    unit = Path("/usr/lib/systemd/system/dplb.service").read_text()
    check("ExecStart=/usr/bin/dplb --config /etc/dplb/dplb.json" in unit, "the unit starts the installed binary")

    # Every shared library the binaries load comes from a package the .deb depends on.
    # A dependency may name the package or a virtual one it provides (libspdlog1.10-fmt9).
    for binary in ("/usr/bin/dplb", "/usr/bin/dplb-mock-engine", "/usr/bin/dplb-bench"):
        for library, names in library_packages(binary).items():
            check(bool(names & depends), f"{binary} loads {library} from {sorted(names)[0]}, a dependency")

    # The installed binaries run: the mock engine's two ranks behind dplb, one request through.
    mock, ports, _ = benchlib.start_mock("/usr/bin/dplb-mock-engine", ["--ranks", "2"], output / "deb-mock.log")
    try:
        dplb, port = benchlib.start_dplb("/usr/bin/dplb", "round-robin", ports, output / "deb-dplb.log")
        try:
            body = b'{"model": "mock-model", "prompt": "hello", "max_tokens": 3}'
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                check(answer.status == 200 and b'"usage"' in answer.read(), "a completion through the installed dplb")
        finally:
            dplb.stop()
    finally:
        mock.stop()

    Path("/etc/dplb/dplb.json").write_text(Path("/etc/dplb/dplb.json").read_text().replace('"info"', '"warn"'))
    run("dpkg", "-r", "dplb")
    check(not Path("/usr/bin/dplb").exists(), "dpkg -r removed the binary")
    check(Path("/etc/dplb/dplb.json").exists(), "dpkg -r kept the edited configuration")
finally:
    run("dpkg", "--purge", "dplb", check_status=False)
check(not Path("/etc/dplb/dplb.json").exists(), "dpkg --purge removed the configuration")

check.finish()
