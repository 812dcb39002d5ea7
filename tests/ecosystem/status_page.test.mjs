// The admin listener's status page in headless Chromium: the browser signs in with Basic credentials (the
// admin token as the password), given when asked or in the URL (http://admin:TOKEN@host:port/), the page shows every rank's URL, state and load, follows a drain, streams in
// flight, new requests and a failing rank without a reload, fits a phone's screen, and says so when dplb
// goes away. Screenshots (desktop and phone) go to DPLB_TEST_OUTPUT_DIR.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { paths, startDplb, startMockEngine } from './support.mjs';

const token = 'ecosystem-status-page-token';
const credentials = { username: 'admin', password: token };
const wait = { timeout: 15000 };

let engine;
let dplb;
let adminUrl;
let mockAdminUrl;
let browser;
let desktop;  // the desktop page, kept open from the first test to the last
const browserProblems = [];  // console errors (a CSP violation is one) and uncaught exceptions
const streams = new AbortController();

// A completion through dplb; resolves with the status and the rank that answered.
async function complete(maxTokens, stream = false, signal = undefined) {
  const response = await fetch(`http://127.0.0.1:${dplb.port}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'mock-model', prompt: 'status page', max_tokens: maxTokens, stream }),
    signal,
  });
  await response.arrayBuffer().catch(() => {});
  return { status: response.status, rank: response.headers.get('x-dplb-rank') };
}

async function admin(method, target) {
  const response = await fetch(`${adminUrl}${target}`, { method, headers: { Authorization: `Bearer ${token}` } });
  assert.equal(response.status, 200, `${method} ${target}`);
  return response.json();
}

// The text of a rank's cell on the page (cells are named by their column: state, inflight, ...).
function cell(page, rank, column) {
  return page.locator(`#ranks tbody tr[data-rank="${rank}"] td.${column}`);
}

async function openPage(options) {
  const context = await browser.newContext({ httpCredentials: credentials, ...options });
  const page = await context.newPage();
  page.on('console', (message) => {
    if (message.type() === 'error') browserProblems.push(message.text());
  });
  page.on('pageerror', (error) => browserProblems.push(error.message));
  const response = await page.goto(`${adminUrl}/`);
  assert.equal(response.status(), 200);
  await page.waitForFunction(() => document.querySelectorAll('#ranks tbody tr').length === 3, null, wait);
  return page;
}

before(async () => {
  process.env.DPLB_ADMIN_TOKEN = token;  // dplb inherits the environment
  // Each token of a stream takes 40 ms: a 300-token stream stays in flight ~12 s.
  engine = await startMockEngine('status-page-mock', 3, ['--itl-ms', '40']);
  mockAdminUrl = `http://127.0.0.1:${engine.child.output.match(/mock-engine admin listening on [\d.]+:(\d+)/)[1]}`;
  dplb = await startDplb('status-page-dplb', engine.ports,
    ['--admin-listen', '127.0.0.1:0', '--policy', 'least-inflight', '--stats-interval', '500']);
  const adminPort = Number((await dplb.child.waitFor(/admin API listening on 127\.0\.0\.1:(\d+)/))[1]);
  adminUrl = `http://127.0.0.1:${adminPort}`;
  browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
});

after(async () => {
  streams.abort();
  await browser?.close();
  await dplb?.child.stop();
  await engine?.child.stop();
});

test('without the token the page is refused with a Basic challenge', async () => {
  for (const httpCredentials of [undefined, { username: 'admin', password: `${token}x` }]) {
    const context = await browser.newContext({ httpCredentials });
    // The answer itself (Playwright's HTTP client, no browser prompt involved).
    const response = await context.request.get(`${adminUrl}/`);
    assert.equal(response.status(), 401);
    assert.match(response.headers()['www-authenticate'], /^Basic realm="dplb admin", charset="UTF-8"/);
    // The browser: challenged, it has no (right) credentials to give, and shows no rank (Chromium ends the
    // navigation with the 401 or with ERR_INVALID_AUTH_CREDENTIALS).
    const page = await context.newPage();
    const outcome = await page.goto(`${adminUrl}/`).then((r) => String(r.status()), (error) => error.message);
    assert.match(outcome, /^401$|ERR_INVALID_AUTH_CREDENTIALS/);
    assert.equal(await page.locator('#ranks').count(), 0);
    await context.close();
  }
});

test('the page shows every rank with its URL, state and in-flight count', async () => {
  desktop = await openPage({ viewport: { width: 1280, height: 400 } });  // the screenshot grows to the content
  for (const [rank, port] of engine.ports.entries()) {
    assert.equal(await cell(desktop, rank, 'engine').locator('.url').textContent(), `http://127.0.0.1:${port}`);
    assert.equal(await cell(desktop, rank, 'state').textContent(), 'up');
    assert.equal(await cell(desktop, rank, 'inflight').textContent(), '0');
  }
  await desktop.waitForFunction(() => document.getElementById('version').textContent !== '–', null, wait);
  assert.match(await desktop.locator('#version').textContent(), /^\d+\.\d+\.\d+/);
  assert.equal(await desktop.locator('#policy').textContent(), 'least-inflight');
  assert.equal(await desktop.locator('#t-usable').textContent(), '3 / 3');
  // The engines' own numbers, read by --stats-interval.
  await desktop.waitForFunction(() => /running/.test(document.querySelector('#ranks tbody tr td.load').textContent), null, wait);
});

test('the page follows drains, streams in flight, new requests and errors without a reload', async () => {
  const page = desktop;
  await page.evaluate(() => { window.notReloaded = true; });
  // Six streams in flight: least-inflight puts two on each rank.
  for (let i = 0; i < 6; ++i) complete(300, true, streams.signal).catch(() => {});
  await page.waitForFunction(() => document.getElementById('t-inflight').textContent === '6', null, wait);
  for (const rank of [0, 1, 2]) assert.equal(await cell(page, rank, 'inflight').textContent(), '2');

  await admin('POST', '/ranks/1/drain');
  await page.waitForFunction(() => {
    const row = document.querySelector('#ranks tbody tr[data-rank="1"]');
    return row.querySelector('td.state').textContent === 'draining' && row.classList.contains('warn');
  }, null, wait);
  assert.equal(await cell(page, 1, 'inflight').textContent(), '2');  // its streams go on
  assert.equal(await page.locator('#t-usable').textContent(), '2 / 3');

  // Rank 2 answers 500 from now on; twelve quick requests go to ranks 0 and 2 only (1 is drained).
  const fault = await fetch(`${mockAdminUrl}/fault?rank=2`, { method: 'POST', body: '{"status": 500}' });
  assert.equal(fault.status, 200);
  const answers = [];
  for (let i = 0; i < 12; ++i) answers.push(await complete(1));
  const failed = answers.filter((a) => a.status === 500);
  assert.ok(failed.length > 0 && failed.every((a) => a.rank === '2'), JSON.stringify(answers));
  assert.ok(answers.every((a) => a.rank !== '1'), JSON.stringify(answers));

  await page.waitForFunction(() => document.getElementById('t-requests').textContent === '18', null, wait);
  const ranks = (await admin('GET', '/ranks')).ranks;
  assert.equal(ranks[2].errors_total, failed.length);
  await page.waitForFunction((n) => document.querySelector('#ranks tbody tr[data-rank="2"] td.errors').textContent === String(n),
    failed.length, wait);
  assert.equal(await cell(page, 1, 'requests').textContent(), '2');
  assert.equal(await cell(page, 0, 'errors').textContent(), '0');
  assert.equal(await cell(page, 0, 'error-rate').textContent(), '0.0 %');
  // Every answer of rank 2 since the page opened was a 500: its error rate over the window is 100 %.
  assert.equal(await cell(page, 2, 'error-rate').textContent(), '100.0 %');
  assert.match(await page.locator('#t-errors').textContent(), /^[1-9]\d*\.\d %$/);
  // Five 500s in a row eject rank 2 (--ejection-threshold 5): shown in red, with the word.
  if (failed.length >= 5) {
    await page.waitForFunction(() => {
      const row = document.querySelector('#ranks tbody tr[data-rank="2"]');
      return row.querySelector('td.state').textContent.includes('ejected') && row.classList.contains('bad');
    }, null, wait);
  }
  assert.equal(await page.evaluate(() => window.notReloaded), true);
  await page.screenshot({ path: path.join(paths.outputDir, 'status-page-desktop.png'), fullPage: true });
});

test('on a phone every rank fits the screen, without horizontal scrolling', async () => {
  const phone = await openPage({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
  // Two polls at least, so that the rates are shown too.
  await phone.waitForFunction(() => document.getElementById('t-rate').textContent !== '–', null, wait);
  const layout = await phone.evaluate(() => ({
    scrollWidth: document.documentElement.scrollWidth,
    clientWidth: document.documentElement.clientWidth,
    widest: Math.max(...[...document.querySelectorAll('#ranks tbody tr, #ranks td, .tile')].map((e) => e.getBoundingClientRect().right)),
    headerShown: getComputedStyle(document.querySelector('#ranks thead')).display !== 'none',
  }));
  assert.equal(layout.clientWidth, 390);
  assert.ok(layout.scrollWidth <= layout.clientWidth, JSON.stringify(layout));
  assert.ok(layout.widest <= layout.clientWidth, JSON.stringify(layout));
  assert.equal(layout.headerShown, false);  // cards, each value with its label
  for (const [rank, port] of engine.ports.entries()) {
    const url = cell(phone, rank, 'engine').locator('.url');
    assert.equal(await url.textContent(), `http://127.0.0.1:${port}`);
    assert.ok(await url.isVisible());
  }
  assert.equal(await cell(phone, 1, 'state').textContent(), 'draining');
  await phone.screenshot({ path: path.join(paths.outputDir, 'status-page-phone.png'), fullPage: true });
  await phone.context().close();
});

// The user name and token in the address itself, as a link or a bookmark carries them: Chromium loads the
// page with them but refuses fetch() on any URL that includes credentials, and a relative URL resolves
// against the page's base URL, which keeps them.
test('opened at http://admin:TOKEN@host:port/ the page signs in and shows live data', async () => {
  const context = await browser.newContext();  // no httpCredentials: only those of the URL
  const page = await context.newPage();
  page.on('pageerror', (error) => browserProblems.push(error.message));
  const { port } = new URL(adminUrl);
  const response = await page.goto(`http://admin:${token}@127.0.0.1:${port}/`);
  assert.equal(response.status(), 200);
  // The first read either fills the table or raises the banner (before the fix: "Request cannot be
  // constructed from a URL that includes credentials").
  await page.waitForFunction(() => document.querySelectorAll('#ranks tbody tr').length === 3 ||
    !document.getElementById('banner').hidden, null, wait);
  assert.ok(await page.locator('#banner').isHidden(), await page.locator('#banner').textContent());
  for (const [rank, port] of engine.ports.entries()) {
    assert.equal(await cell(page, rank, 'engine').locator('.url').textContent(), `http://127.0.0.1:${port}`);
  }
  // Live: a new request shows without a reload (its answer does not matter: rank 2 still fails).
  const total = async () => Number((await page.locator('#t-requests').textContent()).replaceAll(',', ''));
  const sent = await total();
  await complete(1);
  await page.waitForFunction((n) => Number(document.getElementById('t-requests').textContent.replaceAll(',', '')) > n,
    sent, wait);
  assert.ok(await page.locator('#banner').isHidden());
  await context.close();
});

test('the page says so when dplb stops answering, and showed no error until then', async () => {
  assert.deepEqual(browserProblems, []);
  streams.abort();
  assert.equal((await dplb.child.stop()).code, 0);
  await desktop.locator('#banner').waitFor({ state: 'visible', ...wait });
  assert.match(await desktop.locator('#banner').textContent(), /^Cannot read dplb's state: .*Retrying; the figures below are from /);
});
