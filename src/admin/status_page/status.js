'use strict';
// dplb's status page: reads GET /ranks (and GET /tenants) from this admin listener every 1.5 s and shows
// every rank (and every tenant).
// Whatever the server sends (rank URLs come from the configuration) goes into the page as text through
// textContent, never as markup. Rates come from the difference between polls over the last 10 s.
const POLL_MS = 1500;
const TIMEOUT_MS = 5000;
const WINDOW_MS = 10000;
const COLUMNS = [
  ['rank', 'Rank', ''], ['engine', 'Engine', ''], ['state', 'State', ''], ['weight', 'Weight', 'num'],
  ['inflight', 'In flight', 'num'], ['requests', 'Requests', 'num'], ['rate', 'Req/s', 'num'],
  ['errors', 'Errors', 'num'], ['error-rate', 'Error rate', 'num'], ['load', 'Engine load', ''],
];
const TENANT_COLUMNS = [
  ['Tenant', ''], ['Weight', 'num'], ['In flight', 'num'], ['Queued', 'num'], ['Req/s', 'num'],
  ['Requests', 'num'], ['Refused (429)', 'num'], ['Limits', ''],
];
const samples = [];  // {t, counts: Map rank -> {requests, responses, errors}}, oldest first
const rows = new Map();  // rank -> {tr, cells: {column name -> td}}
let lastUptime = -1;
let lastSuccess = 0;

const byId = (id) => document.getElementById(id);
const integer = (n) => (n ?? 0).toLocaleString('en-US');
const percent = (x) => (x === null ? '–' : `${(100 * x).toFixed(x > 0 && x < 0.001 ? 2 : 1)} %`);

function make(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function duration(seconds) {
  if (seconds === undefined || seconds === null) return '–';
  const s = Math.floor(seconds);
  const [d, h, m] = [Math.floor(s / 86400), Math.floor((s % 86400) / 3600), Math.floor((s % 3600) / 60)];
  if (d > 0) return `${d}d ${h}h`;
  if (h > 0) return `${h}h ${m}m`;
  if (m > 0) return `${m}m ${s % 60}s`;
  return `${s}s`;
}

// The words and the colour of a rank's state: its flags as GET /ranks names them, "up" when none.
function stateOf(rank) {
  const flags = rank.flags || [];
  if (flags.length === 0) return { words: 'up', level: 'ok' };
  let level = 'warn';
  if (flags.includes('removed')) level = 'off';
  else if (flags.includes('unhealthy') || flags.includes('ejected')) level = 'bad';
  return { words: flags.join(', '), level };
}

// Keeps this poll's counters and forgets samples the 10 s window no longer needs.
function remember(now, doc) {
  if (typeof doc.uptime_seconds === 'number') {
    if (doc.uptime_seconds < lastUptime) samples.length = 0;  // dplb restarted: counters began again
    lastUptime = doc.uptime_seconds;
  }
  const counts = new Map();
  for (const r of doc.ranks) {
    counts.set(r.rank, { requests: r.requests_total, responses: r.responses_total, errors: r.errors_total });
  }
  samples.push({ t: now, counts });
  while (samples.length > 2 && now - samples[1].t >= WINDOW_MS) samples.shift();
}

// Requests per second and the share of responses that were errors, since the oldest sample kept.
function ratesOf(rank) {
  const newest = samples[samples.length - 1];
  const oldest = samples[0];
  const seconds = (newest.t - oldest.t) / 1000;
  const now = newest.counts.get(rank);
  const then = oldest.counts.get(rank);
  if (!then || !now || seconds <= 0 || now.requests < then.requests) return { perSecond: null, errors: null, responses: 0, errorCount: 0 };
  const responses = now.responses - then.responses;
  const errorCount = now.errors - then.errors;
  return { perSecond: (now.requests - then.requests) / seconds, errors: responses > 0 ? errorCount / responses : null,
    responses, errorCount };
}

function rowFor(rank) {
  let row = rows.get(rank);
  if (row) return row;
  const tr = make('tr');
  tr.dataset.rank = String(rank);
  const cells = {};
  for (const [name, label, kind] of COLUMNS) {
    const td = make('td', [name, kind].filter(Boolean).join(' '));
    td.dataset.label = label;
    cells[name] = td;
    tr.append(td);
  }
  byId('ranks').tBodies[0].append(tr);  // rank numbers only grow: appended in order
  row = { tr, cells };
  rows.set(rank, row);
  return row;
}

function setLines(td, lines) {
  const box = make('div');
  lines.forEach(([text, className]) => box.append(make('div', className, text)));
  td.replaceChildren(box);
}

function renderRank(r, clusters, maxInflight) {
  const { tr, cells } = rowFor(r.rank);
  const state = stateOf(r);
  tr.className = state.level;
  cells.rank.textContent = String(r.rank);
  const details = [];
  if (r.dp > 1) details.push(`DP rank ${r.index_in_url} of ${r.dp}`);
  if (clusters > 1) details.push(`group ${r.cluster}`);
  if (r.role && r.role !== 'both') details.push(r.role);
  if (r.backend_state && r.backend_state !== 'active') details.push(`backend ${r.backend_state}`);
  setLines(cells.engine, [[r.url, 'url'], ...(details.length ? [[details.join(' · '), 'sub']] : [])]);
  cells.state.replaceChildren(make('span', `badge ${state.level}`, state.words));
  cells.weight.textContent = integer(r.weight);
  const meter = make('span', 'meter');
  const fill = make('i');
  fill.style.width = `${maxInflight > 0 ? Math.round((100 * r.inflight) / maxInflight) : 0}%`;
  meter.append(fill);
  cells.inflight.replaceChildren(document.createTextNode(integer(r.inflight)), meter);
  // With a shared ledger (--shared-state): every replica's requests on the rank, as the ledger last said.
  if (r.inflight_all_replicas !== undefined) {
    const all = r.inflight_all_replicas === null ? '–' : integer(r.inflight_all_replicas);
    cells.inflight.append(make('div', 'sub', `all replicas: ${all}`));
  }
  cells.requests.textContent = integer(r.requests_total);
  const rates = ratesOf(r.rank);
  cells.rate.textContent = rates.perSecond === null ? '–' : rates.perSecond.toFixed(1);
  cells.errors.textContent = integer(r.errors_total);
  cells['error-rate'].textContent = percent(rates.errors);
  cells['error-rate'].classList.toggle('hot', rates.errors > 0);
  const e = r.engine;
  const lines = [];
  if (!e) {
    lines.push(['no stats read', 'sub']);
  } else {
    lines.push([`${e.running} running · ${e.waiting} waiting · KV ${(100 * e.kv_cache_usage).toFixed(0)} %`]);
    if (e.age_seconds > 10) lines.push([`read ${duration(e.age_seconds)} ago`, 'sub']);
  }
  // What the rank's KV-cache events gave dplb's index: blocks held, and how late the last batch arrived.
  const kv = r.kv_events;
  if (kv) {
    const lag = kv.lag_seconds === null ? 'no event yet' : `lag ${(1000 * kv.lag_seconds).toFixed(0)} ms`;
    const errors = kv.errors > 0 ? ` · ${integer(kv.errors)} skipped` : '';
    lines.push([`index ${integer(kv.blocks)} blocks · ${lag}${errors}`, 'sub']);
  }
  setLines(cells.load, lines);
  return rates;
}

function render(doc, now) {
  remember(now, doc);
  byId('version').textContent = doc.version ?? '–';
  byId('uptime').textContent = duration(doc.uptime_seconds);
  byId('updated').textContent = new Date().toLocaleTimeString();
  // A disaggregated cluster's two pools have a policy each: shown as "name prefill: policy".
  const poolOf = (r) => (r.role && r.role !== 'both' ? `${r.cluster} ${r.role}` : r.cluster);
  const policies = new Map(doc.ranks.map((r) => [poolOf(r), r.policy]));
  byId('policy').textContent = policies.size > 1 ? [...policies].map(([c, p]) => `${c}: ${p}`).join(', ') : doc.policy;
  const live = doc.ranks.filter((r) => !(r.flags || []).includes('removed'));
  const usable = live.filter((r) => r.usable).length;
  const maxInflight = Math.max(0, ...doc.ranks.map((r) => r.inflight));
  let [inflight, requests, perSecond, responses, errorCount] = [0, 0, 0, 0, 0];
  for (const r of doc.ranks) {
    const rates = renderRank(r, policies.size, maxInflight);
    inflight += r.inflight;
    requests += r.requests_total;
    perSecond += rates.perSecond ?? 0;
    responses += rates.responses;
    errorCount += rates.errorCount;
  }
  byId('t-usable').textContent = `${usable} / ${live.length}`;
  byId('tile-usable').className = `tile${usable === 0 ? ' bad' : usable < live.length ? ' warn' : ''}`;
  byId('t-inflight').textContent = integer(inflight);
  byId('t-skew').textContent = integer(doc.inflight_skew);
  byId('t-rate').textContent = samples.length > 1 ? perSecond.toFixed(1) : '–';
  const errorRate = responses > 0 ? errorCount / responses : null;
  byId('t-errors').textContent = percent(errorRate);
  byId('tile-errors').className = `tile${errorRate > 0 ? ' bad' : ''}`;
  byId('t-requests').textContent = integer(requests);
  renderSharedState(doc);
  document.title = `dplb: ${usable}/${live.length} ranks usable`;
}

// The ledger shared with the other replicas: every replica's requests in flight, and how many replicas; hidden
// without --shared-state, amber while the ledger does not answer (each replica then counts alone).
function renderSharedState(doc) {
  const shared = doc.shared_state;
  byId('tile-shared').hidden = !shared;
  if (!shared) return;
  const total = doc.ranks.reduce((sum, r) => sum + (r.inflight_all_replicas ?? 0), 0);
  const replicas = shared.replicas === null ? '' : ` · ${shared.replicas} replica${shared.replicas === 1 ? '' : 's'}`;
  byId('t-shared').textContent = shared.up ? `${integer(total)}${replicas}` : 'ledger down';
  byId('tile-shared').className = `tile${shared.up ? '' : ' warn'}`;
}

// The tenants' table, rebuilt whole at each poll (a handful of rows); hidden while only the default tenant exists.
function renderTenants(doc) {
  const tenants = doc.tenants || [];
  const shown = tenants.length > 1;
  byId('tenants').hidden = !shown;
  byId('tenants-title').hidden = !shown;
  if (!shown) return;
  const body = byId('tenants').tBodies[0];
  body.replaceChildren(...tenants.map((t) => {
    const l = t.limits || {};
    const limits = [
      l.requests_per_second !== null && l.requests_per_second !== undefined ? `${l.requests_per_second} req/s (burst ${l.burst})` : null,
      l.tokens_per_minute ? `${integer(l.tokens_per_minute)} tokens/min` : null,
      l.max_queued !== null && l.max_queued !== undefined ? `max ${l.max_queued} queued` : null,
      l.max_queue_wait_ms ? `wait ≤ ${l.max_queue_wait_ms} ms` : null,
    ].filter((x) => x !== null);
    const tr = make('tr');
    tr.append(make('td', '', t.name), make('td', 'num', integer(t.weight)), make('td', 'num', integer(t.in_flight)),
      make('td', 'num', integer(t.queued)), make('td', 'num', (t.requests_per_second ?? 0).toFixed(1)),
      make('td', 'num', integer(t.requests_total)), make('td', 'num', integer((t.requests_by_status || {})['429'])),
      make('td', '', limits.length ? limits.join(', ') : 'none'));
    return tr;
  }));
}

function showProblem(message) {
  const banner = byId('banner');
  banner.hidden = message === null;
  if (message !== null) {
    const since = lastSuccess ? `; the figures below are from ${new Date(lastSuccess).toLocaleTimeString()}` : '';
    banner.textContent = `${message}${since}`;
  }
  document.body.classList.toggle('stale', message !== null && lastSuccess > 0);
}

// GET /ranks on this page's origin, which carries no credentials: a page opened with credentials in its
// address (user:TOKEN@host:port) keeps them in its base URL, and fetch() refuses a URL with credentials
// (Chromium: "Request cannot be constructed from a URL that includes credentials"), a relative one too.
// The browser authenticates the request with the Basic credentials it cached when it loaded the page.
const RANKS_URL = new URL('/ranks', location.origin);
const TENANTS_URL = new URL('/tenants', location.origin);

async function pollTenants() {
  const response = await fetch(TENANTS_URL, { cache: 'no-store', credentials: 'same-origin',
    headers: { Accept: 'application/json' }, signal: AbortSignal.timeout(TIMEOUT_MS) });
  if (response.ok) renderTenants(await response.json());
}

async function poll() {
  try {
    const response = await fetch(RANKS_URL, { cache: 'no-store', credentials: 'same-origin',
      headers: { Accept: 'application/json' }, signal: AbortSignal.timeout(TIMEOUT_MS) });
    if (response.status === 401) throw new Error('dplb refused the credentials (reload the page to sign in again)');
    if (!response.ok) throw new Error(`GET /ranks answered ${response.status}`);
    render(await response.json(), performance.now());
    await pollTenants();
    lastSuccess = Date.now();
    showProblem(null);
  } catch (error) {
    showProblem(`Cannot read dplb's state: ${error.name === 'TimeoutError' ? 'no answer within 5 s' : error.message}. Retrying`);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

byId('ranks').tHead.rows[0].append(...COLUMNS.map(([, label, kind]) => make('th', kind, label)));
byId('tenants').tHead.rows[0].append(...TENANT_COLUMNS.map(([label, kind]) => make('th', kind, label)));
poll();
