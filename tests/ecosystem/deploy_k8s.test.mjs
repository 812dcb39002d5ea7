// deploy/k8s holds: every manifest is valid against the Kubernetes API schemas (npm kubernetes-models, and
// @kubernetes-models/prometheus-operator for the ServiceMonitor), and each overlay is consistent as a whole:
// selectors select the pods they mean, named ports and probes exist, the ConfigMap the dplb pods mount exists with
// its key, that key is a configuration the real dplb accepts (--check-config), its backends are the engines the
// overlay runs (names, count, #dp=N against --data-parallel-size), and dplb's pods are locked down.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, statSync, writeFileSync, existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { Deployment, StatefulSet } from 'kubernetes-models/apps/v1';
import { ConfigMap, Service } from 'kubernetes-models/v1';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
import { paths } from './support.mjs';

const root = path.join(paths.sourceDir, 'deploy/k8s');
const models = {
  'apps/v1': { Deployment, StatefulSet },
  v1: { ConfigMap, Service },
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

test('the overlays are external-lb and internal-dp, and every YAML file belongs to one', () => {
  assert.deepEqual(overlays.sort(), ['external-lb', 'internal-dp']);
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
      // A Service for one pod of a StatefulSet selects it by the label its controller sets, pod-name.
      const podName = service.spec.selector['statefulset.kubernetes.io/pod-name'];
      const selected = podName
        ? podsOf(objects).filter((w) => w.kind === 'StatefulSet' && podName.startsWith(`${w.metadata.name}-`) &&
                                        Number(podName.slice(w.metadata.name.length + 1)) < w.spec.replicas)
        : podsOf(objects).filter((w) => matches(service.spec.selector, w.spec.template.metadata.labels));
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

  test(`${overlay}: dplb mounts a configuration it accepts, naming the engines the overlay runs`, () => {
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

    const file = path.join(mkdtempSync(path.join(os.tmpdir(), 'dplb-k8s-')), 'dplb.json');
    writeFileSync(file, text);
    const summary = execFileSync(paths.dplb, ['--check-config', '--config', file], { encoding: 'utf8' });
    assert.match(summary, /configuration OK/);

    const config = JSON.parse(text);
    const ranks = config.backends.reduce((sum, url) => sum + Number(url.match(/#dp=(\d+)/)?.[1] ?? 1), 0);
    const engines = podsOf(objects).filter((w) => w.metadata.name !== 'dplb');
    const dataParallelSize = engines.map((w) => {
      const command = [...(w.spec.template.spec.containers[0].command ?? []), ...(w.spec.template.spec.containers[0].args ?? [])].join(' ');
      return Number(command.match(/--data-parallel-size (\d+)/)[1]);
    });
    assert.deepEqual(dataParallelSize, [ranks], 'the engines run as many DP ranks as dplb lists');
    // Each backend is a Service (a stable address: dplb resolves names at start, not per request), and the
    // ranks are listed in order: the i-th backend of a StatefulSet's ranks is its pod i.
    config.backends.forEach((url, i) => {
      const host = new URL(url.replace(/#.*/, '')).hostname;
      const service = objects.find((o) => o.kind === 'Service' && o.metadata.name === host);
      assert.ok(service, `${host}: a Service of the overlay`);
      assert.ok(service.spec.clusterIP !== 'None', `${host} is not headless: its address outlives a pod`);
      const podName = service.spec.selector['statefulset.kubernetes.io/pod-name'];
      if (podName) assert.ok(podName.endsWith(`-${i}`), `backend ${i} (${host}) is rank ${i}'s pod, not ${podName}`);
    });
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
