#!/usr/bin/env python3
"""Summarises one bench/profile.sh run: reads RESULTS/raw/ (runs.tsv, settings.tsv, the client JSONs, the
strace -c summaries) and RESULTS/callgrind/ (the dumps), prints the tables and writes

  RESULTS/profile.tsv    target, load, tool: units measured (requests or events), the total counted
                         (instructions or system calls), per unit, and the background share
  RESULTS/syscalls.tsv   target, load, system call: calls and failed calls, in all and per unit
  RESULTS/profile.json   all of the above, the settings and the checks

  python3 bench/profile_report.py RESULTS_DIR

A unit is a request of the `requests` load and a relayed SSE event of the `streams` load. The background
share is the count per second of the idle window after the load, times the measured window's length,
over the measured count: what timers and health checks add to the figure. Exit status 1 when a client
failed (a request not answered 200, a stream short of events) or, outside the quick smoke, a background
share reached 2%; else 0. Standard library only.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

BACKGROUND_LIMIT = 0.02
UNIT = {"requests": "request", "streams": "event"}


def read_tsv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


def callgrind_ir(path: Path) -> int:
    """Instructions in one dump: its `totals:` line (the sum of its cost lines; `summary:` may differ)."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise ValueError(f"no totals: line in {path}")


def strace_counts(path: Path) -> dict[str, tuple[int, int]]:
    """syscall -> (calls, failed calls) from an `strace -c` table; the `total` line is left out."""
    counts: dict[str, tuple[int, int]] = {}
    for line in path.read_text(errors="replace").splitlines():
        fields = line.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(fields) not in (5, 6) or not fields[0][0].isdigit() or fields[-1] == "total":
            continue
        try:
            calls = int(fields[3])
            errors = int(fields[4]) if len(fields) == 6 else 0
        except ValueError:
            continue
        counts[fields[-1]] = (calls, errors)
    return counts


def fmt_count(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def fmt_rate(v: float | None) -> str:
    if v is None:
        return "-"
    return "<0.01" if 0 < v < 0.005 else f"{v:.2f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    for r in rows:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(out)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    results = Path(sys.argv[1])
    settings = {r["key"]: r["value"] for r in read_tsv(results / "raw/settings.tsv")}
    quick = settings.get("quick") == "1"
    runs = read_tsv(results / "raw/runs.tsv")
    rows: list[dict] = []
    syscalls: list[dict] = []
    checks: list[dict] = []

    for run in runs:
        client = json.loads((results / "raw" / run["client_json"]).read_text())
        measured = client["measured"]
        units = measured["requests"] if run["load"] == "requests" else measured["events"]
        label = f'{run["target"]} {run["load"]} ({run["tool"]})'
        checks.append({"check": f"{label}: every request answered 200"
                       + (", every stream relayed all its events" if run["load"] == "streams" else ""),
                       "passed": bool(client.get("passed")),
                       "detail": client.get("failure") or measured.get("errors") or ""})
        data, idle = results / run["data"], results / run["idle_data"]
        if run["tool"] == "callgrind":
            total, idle_total = callgrind_ir(data), callgrind_ir(idle)
        else:
            counts = strace_counts(data)
            total = sum(c for c, _ in counts.values())
            idle_total = sum(c for c, _ in strace_counts(idle).values())
            for name, (calls, errors) in sorted(counts.items(), key=lambda kv: -kv[1][0]):
                syscalls.append({"target": run["target"], "load": run["load"], "syscall": name, "calls": calls,
                                 "errors": errors, "per_unit": calls / units if units else None,
                                 "errors_per_unit": errors / units if units else None})
        window_s, idle_s = float(run["window_s"]), float(run["idle_s"])
        background = (idle_total / idle_s * window_s / total) if total and idle_s > 0 else None
        rows.append({"target": run["target"], "load": run["load"], "tool": run["tool"],
                     "units": units, "total": total, "per_unit": total / units if units else None,
                     "window_s": window_s, "idle_total": idle_total, "idle_s": idle_s,
                     "background": background, "client": client})
        if background is not None:
            checks.append({"check": f"{label}: background under {BACKGROUND_LIMIT:.0%} of the count",
                           "passed": background < BACKGROUND_LIMIT or quick,
                           "detail": f"{background:.3%}" + (" (quick: not enforced)" if quick else "")})

    targets = list(dict.fromkeys(r["target"] for r in rows))

    def per_unit(target, load, tool):
        for r in rows:
            if (r["target"], r["load"], r["tool"]) == (target, load, tool):
                return r["per_unit"]
        return None

    def count_of(load, tool):
        for r in rows:
            if (r["load"], r["tool"]) == (load, tool):
                return r["units"]
        return None

    print()
    print("Per-request cost profile (bench/profile.sh): user-space instructions (callgrind) and system calls")
    print("(strace -c) of the proxy process, per request and per relayed SSE event")
    loads = []
    for tool in ("callgrind", "strace"):
        n, e = count_of("requests", tool), count_of("streams", tool)
        if n is not None or e is not None:
            loads.append(f'  {tool}: {fmt_count(n)} requests over {settings.get("connections")} connections; '
                         f'{settings.get("streams")} streams x {settings.get("tokens")} tokens = {fmt_count(e)} events '
                         f'({settings.get("itl_ms")} ms apart)')
    print("\n".join(loads))
    print()
    print(table(["target", "instr/request", "instr/event", "syscalls/request", "syscalls/event"],
                [[t, fmt_count(per_unit(t, "requests", "callgrind")), fmt_count(per_unit(t, "streams", "callgrind")),
                  fmt_rate(per_unit(t, "requests", "strace")), fmt_rate(per_unit(t, "streams", "strace"))]
                 for t in targets]))

    for load in ("requests", "streams"):
        subset = [s for s in syscalls if s["load"] == load]
        if not subset:
            continue
        names = sorted({s["syscall"] for s in subset},
                       key=lambda n: -max(s["per_unit"] or 0 for s in subset if s["syscall"] == n))
        # Only the system calls that matter: at least 0.01 per unit for some target.
        names = [n for n in names if max(s["per_unit"] or 0 for s in subset if s["syscall"] == n) >= 0.01]
        body = []
        for n in names:
            line = [n]
            for t in targets:
                hit = [s for s in subset if s["target"] == t and s["syscall"] == n]
                if not hit or hit[0]["per_unit"] is None:
                    line.append("-")
                else:
                    cell = fmt_rate(hit[0]["per_unit"])
                    if hit[0]["errors"] and hit[0]["errors_per_unit"] >= 0.005:
                        cell += f' ({fmt_rate(hit[0]["errors_per_unit"])} failed)'
                    line.append(cell)
            body.append(line)
        body.append(["all"] + [fmt_rate(per_unit(t, load, "strace")) for t in targets])
        print()
        print(f"System calls per {UNIT[load]} (failed ones, e.g. EAGAIN, in brackets):")
        print(table(["syscall"] + targets, body))

    print()
    print("Background (timers, health checks) as a share of each count:")
    print("  " + "; ".join(f'{r["target"]} {r["load"]} {r["tool"]} '
                           + ("-" if r["background"] is None else f'{r["background"]:.2%}') for r in rows))
    failed = [c for c in checks if not c["passed"]]
    for c in failed:
        print(f'FAILED: {c["check"]}: {c["detail"]}')
    print(f"{len(checks) - len(failed)} passed, {len(failed)} failed")

    columns = ["target", "load", "tool", "units", "total", "per_unit", "window_s", "idle_total", "idle_s", "background"]
    with (results / "profile.tsv").open("w") as f:
        f.write("\t".join(columns) + "\n")
        for r in rows:
            f.write("\t".join("NA" if r[c] is None else (f"{r[c]:.6g}" if isinstance(r[c], float) else str(r[c]))
                              for c in columns) + "\n")
    sys_columns = ["target", "load", "syscall", "calls", "errors", "per_unit", "errors_per_unit"]
    with (results / "syscalls.tsv").open("w") as f:
        f.write("\t".join(sys_columns) + "\n")
        for s in syscalls:
            f.write("\t".join("NA" if s[c] is None else (f"{s[c]:.6g}" if isinstance(s[c], float) else str(s[c]))
                              for c in sys_columns) + "\n")
    summary = [{k: v for k, v in r.items() if k != "client"} for r in rows]
    (results / "profile.json").write_text(json.dumps(
        {"settings": settings, "runs": summary, "syscalls": syscalls, "checks": checks,
         "passed": not failed}, indent=1) + "\n")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
