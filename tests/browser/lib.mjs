// What every browser test needs: a real `relaunch server` on a loopback
// port with a temporary data directory, the real Python client, Debian's
// chromium through playwright-core, console errors collected, screenshots
// kept, and every process started here killed at the end.

import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '../..');

/** The binary, Python and chromium under test (scripts/browser-test.sh sets them). */
export const RELAUNCH = process.env.RELAUNCH_BIN || join(ROOT, 'target/debug/relaunch');
export const PYTHON = process.env.RELAUNCH_PYTHON || join(ROOT, '.venv/bin/python');
export const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
export const SCREENSHOTS = join(HERE, 'screenshots');

/** Waits for `check()` to return something truthy, polling, up to `ms`. */
export async function until(check, what, ms = 20000) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      last = await check();
      if (last) return last;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what} (last: ${last})`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * One test's world: `const w = await World.start(t)`; everything it
 * starts (server, scripts, browser) ends with `w.close()`, which the test
 * registers with `t.after`.
 */
export class World {
  static async start(t, { token } = {}) {
    const w = new World();
    t.after(() => w.close());
    w.dir = mkdtempSync(join(tmpdir(), 'relaunch-browser-'));
    w.token = token;
    const args = ['--port', '0', '--durability', 'process'];
    if (token) args.push('--token', token);
    if (REPLICAS) {
      // Two replicas on a database of their own and an S3 prefix of their
      // own: the page reads through the second, clients write through the first.
      w.database = `browser_${randomBytes(6).toString('hex')}`;
      psql(process.env.RELAUNCH_TEST_POSTGRES, `CREATE DATABASE ${w.database}`);
      const db = new URL(process.env.RELAUNCH_TEST_POSTGRES);
      db.pathname = `/${w.database}`;
      args.push('--database', db.toString(), '--blobs', `${process.env.RELAUNCH_TEST_S3}/${w.database}`);
      const first = await w.server([...args, '--data-dir', join(w.dir, 'data-a')]);
      w.url = await w.server([...args, '--data-dir', join(w.dir, 'data-b')]);
      w.clientUrl = first;
    } else {
      w.url = await w.server([...args, '--data-dir', join(w.dir, 'data')]);
      w.clientUrl = w.url;
    }
    w.browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
    w.context = await w.browser.newContext({ viewport: { width: 1400, height: 900 }, acceptDownloads: true });
    return w;
  }

  constructor() {
    this.procs = [];
    this.errors = [];
  }

  /** Starts `relaunch server ARGS`; its URL once it serves. */
  async server(args) {
    const server = this.spawn(RELAUNCH, ['server', ...args]);
    let err = '';
    return new Promise((ok, fail) => {
      const timer = setTimeout(() => fail(new Error(`the server did not start: ${err}`)), 15000);
      server.stderr.on('data', (d) => {
        err += d;
        const m = err.match(/relaunch server: (http:\/\/[\d.]+:\d+)/);
        if (m) { clearTimeout(timer); ok(m[1]); }
      });
      server.on('exit', (code) => fail(new Error(`the server exited (${code}): ${err}`)));
    });
  }

  /** Starts a process that `close()` kills. */
  spawn(cmd, args, opts = {}) {
    const p = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'], ...opts });
    p.output = '';
    p.stdout.on('data', (d) => { p.output += d; });
    p.stderr.on('data', (d) => { p.output += d; });
    this.procs.push(p);
    return p;
  }

  /** The environment the Python client needs to log to this server. */
  env(extra = {}) {
    return {
      ...process.env,
      RELAUNCH_SERVER: this.clientUrl,
      RELAUNCH_DIR: join(this.dir, 'client'),
      ...(this.token ? { RELAUNCH_SERVER_TOKEN: this.token } : {}),
      ...extra,
    };
  }

  /** Runs Python code with the real client to its end; its stdout, trimmed. */
  python(code) {
    const r = spawnSync(PYTHON, ['-c', code], { env: this.env(), encoding: 'utf8', timeout: 120000 });
    if (r.status !== 0) throw new Error(`python failed (${r.status}): ${r.stderr}`);
    return r.stdout.trim();
  }

  /** A page whose console errors and uncaught exceptions are recorded. */
  async page() {
    const page = await this.context.newPage();
    page.on('console', (m) => { if (m.type() === 'error') this.errors.push(`console: ${m.text()}`); });
    page.on('pageerror', (e) => this.errors.push(`page error: ${e.message}`));
    return page;
  }

  async screenshot(page, name) {
    mkdirSync(SCREENSHOTS, { recursive: true });
    await page.screenshot({ path: join(SCREENSHOTS, `${name}.png`), fullPage: true });
  }

  async close() {
    if (this.browser) await this.browser.close().catch(() => {});
    for (const p of this.procs) {
      if (p.exitCode === null && p.signalCode === null) {
        const gone = new Promise((r) => p.once('exit', r));
        p.kill('SIGTERM');
        const timer = setTimeout(() => p.kill('SIGKILL'), 5000);
        await gone;
        clearTimeout(timer);
      }
    }
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
    if (this.database) psql(process.env.RELAUNCH_TEST_POSTGRES, `DROP DATABASE IF EXISTS ${this.database} WITH (FORCE)`);
  }
}

/** RELAUNCH_TEST_SERVERS=replicas: every world's server is two replicas on
 * PostgreSQL + S3 (RELAUNCH_TEST_POSTGRES, RELAUNCH_TEST_S3: scripts/test.sh). */
const REPLICAS = process.env.RELAUNCH_TEST_SERVERS === 'replicas';

function psql(url, sql) {
  const r = spawnSync('psql', ['-X', '-q', '-v', 'ON_ERROR_STOP=1', url, '-c', sql], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`psql failed (${r.status}): ${r.stderr}`);
}

/** Reads a chart's data (uPlot's columns) by its metric name. */
export function chartData(page, key) {
  return page.evaluate((k) => {
    const c = window.__relaunch && window.__relaunch.charts.get(k);
    return c ? c.u.data.map((col) => Array.from(col)) : null;
  }, key);
}

/** Whether a chart's canvas has any pixel drawn in the line's colour family (not blank). */
export function chartInked(page, key) {
  return page.evaluate((k) => {
    const c = window.__relaunch.charts.get(k);
    const { ctx, bbox } = c.u;
    const img = ctx.getImageData(bbox.left, bbox.top, bbox.width, bbox.height).data;
    let inked = 0;
    for (let i = 0; i < img.length; i += 4) {
      const [r, g, b, a] = [img[i], img[i + 1], img[i + 2], img[i + 3]];
      if (a > 0 && b > r + 40 && b > g) inked++;
    }
    return inked;
  }, key);
}
