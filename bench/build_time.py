#!/usr/bin/env python3
"""Estimates a build's wall time on an idle machine of N cores from a measured build (bench/build_time.sh):
each build edge lasts the CPU time (user+sys) it took, and N workers run the edges of the build graph
(ninja -t graph) in dependency order. Ninja 1.11 starts ready edges in no order of priority, so this
prints the median and the range over 200 random orders, and the critical path.
Usage: build_time.py BUILD_DIR TIMES_LOG CORES TARGET...   (TIMES_LOG: "user sys wall output maxrss_kb" lines)"""
import heapq
import random
import re
import subprocess
import sys


def main():
    build_dir, log, cores, targets = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    cost, rss = {}, {}
    for line in open(log):
        parts = line.split()
        if len(parts) >= 5 and re.fullmatch(r'[\d.]+', parts[0]):
            cost[parts[3]] = cost.get(parts[3], 0) + float(parts[0]) + float(parts[1])
            rss[parts[3]] = int(parts[4])
    dot = subprocess.run(['ninja', '-C', build_dir, '-t', 'graph', *targets], capture_output=True, text=True,
                         check=True).stdout
    label, rule_nodes = {}, set()
    for m in re.finditer(r'^"(\w+)" \[label="([^"]*)"(, shape=ellipse)?\]', dot, re.M):
        label[m.group(1)] = m.group(2)
        if m.group(3):
            rule_nodes.add(m.group(1))
    inputs, outputs = {}, {}  # build edge -> its input / output files
    for n, m in enumerate(re.finditer(r'^"(\w+)" -> "(\w+)"(?: \[(.*)\])?$', dot, re.M)):
        a, b, attrs = m.group(1), m.group(2), m.group(3) or ''
        if 'label=' in attrs:  # an edge of one input and one output, drawn as an arrow
            inputs[f'edge{n}'], outputs[f'edge{n}'] = [a], [b]
        elif b in rule_nodes:
            inputs.setdefault(b, []).append(a)
        elif a in rule_nodes:
            outputs.setdefault(a, []).append(b)
    edges = set(inputs) | set(outputs)
    producer = {f: e for e, files in outputs.items() for f in files}
    duration = {e: sum(cost.get(label.get(f, ''), 0) for f in outputs.get(e, [])) for e in edges}
    needs = {e: {producer[f] for f in inputs.get(e, []) if f in producer} for e in edges}
    users = {e: set() for e in edges}
    for e, deps in needs.items():
        for d in deps:
            users[d].add(e)
    tail = {}

    def path_from(e):  # the longest chain of work from the start of e to the end of the build
        if e not in tail:
            tail[e] = duration[e] + max((path_from(u) for u in users[e]), default=0)
        return tail[e]

    def replay(rng):
        waiting = {e: len(deps) for e, deps in needs.items()}
        ready = [(rng.random(), e) for e, k in waiting.items() if k == 0]
        heapq.heapify(ready)
        running, now, free = [], 0.0, cores
        while ready or running:
            while ready and free:
                e = heapq.heappop(ready)[1]
                heapq.heappush(running, (now + duration[e], e))
                free -= 1
            now, e = heapq.heappop(running)
            free += 1
            for u in users[e]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready, (rng.random(), u))
        return now

    walls = sorted(replay(random.Random(seed)) for seed in range(200))
    largest = max(rss, key=rss.get)
    print(f'compiles and links timed: {len(cost)}; CPU (user+sys) {sum(cost.values()):.0f} s; '
          f'critical path {max(path_from(e) for e in edges):.0f} s')
    print(f'estimated wall time on {cores} idle cores: median {walls[len(walls) // 2]:.0f} s '
          f'(range {walls[0]:.0f}-{walls[-1]:.0f} s)')
    print(f'largest memory: {rss[largest] / 1e6:.2f} GB ({largest})')


if __name__ == '__main__':
    main()
