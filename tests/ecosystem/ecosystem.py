"""What the Python ecosystem tests share, beyond bench/benchlib.py (processes, the mock engine and dplb on
ephemeral ports): the paths CTest passes, checks that count, a request helper, and a free loopback port for
programs that cannot report the one they bound."""

import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

SOURCE = Path(os.environ["DPLB_SOURCE_DIR"])
OUTPUT = Path(os.environ["DPLB_TEST_OUTPUT_DIR"])
DPLB = os.environ["DPLB_BINARY"]
MOCK_ENGINE = os.environ["DPLB_MOCK_ENGINE"]
sys.path.insert(0, str(SOURCE / "bench"))
import benchlib  # noqa: E402,F401  (re-exported for the tests)

OUTPUT.mkdir(parents=True, exist_ok=True)


class Checks:
    """Named checks that all run; the closing line counts them, and the exit status fails the test if one failed."""

    def __init__(self):
        self.passed = 0
        self.failed = []

    def __call__(self, condition, what):
        print(("ok: " if condition else "FAILED: ") + what, flush=True)
        if condition:
            self.passed += 1
        else:
            self.failed.append(what)
        return condition

    def finish(self):
        print(f"{self.passed} passed, {len(self.failed)} failed")
        sys.exit(1 if self.failed else 0)


def post_json(url, body, timeout=15):
    """(status, parsed body) of a JSON POST; HTTP errors are answers too."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def free_port():
    """A loopback port free a moment ago, for a program that cannot bind port 0 and say which it got."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*args, check_status=True):
    """A command's output (stdout and stderr); exits the test with that output when it fails and check_status."""
    result = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    if check_status and result.returncode != 0:
        sys.exit(f"{' '.join(map(str, args))} exited {result.returncode}:\n{result.stdout}")
    return result.stdout


def library_packages(binary):
    """{shared library a binary links (its DT_NEEDED entries, as ldd resolves them): the Debian package names that
    satisfy it (its package and what that provides)}. The libraries those load in turn come with their packages'
    own dependencies (libzmq5 brings libsodium23, libpgm and the rest), so only the binary's own are checked."""
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run("readelf", "-d", binary)))
    owners = {}
    for soname, library in re.findall(r"^\s*(\S+) => (/\S+)", run("ldd", binary), re.M):
        if soname not in needed:
            continue
        owner = run("dpkg", "-S", os.path.realpath(library), check_status=False)
        if "no path found" in owner:
            owner = run("dpkg", "-S", library, check_status=False)
        package = owner.split(":")[0].strip()
        provides = run("dpkg-query", "-W", "-f=${Provides}", package, check_status=False)
        owners[library] = {package} | {re.sub(r"\s*\(.*\)", "", p).strip() for p in provides.split(",") if p.strip()}
    return owners
