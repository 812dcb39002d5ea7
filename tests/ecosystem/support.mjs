// What the Node.js ecosystem tests share: the binaries under test started on ephemeral loopback ports,
// each stopped by its own pid, and their ports read from the lines they log when ready. The Python
// tests use bench/benchlib.py for the same.
import { spawn } from 'node:child_process';
import { createWriteStream, mkdirSync } from 'node:fs';
import path from 'node:path';

export const paths = {
  dplb: required('DPLB_BINARY'),
  mockEngine: required('DPLB_MOCK_ENGINE'),
  sourceDir: required('DPLB_SOURCE_DIR'),
  outputDir: required('DPLB_TEST_OUTPUT_DIR'),
};

function required(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run the ecosystem tests through ctest (tests/ecosystem/CMakeLists.txt)`);
  return value;
}

// A child process whose output is kept (and copied to a log file under the output directory); `waitFor`
// resolves with the first match of a pattern in that output, bounded in time.
export class Child {
  constructor(name, args) {
    mkdirSync(paths.outputDir, { recursive: true });
    this.name = name;
    this.output = '';
    this.log = createWriteStream(path.join(paths.outputDir, `${name}.log`));
    this.proc = spawn(args[0], args.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    this.exited = new Promise((resolve) => this.proc.on('exit', (code, signal) => resolve({ code, signal })));
    this.waiters = [];
    for (const stream of [this.proc.stdout, this.proc.stderr]) {
      stream.on('data', (chunk) => {
        this.output += chunk.toString();
        this.log.write(chunk);
        this.waiters = this.waiters.filter((w) => !w.check());
      });
    }
  }

  waitFor(pattern, timeoutMs = 10000) {
    return new Promise((resolve, reject) => {
      const waiter = {
        check: () => {
          const match = this.output.match(pattern);
          if (match) {
            clearTimeout(waiter.timer);
            resolve(match);
          }
          return Boolean(match);
        },
      };
      waiter.timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        reject(new Error(`${this.name}: no ${pattern} within ${timeoutMs} ms; its output:\n${this.output}`));
      }, timeoutMs);
      if (!waiter.check()) this.waiters.push(waiter);
      this.exited.then(({ code, signal }) => {
        if (this.waiters.includes(waiter)) {
          clearTimeout(waiter.timer);
          reject(new Error(`${this.name} exited (${code ?? signal}) before ${pattern}; its output:\n${this.output}`));
        }
      });
    });
  }

  // SIGTERM, then SIGKILL after `graceMs`; resolves with the exit status.
  async stop(graceMs = 10000) {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill('SIGTERM');
      const timer = setTimeout(() => this.proc.kill('SIGKILL'), graceMs);
      const status = await this.exited;
      clearTimeout(timer);
      this.log.end();
      return status;
    }
    this.log.end();
    return this.exited;
  }
}

// The mock engine with `ranks` ranks (one port each), plus `args`: { child, ports }.
export async function startMockEngine(name, ranks, args = []) {
  const child = new Child(name, [paths.mockEngine, '--port', '0', '--ranks', String(ranks), ...args]);
  await child.waitFor(/mock-engine ready/);
  const ports = [...child.output.matchAll(/rank \d+ listening on [\d.]+:(\d+)/g)].map((m) => Number(m[1]));
  return { child, ports };
}

// dplb on an ephemeral port in front of 127.0.0.1:<port> for each port, plus `args`: { child, port, url }.
export async function startDplb(name, backendPorts, args = []) {
  const backends = backendPorts.flatMap((port) => ['--backend', `http://127.0.0.1:${port}`]);
  const child = new Child(name, [paths.dplb, '--listen', '127.0.0.1:0', '--log-level', 'info', ...backends, ...args]);
  const port = Number((await child.waitFor(/listening on 127\.0\.0\.1:(\d+)/))[1]);
  return { child, port, url: `http://127.0.0.1:${port}` };
}
