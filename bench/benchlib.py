"""Helpers shared by the Python benchmark drivers (imbalance.py, scale.py): child processes that log to a
file and are stopped by their own pid, and sums over Prometheus text. Standard library only."""

import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Process:
    """A child whose stdout and stderr go to a log file; stopped by its own pid."""

    def __init__(self, args, log_path):
        self.log_path = log_path
        self.log_file = open(log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log_file, stderr=subprocess.STDOUT)

    @property
    def pid(self):
        return self.proc.pid

    @property
    def returncode(self):
        return self.proc.returncode

    def log_text(self):
        return Path(self.log_path).read_text()

    def await_line(self, pattern, timeout=10.0):
        """The first match of `pattern` in the log, waiting (bounded) for the line to appear."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            match = regex.search(self.log_text())
            if match:
                return match
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError(f"timed out waiting for /{pattern}/ in {self.log_path}:\n" + self.log_text())

    def stop(self, timeout=15):
        """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


def metric_sum(text, name):
    """Sum of every sample of a metric (all label sets) in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total
