// The dashboard benchmark: time to first chart paint for 20 runs of
// 1,000,000 points each (the compare view, one chart, and one run's page),
// and the runs table at 10,000 runs, in headless chromium against a real
// `relaunch server`; then filter changes and a sort the server does (every
// project: more runs than the page holds). Targets: first paint under
// 1 s, a filter change under 300 ms.
//
//   node bench/dashboard/run.mjs [--relaunch target/release/relaunch] [--points 1000000]
//        [--runs 20] [--table-runs 10000] [--repeat 5]
//
// Needs `npm ci` in tests/browser (playwright-core) and chromium
// (/usr/bin/chromium, or CHROMIUM). Times are from navigation start to
// the page's own performance marks, set two animation frames after the
// data was drawn (so the paint happened). Results: bench/out/dashboard.json.

import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const require = createRequire(join(ROOT, 'tests/browser/package.json'));
const { chromium } = require('playwright-core');

const { values: opt } = parseArgs({
  options: {
    relaunch: { type: 'string', default: process.env.RELAUNCH_BIN || join(ROOT, 'target/release/relaunch') },
    points: { type: 'string', default: '1000000' },
    runs: { type: 'string', default: '20' },
    'table-runs': { type: 'string', default: '10000' },
    repeat: { type: 'string', default: '5' },
  },
});
const POINTS = Number(opt.points);
const RUNS = Number(opt.runs);
const TABLE_RUNS = Number(opt['table-runs']);
const REPEAT = Number(opt.repeat);

// RLB3, the batch format (crates/relaunch-api/src/batch.rs): it ends with
// the CRC-32C (Castagnoli) of every byte before it.
const CRC32C_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    table[i] = c >>> 0;
  }
  return table;
})();

export function crc32c(bytes) {
  let c = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) c = CRC32C_TABLE[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function str16(s) {
  const b = Buffer.from(s, 'utf8');
  const out = Buffer.alloc(2 + b.length);
  out.writeUInt16LE(b.length, 0);
  b.copy(out, 2);
  return out;
}

/** One batch of metrics records: `rows` of [step, wall, [[key, value], ...]]. */
function metricsBatch(writer, token, firstSeq, rows) {
  const keyBufs = new Map();
  const parts = [Buffer.from('RLB3'), str16(writer), str16(token)];
  const n = Buffer.alloc(4);
  n.writeUInt32LE(rows.length, 0);
  parts.push(n);
  rows.forEach(([step, wall, values], i) => {
    const head = Buffer.alloc(8 + 1 + 8 + 8 + 4 + 2);
    head.writeBigUInt64LE(BigInt(firstSeq + i), 0);
    head.writeUInt8(1, 8);
    head.writeBigInt64LE(BigInt(step), 9);
    head.writeDoubleLE(wall, 17);
    head.writeUInt32LE(0, 25);
    head.writeUInt16LE(values.length, 29);
    parts.push(head);
    for (const [k, v] of values) {
      if (!keyBufs.has(k)) keyBufs.set(k, str16(k));
      const val = Buffer.alloc(8);
      val.writeDoubleLE(v, 0);
      parts.push(keyBufs.get(k), val);
    }
  });
  const body = Buffer.concat(parts);
  const sum = Buffer.alloc(4);
  sum.writeUInt32LE(crc32c(body), 0);
  return Buffer.concat([body, sum]);
}

async function post(url, body, type = 'application/json') {
  const res = await fetch(url, { method: 'POST', body, headers: { 'Content-Type': type } });
  if (!res.ok) throw new Error(`${url}: ${res.status} ${await res.text()}`);
  return res.json();
}

async function pool(n, items, f) {
  let next = 0;
  await Promise.all(Array.from({ length: n }, async () => {
    while (next < items.length) await f(items[next++]);
  }));
}

async function startServer(dir) {
  const p = spawn(opt.relaunch, ['server', '--data-dir', dir, '--port', '0', '--durability', 'process'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  const url = await new Promise((ok, fail) => {
    p.stderr.on('data', (d) => { err += d; const m = err.match(/http:\/\/[\d.]+:\d+/); if (m) ok(m[0]); });
    p.on('exit', (c) => fail(new Error(`server exited ${c}: ${err}`)));
  });
  return { p, url };
}

function stats(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return { median: s[Math.floor(s.length / 2)], min: s[0], max: s[s.length - 1], runs: s.length };
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'relaunch-bench-dashboard-'));
  const { p: server, url } = await startServer(join(dir, 'data'));
  const api = `${url}/api/v1`;
  const results = { points_per_run: POINTS, runs: RUNS, table_runs: TABLE_RUNS, repeat: REPEAT };
  try {
    let t0 = performance.now();
    const big = Array.from({ length: RUNS }, (_, i) => `big-${String(i).padStart(2, '0')}`);
    await pool(4, big, async (id) => {
      await post(`${api}/runs`, JSON.stringify({ project: 'bench-big', id, name: id, attempt_token: 't', config: { seed: id } }));
      const PER = 50000;
      for (let first = 0; first < POINTS; first += PER) {
        const rows = [];
        for (let s = first; s < Math.min(POINTS, first + PER); s++) {
          rows.push([s, 1.7e9 + s * 0.01, [['loss', Math.exp(-s / POINTS * 3) + 0.05 * Math.sin(s / 50) + Math.random() * 0.02]]]);
        }
        await post(`${api}/runs/${id}/batches`, metricsBatch('w', 't', first + 1, rows), 'application/x-relaunch-batch');
      }
    });
    results.setup_big_s = (performance.now() - t0) / 1000;
    console.error(`logged ${RUNS} runs x ${POINTS} points in ${results.setup_big_s.toFixed(1)} s`);

    t0 = performance.now();
    const table = Array.from({ length: TABLE_RUNS }, (_, i) => `t-${String(i).padStart(5, '0')}`);
    await pool(32, table, async (id) => {
      const i = Number(id.slice(2));
      await post(`${api}/runs`, JSON.stringify({
        project: 'bench-table', id, name: `sweep-${i}`, attempt_token: 't', tags: [i % 2 ? 'odd' : 'even'],
        config: { lr: 10 ** -(1 + (i % 4)), batch: 32 << (i % 3), seed: i, model: { layers: 2 + (i % 6), width: 128 } },
      }));
      const rows = Array.from({ length: 10 }, (_, s) => [s, 1.7e9 + s, [['loss', 1 / (s + 1 + i % 7)], ['acc', s / 10], ['lr', 0.1]]]);
      await post(`${api}/runs/${id}/batches`, metricsBatch('w', 't', 1, rows), 'application/x-relaunch-batch');
    });
    results.setup_table_s = (performance.now() - t0) / 1000;
    console.error(`created ${TABLE_RUNS} runs in ${results.setup_table_s.toFixed(1)} s`);

    const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
    results.chromium = browser.version();
    // Milliseconds from `action` to the runs table drawn after the load it causes.
    const timeLoad = async (page, action) => {
      const before = await page.evaluate(() => performance.getEntriesByName('relaunch:runs-loaded').length);
      const start = await page.evaluate(() => performance.now());
      await action();
      await page.waitForFunction((n) => performance.getEntriesByName('relaunch:runs-loaded').length > n, before, { timeout: 60000 });
      return page.evaluate((t) => performance.getEntriesByName('relaunch:runs-loaded').at(-1).startTime - t, start);
    };
    const measure = async (path, mark, check) => {
      const times = [];
      for (let i = 0; i < REPEAT; i++) {
        const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
        const page = await context.newPage();
        const errors = [];
        page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
        page.on('pageerror', (e) => errors.push(e.message));
        await page.goto(`${url}${path}`);
        await page.waitForFunction((m) => performance.getEntriesByName(`relaunch:${m}`).length > 0, mark, { timeout: 60000 });
        const t = await page.evaluate((m) => performance.getEntriesByName(`relaunch:${m}`)[0].startTime, mark);
        if (check) await check(page);
        if (errors.length) throw new Error(`console errors on ${path}: ${errors.join('; ')}`);
        times.push(t);
        await context.close();
      }
      return stats(times);
    };
    results.compare_first_chart_ms = await measure(`/compare?runs=${big.join(',')}&metrics=loss`, 'first-chart', async (page) => {
      const shape = await page.evaluate(() => { const c = window.__relaunch.charts.get('loss'); return [c.u.data.length, c.u.data[0].length]; });
      if (shape[0] !== RUNS + 1) throw new Error(`compare chart has ${shape[0] - 1} lines, not ${RUNS}`);
      results.compare_points_drawn = shape[1];
    });
    results.run_first_chart_ms = await measure(`/runs/${big[0]}?metrics=loss`, 'first-chart');
    results.runs_table_ms = await measure('/?project=bench-table&cols=p:lr,p:model.layers,m:loss,m:acc', 'runs-table', async (page) => {
      const count = await page.textContent('.bar .count');
      if (!count.startsWith(`${TABLE_RUNS} of ${TABLE_RUNS} runs`)) throw new Error(`runs table says ${count}`);
      // Sorting 10,000 rows by a metric column, click to drawn.
      const t = await page.evaluate(async () => {
        const th = [...document.querySelectorAll('table.runs thead th')].find((x) => x.textContent.startsWith('loss'));
        const start = performance.now();
        th.click();
        await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
        return performance.now() - start;
      });
      (results.runs_table_sort_ms ||= []).push(t);
      // Filter changes the server answers, action to the table drawn again:
      // a status (every run stays), a metric filter (4 runs in 7 stay).
      (results.runs_table_status_filter_ms ||= []).push(await timeLoad(page,
        () => page.selectOption('select[name=status]', 'running')));
      (results.runs_table_metric_filter_ms ||= []).push(await timeLoad(page, async () => {
        await page.fill('input[name=metric]', 'loss<0.08');
        await page.press('input[name=metric]', 'Enter');
      }));
      const left = await page.textContent('.bar .count');
      const expect = Array.from({ length: TABLE_RUNS }, (_, i) => i % 7 >= 3).filter(Boolean).length;
      if (!left.startsWith(`${expect} of ${expect} runs`)) throw new Error(`after loss<0.08 the table says ${left}`);
    });
    for (const k of ['runs_table_sort_ms', 'runs_table_status_filter_ms', 'runs_table_metric_filter_ms']) results[k] = stats(results[k]);
    // Every project: more runs than a page holds, so the server sorts.
    results.runs_table_all_ms = await measure('/?cols=p:lr,m:loss', 'runs-table', async (page) => {
      const count = await page.textContent('.bar .count');
      if (!count.includes(`of ${TABLE_RUNS + RUNS} runs (the first 10000`)) throw new Error(`runs table says ${count}`);
      (results.runs_table_all_server_sort_ms ||= []).push(await timeLoad(page, () => page.click('table.runs thead th:has-text("loss")')));
      const url = new URL(page.url());
      if (url.searchParams.get('sort') !== '-m:loss') throw new Error(`the table is sorted by ${url.searchParams.get('sort')}`);
    });
    results.runs_table_all_server_sort_ms = stats(results.runs_table_all_server_sort_ms);
    await browser.close();
  } finally {
    server.kill('SIGTERM');
    rmSync(dir, { recursive: true, force: true });
  }
  mkdirSync(join(ROOT, 'bench/out'), { recursive: true });
  writeFileSync(join(ROOT, 'bench/out/dashboard.json'), `${JSON.stringify(results, null, 2)}\n`);
  console.log(JSON.stringify(results, null, 2));
}

main().catch((err) => { console.error(err); process.exit(1); });
