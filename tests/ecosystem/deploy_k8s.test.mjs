// deploy/k8s holds: every manifest is valid against the Kubernetes API schemas (npm kubernetes-models, and
// @kubernetes-models/prometheus-operator for the ServiceMonitor), and each overlay is consistent as a whole:
// selectors select the pods they mean, named ports and probes exist, the ConfigMap the dplb pods mount exists with
// its key, that key is a configuration the real dplb accepts (--check-config), its backends are the engines the
// overlay runs (names, count, #dp=N against --data-parallel-size), every engine publishes its KV-cache events and
// dplb's kv-events=/kv-replay= fragments reach each rank's publisher (base port + DP rank, vLLM's rule) with the
// engines' block size, and dplb's pods are locked down. The prefill/decode overlay (pd) also: dplb's "prefill" and
// "decode" lists name the engines of that role, every engine runs NixlConnector (kv_both) with its side channel on
// the pod's IP and ports of its own. The base's shared ledger: dplb's --shared-state reaches the Redis the base runs
// (7 or later, one pod at a time, no persistence) through its Service, both read the password from the same Secret
// key as files (dplb's --shared-state-password-file), only dplb's pods may reach Redis, and each replica is named
// after its pod.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, statSync, writeFileSync, existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { Deployment, StatefulSet } from 'kubernetes-models/apps/v1';
import { ConfigMap, Secret, Service } from 'kubernetes-models/v1';
import { NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
import { paths } from './support.mjs';

const root = path.join(paths.sourceDir, 'deploy/k8s');
const models = {
  'apps/v1': { Deployment, StatefulSet },
  v1: { ConfigMap, Secret, Service },
  'networking.k8s.io/v1': { NetworkPolicy },
  'policy/v1': { PodDisruptionBudget },
  'monitoring.coreos.com/v1': { ServiceMonitor },
};

function documents(file) {
  return parseAllDocuments(readFileSync(file, 'utf8')).map((doc) => {
    assert.equal(doc.errors.length, 0, `${file}: ${doc.errors.join('; ')}`);
    return doc.toJS();
  }).filter(Boolean);
}

// A kustomization's objects, following its resources (files and directories) as kustomize does.
function build(dir) {
  const kustomization = documents(path.join(dir, 'kustomization.yaml'))[0];
  const objects = [];
  for (const resource of kustomization.resources) {
    const target = path.join(dir, resource);
    assert.ok(existsSync(target), `${dir}/kustomization.yaml names ${resource}, which does not exist`);
    if (statSync(target).isDirectory()) objects.push(...build(target));
    else objects.push(...documents(target).map((object) => ({ ...object, file: target })));
  }
  return objects;
}

const overlays = readdirSync(root).filter((d) => d !== 'base' && existsSync(path.join(root, d, 'kustomization.yaml')));
const matches = (selector, labels) => Object.entries(selector).every(([k, v]) => labels?.[k] === v);
const podsOf = (objects) => objects.filter((o) => ['Deployment', 'StatefulSet'].includes(o.kind));
const portNames = (workload) => workload.spec.template.spec.containers.flatMap((c) => (c.ports ?? []).map((p) => p.name));
// The shared ledger's Redis (component shared-state) is neither dplb nor an engine.
const isLedger = (workload) => workload.spec.template.metadata.labels?.['app.kubernetes.io/component'] === 'shared-state';
const enginesOf = (objects) => podsOf(objects).filter((w) => w.metadata.name !== 'dplb' && !isLedger(w));

// The workloads whose pods a Service selects. A Service for one pod of a StatefulSet selects it by the label its
// controller sets, pod-name.
function selectedBy(service, objects) {
  const podName = service.spec.selector['statefulset.kubernetes.io/pod-name'];
  return podName
    ? podsOf(objects).filter((w) => w.kind === 'StatefulSet' && podName.startsWith(`${w.metadata.name}-`) &&
                                    Number(podName.slice(w.metadata.name.length + 1)) < w.spec.replicas)
    : podsOf(objects).filter((w) => matches(service.spec.selector, w.spec.template.metadata.labels));
}

// The options after '#' in a backend URL, `dp=4&kv-events=tcp://h:5557`, as a Map.
function fragment(url) {
  const options = (url.split('#')[1] ?? '').split('&').filter(Boolean);
  return new Map(options.map((option) => [option.slice(0, option.indexOf('=')), option.slice(option.indexOf('=') + 1)]));
}

// An engine's option as vLLM reads it: the word after `name` in its command line, an array of words or the script
// of `sh -c` (where the value may be quoted); undefined without it.
function engineOption(container, name) {
  const words = [...(container.command ?? []), ...(container.args ?? [])];
  if (words.includes(name)) return words[words.indexOf(name) + 1];
  const match = words.join(' ').match(new RegExp(`${name}\\s+(?:'([^']*)'|"([^"]*)"|(\\S+))`));
  return match ? (match[1] ?? match[2] ?? match[3]) : undefined;
}

// The engine URLs of a dplb configuration, each with its pool: "backends", or "prefill" and "decode" (P/D), at the
// top level or in each of "clusters". The index is the URL's place in its list.
function engineUrls(config) {
  const groups = config.clusters ?? [config];
  const list = (value) => (typeof value === 'string' ? value.split(',').map((u) => u.trim()).filter(Boolean) : value ?? []);
  return groups.flatMap((group) => ['backends', 'prefill', 'decode'].flatMap(
    (pool) => list(group[pool]).map((url, index) => ({ pool, url, index }))));
}

// Whether this dplb knows P/D disaggregation (--prefill): a P/D configuration is checked by --check-config only then.
const dplbHelp = execFileSync(paths.dplb, ['--help'], { encoding: 'utf8' });
const dplbHasPd = dplbHelp.includes('--prefill');
// Whether this dplb shares a ledger (--shared-state): the base's dplb arguments are checked by --check-config only then.
const dplbHasSharedState = dplbHelp.includes('--shared-state');

// The configuration the dplb pods read: the ConfigMap key mounted where --config points.
function dplbConfigText(objects) {
  const dplb = objects.find((o) => o.kind === 'Deployment' && o.metadata.name === 'dplb');
  const container = dplb.spec.template.spec.containers[0];
  const configPath = container.args[container.args.indexOf('--config') + 1];
  const mount = container.volumeMounts.find((m) => configPath.startsWith(`${m.mountPath}/`));
  const volume = dplb.spec.template.spec.volumes.find((v) => v.name === mount.name);
  const item = volume.configMap.items.find((i) => path.join(mount.mountPath, i.path) === configPath);
  const configMap = objects.find((o) => o.kind === 'ConfigMap' && o.metadata.name === volume.configMap.name);
  assert.ok(configMap, `ConfigMap ${volume.configMap.name} exists`);
  const text = configMap.data[item.key];
  assert.ok(text, `it has the key ${item.key}`);
  return text;
}

test('the overlays are external-lb, internal-dp and pd, and every YAML file belongs to one', () => {
  assert.deepEqual(overlays.sort(), ['external-lb', 'internal-dp', 'pd']);
  const used = new Set(overlays.flatMap((o) => build(path.join(root, o)).map((object) => object.file)));
  const all = readdirSync(root, { recursive: true }).filter((f) => f.endsWith('.yaml') && !f.endsWith('kustomization.yaml'));
  for (const file of all) assert.ok(used.has(path.join(root, file)), `${file} is in no overlay`);
});

for (const overlay of overlays) {
  const objects = build(path.join(root, overlay));

  test(`${overlay}: every object is valid against its Kubernetes schema`, () => {
    for (const object of objects) {
      const Model = models[object.apiVersion]?.[object.kind];
      assert.ok(Model, `${object.file}: no schema for ${object.apiVersion} ${object.kind}`);
      const { file, ...manifest } = object;
      assert.doesNotThrow(() => new Model(manifest).validate(), `${file}: ${object.kind} ${object.metadata?.name}`);
    }
  });

  test(`${overlay}: selectors, ports and probes line up`, () => {
    for (const workload of podsOf(objects)) {
      const labels = workload.spec.template.metadata.labels;
      assert.ok(matches(workload.spec.selector.matchLabels, labels), `${workload.metadata.name} selects its own pods`);
      const names = portNames(workload);
      for (const container of workload.spec.template.spec.containers) {
        for (const probe of ['readinessProbe', 'livenessProbe', 'startupProbe']) {
          const port = container[probe]?.httpGet?.port ?? container[probe]?.tcpSocket?.port;
          if (typeof port === 'string') assert.ok(names.includes(port), `${workload.metadata.name} ${probe} port ${port}`);
        }
      }
      const scrapePort = workload.spec.template.metadata.annotations?.['prometheus.io/port'];
      if (scrapePort) {
        const numbers = workload.spec.template.spec.containers.flatMap((c) => (c.ports ?? []).map((p) => p.containerPort));
        assert.ok(numbers.includes(Number(scrapePort)), `${workload.metadata.name}'s scrape port is a container port`);
      }
    }
    for (const service of objects.filter((o) => o.kind === 'Service')) {
      const selected = selectedBy(service, objects);
      assert.equal(selected.length, 1, `Service ${service.metadata.name} selects exactly one workload's pods`);
      for (const port of service.spec.ports) {
        if (typeof port.targetPort === 'string') assert.ok(portNames(selected[0]).includes(port.targetPort));
      }
    }
    const dplb = objects.find((o) => o.kind === 'Deployment' && o.metadata.name === 'dplb');
    const dplbLabels = dplb.spec.template.metadata.labels;
    const pdb = objects.find((o) => o.kind === 'PodDisruptionBudget');
    assert.ok(matches(pdb.spec.selector.matchLabels, dplbLabels), 'the PodDisruptionBudget covers the dplb pods');
    const monitor = objects.find((o) => o.kind === 'ServiceMonitor');
    const service = objects.find((o) => o.kind === 'Service' && o.metadata.name === 'dplb');
    assert.ok(matches(monitor.spec.selector.matchLabels, service.metadata.labels), 'the ServiceMonitor selects the dplb Service');
    assert.ok(service.spec.ports.some((p) => p.name === monitor.spec.endpoints[0].port), 'and scrapes one of its ports');
  });

  const pd = engineUrls(JSON.parse(dplbConfigText(objects))).some(({ pool }) => pool !== 'backends');
  test(`${overlay}: dplb accepts the configuration it mounts (--check-config)`,
       { skip: pd && !dplbHasPd ? 'this dplb has no --prefill yet' : false }, () => {
    const file = path.join(mkdtempSync(path.join(os.tmpdir(), 'dplb-k8s-')), 'dplb.json');
    writeFileSync(file, dplbConfigText(objects));
    const summary = execFileSync(paths.dplb, ['--check-config', '--config', file], { encoding: 'utf8' });
    assert.match(summary, /configuration OK/);
  });

  test(`${overlay}: dplb's configuration names the engines the overlay runs`, () => {
    const config = JSON.parse(dplbConfigText(objects));
    const urls = engineUrls(config);
    const pools = new Set(urls.map(({ pool }) => pool));
    assert.ok(pools.size > 0, 'dplb names engines');
    assert.ok(!pools.has('backends') || pools.size === 1, 'backends, or prefill and decode, never both');
    if (pools.size > 1 || !pools.has('backends')) {
      assert.deepEqual([...pools].sort(), ['decode', 'prefill'], 'P/D names both pools');
    }
    // Each URL is a Service (a stable address: dplb resolves names at start, not per request), and the ranks are
    // listed in order: the i-th URL of a StatefulSet's ranks is its pod i.
    const listed = new Map();  // engine workload -> DP ranks dplb lists on it
    for (const { pool, url, index } of urls) {
      const host = new URL(url.replace(/#.*/, '')).hostname;
      const service = objects.find((o) => o.kind === 'Service' && o.metadata.name === host);
      assert.ok(service, `${host}: a Service of the overlay`);
      assert.ok(service.spec.clusterIP !== 'None', `${host} is not headless: its address outlives a pod`);
      const podName = service.spec.selector['statefulset.kubernetes.io/pod-name'];
      if (podName) assert.ok(podName.endsWith(`-${index}`), `${pool} ${index} (${host}) is rank ${index}'s pod, not ${podName}`);
      const [engine] = selectedBy(service, objects);
      if (pool !== 'backends') {
        assert.equal(engine.spec.template.metadata.labels['app.kubernetes.io/component'], pool,
                     `dplb's ${pool} URL ${url} reaches ${engine.metadata.name}, a ${pool} server`);
      }
      listed.set(engine, (listed.get(engine) ?? 0) + Number(fragment(url).get('dp') ?? 1));
    }
    for (const engine of enginesOf(objects)) {
      const size = Number(engineOption(engine.spec.template.spec.containers[0], '--data-parallel-size') ?? 1);
      assert.equal(listed.get(engine) ?? 0, size,
                   `dplb lists as many DP ranks on ${engine.metadata.name} as its --data-parallel-size`);
    }
  });

  if (pd) {
    test(`${overlay}: every engine runs NixlConnector, its side channel on the pod's IP and on ports of its own`, () => {
      const config = JSON.parse(dplbConfigText(objects));
      for (const engine of enginesOf(objects)) {
        const name = engine.metadata.name;
        const container = engine.spec.template.spec.containers[0];
        const transfer = JSON.parse(engineOption(container, '--kv-transfer-config') ?? 'null');
        assert.deepEqual(transfer, { kv_connector: 'NixlConnector', kv_role: 'kv_both' },
                         `${name} runs --kv-transfer-config with NixlConnector as kv_both`);
        const env = new Map((container.env ?? []).map((e) => [e.name, e]));
        assert.equal(env.get('VLLM_NIXL_SIDE_CHANNEL_HOST')?.valueFrom?.fieldRef?.fieldPath, 'status.podIP',
                     `${name}: NIXL's side channel is announced on the pod's IP, where the decode pods reach it`);
        // DP rank j's side channel listens on the base port + j: container ports of their own, clear of the
        // KV-cache event and replay ports and of the API's.
        const base = Number(env.get('VLLM_NIXL_SIDE_CHANNEL_PORT')?.value ?? 5600);
        const size = Number(engineOption(container, '--data-parallel-size') ?? 1);
        const numbers = new Map((container.ports ?? []).map((p) => [p.containerPort, p.name]));
        for (let j = 0; j < size; j++) {
          assert.ok((numbers.get(base + j) ?? '').startsWith('nixl-'),
                    `${name}: DP rank ${j}'s side channel ${base + j} is a container port named nixl-*`);
        }
        const kv = JSON.parse(engineOption(container, '--kv-events-config'));
        for (const endpoint of [kv.endpoint, kv.replay_endpoint].filter(Boolean)) {
          const first = Number(endpoint.match(/:(\d+)$/)[1]);
          assert.ok(first + size - 1 < base || first > base + size - 1,
                    `${name}: the side channel ports ${base}..${base + size - 1} and ${endpoint}'s do not overlap`);
        }
      }
      assert.equal(config.backends, undefined, 'a P/D configuration has no "backends"');
    });
  }

  test(`${overlay}: every engine publishes its KV-cache events, and dplb's kv-events and kv-replay reach each rank's publisher`, () => {
    const config = JSON.parse(dplbConfigText(objects));
    const engines = enginesOf(objects);
    const published = new Map();  // engine workload -> {endpoint, replay_endpoint: base ports}
    for (const engine of engines) {
      const name = engine.metadata.name;
      const container = engine.spec.template.spec.containers[0];
      const text = engineOption(container, '--kv-events-config');
      assert.ok(text, `${name} runs with --kv-events-config`);
      const kv = JSON.parse(text);
      assert.equal(kv.enable_kv_cache_events, true, `${name}: enable_kv_cache_events`);
      assert.equal(kv.publisher, 'zmq', `${name}: the ZMQ publisher`);
      // The engine binds (every address, for the Services to reach it) on base + its DP rank.
      const bases = {};
      for (const field of ['endpoint', 'replay_endpoint']) {
        if (kv[field] === undefined) continue;
        const bound = kv[field].match(/^tcp:\/\/(?:\*|0\.0\.0\.0):(\d+)$/);
        assert.ok(bound, `${name}: ${field} ${kv[field]} is tcp://*:PORT`);
        bases[field] = Number(bound[1]);
      }
      assert.ok(bases.endpoint, `${name} publishes on a tcp endpoint`);
      const size = Number(engineOption(container, '--data-parallel-size') ?? 1);
      const ranges = Object.values(bases).map((base) => [base, base + size - 1]);
      if (ranges.length === 2) {
        assert.ok(Math.abs(bases.endpoint - bases.replay_endpoint) >= size,
                  `${name}: events ${ranges[0].join('..')} and replay ${ranges[1].join('..')} do not overlap ` +
                  `(bases ${size} apart at least)`);
      }
      for (const port of (container.ports ?? []).filter((p) => !(p.name ?? '').startsWith('kv-'))) {
        assert.ok(ranges.every(([first, last]) => port.containerPort < first || port.containerPort > last),
                  `${name}: its port ${port.name} (${port.containerPort}) is outside the publishers' ports`);
      }
      assert.equal(Number(engineOption(container, '--block-size') ?? 16), config.block_size ?? 16,
                   `dplb's block_size is ${name}'s --block-size (both 16 when unset)`);
      published.set(engine, bases);
    }

    for (const [i, { url }] of engineUrls(config).entries()) {
      const options = fragment(url);
      const dp = Number(options.get('dp') ?? 1);
      const host = new URL(url.replace(/#.*/, '')).hostname;
      const service = objects.find((o) => o.kind === 'Service' && o.metadata.name === host);
      const [engine] = selectedBy(service, objects);
      const container = engine.spec.template.spec.containers[0];
      // The DP ranks behind the backend, as the engine numbers them: pod k of a StatefulSet whose servers take the
      // rank from their ordinal serves rank k; a server without --data-parallel-rank serves 0..N-1.
      const podName = service.spec.selector['statefulset.kubernetes.io/pod-name'];
      let engineRanks = [...Array(dp).keys()];
      if (podName) {
        assert.equal(engineOption(container, '--data-parallel-rank'), '${HOSTNAME##*-}',
                     `${engine.metadata.name}: pod k serves rank k`);
        engineRanks = [Number(podName.slice(engine.metadata.name.length + 1))];
      } else {
        assert.equal(engineOption(container, '--data-parallel-rank'), undefined,
                     `${engine.metadata.name} serves all its ranks`);
      }
      assert.equal(engineRanks.length, dp, `backend ${i}: #dp=${dp} for ${engineRanks.length} rank(s)`);
      for (const [key, field] of [['kv-events', 'endpoint'], ['kv-replay', 'replay_endpoint']]) {
        const base = published.get(engine)[field];
        const target = options.get(key);
        if (base !== undefined) assert.ok(target, `backend ${i} (${url}) names ${key}: its engine has a ${field}`);
        if (!target) continue;
        const named = target.match(/^tcp:\/\/([^:/]+):(\d+)$/);
        assert.ok(named, `backend ${i}: ${key}=${target} is tcp://HOST:PORT`);
        assert.ok(base !== undefined, `backend ${i}: ${key} names ${engine.metadata.name}, which has no ${field}`);
        const kvService = objects.find((o) => o.kind === 'Service' && o.metadata.name === named[1]);
        assert.ok(kvService, `backend ${i}: ${key} host ${named[1]} is a Service of the overlay`);
        assert.deepEqual(kvService.spec.selector, service.spec.selector,
                         `backend ${i}: ${key} reaches the pods of the backend's own Service`);
        engineRanks.forEach((rank, j) => {
          // dplb connects its j-th rank of the backend to PORT + j; the Service must forward that port to the
          // port the engine's rank binds, base + rank.
          const port = kvService.spec.ports.find((p) => p.port === Number(named[2]) + j);
          assert.ok(port, `${named[1]} has a port ${Number(named[2]) + j} (${key} of the backend's rank ${j})`);
          const targetPort = typeof port.targetPort === 'string'
            ? container.ports.find((p) => p.name === port.targetPort).containerPort
            : port.targetPort ?? port.port;
          assert.equal(targetPort, base + rank, `backend ${i}, rank ${j}: ${key} port ${port.port} reaches ` +
                       `${engine.metadata.name}'s rank ${rank}, bound on ${base} + ${rank}`);
        });
      }
    }
  });

  test(`${overlay}: the dplb replicas share one ledger in the Redis the kit runs, the password from a Secret's file`, () => {
    const dplb = objects.find((o) => o.kind === 'Deployment' && o.metadata.name === 'dplb');
    const pod = dplb.spec.template.spec;
    const args = pod.containers[0].args;
    const arg = (name) => (args.includes(name) ? args[args.indexOf(name) + 1] : undefined);
    const url = arg('--shared-state');
    assert.ok(url, 'dplb runs with --shared-state');
    const match = url.match(/^redis:\/\/([^:/@]+):(\d+)(?:\/\d+)?$/);
    assert.ok(match, `--shared-state ${url} is redis://HOST:PORT[/DB], with no password in it`);
    const service = objects.find((o) => o.kind === 'Service' && o.metadata.name === match[1]);
    assert.ok(service, `${match[1]}: a Service of the overlay`);
    const [redis] = selectedBy(service, objects);
    assert.ok(redis && isLedger(redis), `${match[1]} reaches the shared-state workload`);
    const container = redis.spec.template.spec.containers[0];
    const port = service.spec.ports.find((p) => p.port === Number(match[2]));
    assert.ok(port, `${match[1]} has the port ${match[2]}`);
    const target = typeof port.targetPort === 'string'
      ? container.ports.find((p) => p.name === port.targetPort)?.containerPort
      : port.targetPort ?? port.port;
    assert.equal(target, 6379, 'the Service forwards to redis-server\'s port');
    const version = container.image.match(/^redis:(\d+)/);
    assert.ok(version && Number(version[1]) >= 7, `Redis 7 or later (Redis Functions): ${container.image}`);
    assert.equal(redis.spec.replicas, 1, 'one Redis: two would be two ledgers');
    assert.equal(redis.spec.strategy?.type, 'Recreate', 'never two Redis pods at once, even during an update');
    const script = [...(container.command ?? []), ...(container.args ?? [])].join(' ');
    assert.match(script, /--save ''/, 'Redis keeps nothing on disk (the ledger is rebuilt by the replicas)');
    assert.match(script, /requirepass/, 'Redis asks for the password');

    // The password file: a key of a Secret mounted into dplb, the same key Redis reads.
    const secretFile = (workloadPod, ctr, file) => {
      const mount = ctr.volumeMounts.find((m) => file.startsWith(`${m.mountPath}/`));
      assert.ok(mount, `${file} is on a mounted volume`);
      const volume = workloadPod.volumes.find((v) => v.name === mount.name);
      assert.ok(volume.secret, `${file} comes from a Secret`);
      const item = (volume.secret.items ?? []).find((i) => path.join(mount.mountPath, i.path) === file);
      assert.ok(item, `${file} is one of the Secret's keys`);
      return { secret: volume.secret.secretName, key: item.key };
    };
    const passwordFile = arg('--shared-state-password-file');
    assert.ok(passwordFile, 'dplb reads the password from a file (--shared-state-password-file)');
    const dplbSide = secretFile(pod, pod.containers[0], passwordFile);
    const redisFile = script.match(/requirepass[^|]*\$\(cat ([^)\s]+)\)/);
    assert.ok(redisFile, 'Redis reads its password from a file');
    assert.deepEqual(secretFile(redis.spec.template.spec, container, redisFile[1]), dplbSide,
                     'dplb and Redis read the same key of the same Secret');
    const secret = objects.find((o) => o.kind === 'Secret' && o.metadata.name === dplbSide.secret);
    assert.ok(secret && (secret.stringData ?? secret.data)?.[dplbSide.key] !== undefined,
              `Secret ${dplbSide.secret} has the key ${dplbSide.key}`);
    // dplb runs as a non-root user: the file is readable through the pod's fsGroup.
    assert.ok(pod.securityContext.fsGroup !== undefined, 'dplb\'s user may read the Secret\'s file (fsGroup)');

    const name = arg('--replica-name');
    const env = (pod.containers[0].env ?? []).find((e) => name === `$(${e.name})`);
    assert.equal(env?.valueFrom?.fieldRef?.fieldPath, 'metadata.name', 'each replica is named after its pod');

    const policy = objects.find((o) => o.kind === 'NetworkPolicy' && matches(o.spec.podSelector.matchLabels,
                                                                              redis.spec.template.metadata.labels));
    assert.ok(policy, 'a NetworkPolicy guards Redis');
    const from = policy.spec.ingress.flatMap((rule) => rule.from ?? []);
    assert.ok(from.length > 0 && from.every((peer) => peer.podSelector &&
                                                      matches(peer.podSelector.matchLabels, dplb.spec.template.metadata.labels)),
              'only the dplb pods may reach Redis');
  });

  test(`${overlay}: dplb accepts its shared ledger's options (--check-config)`,
       { skip: dplbHasSharedState ? false : 'this dplb has no --shared-state yet' }, () => {
    const dplb = objects.find((o) => o.kind === 'Deployment' && o.metadata.name === 'dplb');
    const args = [...dplb.spec.template.spec.containers[0].args];
    const dir = mkdtempSync(path.join(os.tmpdir(), 'dplb-k8s-'));
    const config = path.join(dir, 'dplb.json');
    writeFileSync(config, dplbConfigText(objects));
    const password = path.join(dir, 'password');
    writeFileSync(password, 'change-me', { mode: 0o600 });
    // Here: the overlay's configuration and a password file of this machine, and the name Kubernetes would put in.
    args[args.indexOf('--config') + 1] = config;
    args[args.indexOf('--shared-state-password-file') + 1] = password;
    args[args.indexOf('--replica-name') + 1] = 'dplb-0';
    const summary = execFileSync(paths.dplb, ['--check-config', ...args], { encoding: 'utf8' });
    assert.match(summary, /configuration OK/);
  });

  test(`${overlay}: the dplb pods run locked down, with readiness on /health and liveness on the port`, () => {
    const dplb = objects.find((o) => o.kind === 'Deployment' && o.metadata.name === 'dplb');
    const pod = dplb.spec.template.spec;
    const container = pod.containers[0];
    assert.equal(pod.securityContext.runAsNonRoot, true);
    assert.equal(container.securityContext.readOnlyRootFilesystem, true);
    assert.equal(container.securityContext.allowPrivilegeEscalation, false);
    assert.deepEqual(container.securityContext.capabilities.drop, ['ALL']);
    assert.equal(container.readinessProbe.httpGet.path, '/health');
    assert.ok(container.livenessProbe.tcpSocket, 'liveness does not depend on the engines');
    assert.ok(dplb.spec.replicas >= 2, 'more than one replica');
    assert.ok(container.resources.requests.cpu && container.resources.limits.memory);
  });
}
