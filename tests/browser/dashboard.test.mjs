// The dashboard end to end: a real server, runs logged by the real Python
// client (and the real launcher), pages in Debian's chromium. Each test
// asserts what a person sees and keeps a screenshot of each page.

import assert from 'node:assert/strict';
import { writeFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { PYTHON, RELAUNCH, World, chartData, chartInked, until } from './lib.mjs';

/** Rows of the runs table as the names shown, top to bottom. */
const shownRuns = (page) => page.$$eval('table.runs tbody tr[data-run] td:nth-child(2)', (tds) => tds.map((td) => td.textContent));

test('the runs table lists, filters and sorts runs, and compares the selected ones', async (t) => {
  const w = await World.start(t);
  w.python(`
import relaunch
for name, project, lr, tags in [("alpha", "vision", 0.1, ["baseline"]), ("beta", "vision", 0.01, []), ("gamma", "nlp", 0.001, ["big"])]:
    run = relaunch.init(project, name=name, config={"optim": {"lr": lr, "name": "adam"}, "layers": 4}, tags=tags)
    for s in range(50):
        run.log({"loss": lr * 100 / (s + 1), "acc": s / 50}, step=s)
    run.finish(timeout=60)
`);
  const page = await w.page();
  await page.goto(`${w.url}/`);
  await until(async () => (await shownRuns(page)).length === 3, 'three runs listed');
  assert.deepEqual(await shownRuns(page), ['gamma', 'beta', 'alpha']);
  // Default columns: the param that differs, and the latest metrics.
  const heads = await page.$$eval('table.runs thead th', (ths) => ths.map((th) => th.textContent.replace(/[▲▼]/g, '').trim()));
  assert.ok(heads.includes('optim.lr'), heads.join(','));
  assert.ok(heads.includes('loss') && heads.includes('acc'), heads.join(','));
  assert.ok(!heads.includes('layers'), 'a param equal in every run is not a default column');
  const lossCol = heads.indexOf('loss') + 1;
  const alphaLoss = await page.textContent(`tr:has(a:text-is("alpha")) td:nth-child(${lossCol})`);
  assert.equal(alphaLoss, '0.2', 'latest loss of alpha: 0.1 * 100 / 50');
  await w.screenshot(page, 'runs-table');

  // Sort by the latest loss, ascending: gamma (0.002), beta (0.02), alpha (0.2).
  await page.click('table.runs thead th:text("loss")');
  await page.click('table.runs thead th:text("loss")');
  assert.deepEqual(await shownRuns(page), ['gamma', 'beta', 'alpha']);
  assert.match(page.url(), /sort=loss|sort=m%3Aloss/);

  // The text filter, in the page.
  await page.fill('input[name=q]', 'bet');
  await until(async () => (await shownRuns(page)).join() === 'beta', 'text filter');
  await page.fill('input[name=q]', '');
  // Server-side filters, kept in the URL: a link reproduces the view.
  await page.goto(`${w.url}/?project=vision&param=optim.lr%3D0.1`);
  await until(async () => (await shownRuns(page)).join() === 'alpha', 'project and param filter');
  await page.goto(`${w.url}/?status=finished&tag=big`);
  await until(async () => (await shownRuns(page)).join() === 'gamma', 'status and tag filter');

  // Select two runs and compare them.
  await page.goto(`${w.url}/`);
  await until(async () => (await shownRuns(page)).length === 3, 'runs again');
  await page.check('tr:has(a:text-is("alpha")) input[type=checkbox]');
  await page.check('tr:has(a:text-is("gamma")) input[type=checkbox]');
  assert.match(page.url(), /sel=/);
  await page.click('a.button:text("Compare 2")');
  await page.waitForURL(/\/compare\?runs=/);
  const loss = await until(async () => {
    const d = await chartData(page, 'loss');
    return d && d[0].length === 50 && d;
  }, 'the compare chart of loss');
  assert.equal(loss.length, 3, 'x and one line per run');
  assert.ok(await chartInked(page, 'loss') > 50, 'the lines are drawn');
  const diffRows = await page.$$eval('.diff-table tbody tr', (trs) => trs.map((tr) => tr.dataset.param));
  assert.deepEqual(diffRows, ['optim.lr'], 'only the differing param');
  await w.screenshot(page, 'compare');
  assert.deepEqual(w.errors, []);
});

test('more runs than a page holds: the server sorts, searches and filters them all', async (t) => {
  const w = await World.start(t);
  w.python(`
import relaunch
for i in range(12):
    run = relaunch.init("many", name=f"m{i:02d}", config={"layers": i % 4}, tags=["odd" if i % 2 else "even"])
    run.log({"loss": (i * 7) % 12 / 10}, step=0)
    run.finish(timeout=60)
`);
  const page = await w.page();
  // A page of 5 runs (10,000 at most without ?rows): 12 are more.
  await page.goto(`${w.url}/?project=many&rows=5&cols=p:layers,m:loss`);
  await until(async () => (await page.textContent('.count')).startsWith('5 of 12 runs (the first 5'), 'the first page');
  assert.deepEqual(await shownRuns(page), ['m11', 'm10', 'm09', 'm08', 'm07']);
  // Sorted by loss on the server, every run considered (the loss of m<i>
  // is (7 i mod 12) / 10).
  await page.click('table.runs thead th:text("loss")');
  await until(async () => (await shownRuns(page)).join() === 'm05,m10,m03,m08,m01', 'the highest losses of all 12 (1.1 to 0.7)');
  await page.click('table.runs thead th:text("loss")');
  await until(async () => (await shownRuns(page)).join() === 'm00,m07,m02,m09,m04', 'the lowest losses (0 to 0.4)');
  // The search goes to the server too: m03 is not among the 5 shown.
  await page.fill('input[name=q]', 'M03');
  await until(async () => (await shownRuns(page)).join() === 'm03', 'a run found beyond the page');
  await page.fill('input[name=q]', '');
  await until(async () => (await page.textContent('.count')).startsWith('5 of 12 runs'), 'the page again');
  // Metric and param filters: loss < 0.35 keeps m00, m07, m02, m09, and
  // layers (i mod 4) > 0 all of them but m00.
  await page.fill('input[name=metric]', 'loss<0.35');
  await page.fill('input[name=param]', 'layers>0');
  await page.click('button:text("Filter")');
  await until(async () => (await page.textContent('.count')).startsWith('3 of 3 runs'), 'the filtered runs');
  assert.deepEqual([...await shownRuns(page)].sort(), ['m02', 'm07', 'm09']);
  assert.match(page.url(), /metric=loss%3C0.35/);
  await page.fill('input[name=metric]', 'loss<');
  await page.click('button:text("Filter")');
  await until(async () => (await page.$('p.error')) && (await page.textContent('p.error')).includes('KEY OP NUMBER'), 'a bad filter says what to write');
  w.errors.length = 0;
});

test('a run page draws the logged series and shows a new point live', async (t) => {
  const w = await World.start(t);
  const py = w.spawn(PYTHON, ['-c', `
import relaunch, sys
run = relaunch.init("live", name="live-run", config={"lr": 0.1, "model": {"width": 256}})
for s in range(100):
    run.log({"loss": 1 / (s + 1), "lr": 0.1}, step=s)
run.flush(timeout=60)
print(run.id, flush=True)
sys.stdin.readline()
for s in range(100, 110):
    run.log({"loss": 1 / (s + 1)}, step=s)
run.flush(timeout=60)
print("more", flush=True)
sys.stdin.readline()
run.finish(timeout=60)
`], { env: w.env() });
  const id = await until(() => py.output.split('\n').length > 1 && py.output.split('\n')[0], 'the run id', 60000);
  const page = await w.page();
  await page.goto(`${w.url}/runs/${id}?metrics=loss`);
  const first = await until(async () => {
    const d = await chartData(page, 'loss');
    return d && d[0].length === 100 && d;
  }, 'the loss chart');
  assert.equal(first[0][99], 99);
  assert.equal(first[1][99], 1 / 100);
  assert.ok(await chartInked(page, 'loss') > 50, 'the line is drawn');
  assert.match(await page.textContent('.chart[data-key=loss] .chart-value'), /0\.01 @ step 99/);
  await w.screenshot(page, 'run-charts');

  py.stdin.write('go\n');
  await until(() => py.output.includes('more'), 'the next points logged', 60000);
  const live = await until(async () => {
    const d = await chartData(page, 'loss');
    return d && d[0].length === 110 && d;
  }, 'the new points on the chart, live');
  assert.equal(live[0][109], 109);
  assert.match(await page.textContent('.chart[data-key=loss] .chart-value'), /@ step 109/);

  // Smoothing, log scale and the x axis are in the URL.
  await page.goto(`${w.url}/runs/${id}?metrics=loss&smooth=0.9&log=1&x=wall`);
  const smoothed = await until(async () => {
    const d = await chartData(page, 'loss');
    return d && d[0].length === 110 && d;
  }, 'the smoothed chart');
  assert.equal(smoothed.length, 5, 'x, raw, smoothed, max, min');
  assert.ok(smoothed[0][0] > 1e9, 'x is wall time');
  assert.ok(smoothed[2][109] > smoothed[1][109], 'the smoothed line lags the falling raw one');
  await w.screenshot(page, 'run-charts-smoothed');

  // Zoom: drag over the chart, the range comes back at full detail.
  await page.goto(`${w.url}/runs/${id}?metrics=loss`);
  await until(async () => (await chartData(page, 'loss'))?.[0].length === 110, 'the chart again');
  const over = await page.$('.chart[data-key=loss] .u-over');
  const box = await over.boundingBox();
  await page.mouse.move(box.x + box.width * 0.2, box.y + box.height / 2);
  await page.mouse.down();
  await page.mouse.move(box.x + box.width * 0.4, box.y + box.height / 2, { steps: 5 });
  await page.mouse.up();
  await until(() => /zoom=/.test(page.url()), 'the zoom in the URL');
  const zoomed = await until(async () => {
    const d = await chartData(page, 'loss');
    return d && d[0].length < 110 && d[0].length > 5 && d;
  }, 'the zoomed range fetched');
  assert.ok(zoomed[0][0] >= 15 && zoomed[0][zoomed[0].length - 1] <= 50, `zoomed steps ${zoomed[0][0]}..${zoomed[0].at(-1)}`);

  // Params.
  await page.click('nav.tabs a[data-tab=params]');
  await page.waitForSelector('table.params td:text("256")');
  await w.screenshot(page, 'run-params');
  py.stdin.write('go\n');
  assert.deepEqual(w.errors, []);
});

test('a launched job: live console lines, the restart marked on the chart, the failure traceback', async (t) => {
  const w = await World.start(t);
  const script = join(w.dir, 'train.py');
  const go = join(w.dir, 'go');
  writeFileSync(script, `
import os, sys, time
import relaunch
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank = int(os.environ["RANK"])
run = relaunch.init(config={"lr": 0.1, "attempt_seen": attempt})
steps = range(0, 1000) if attempt == 0 else range(20, 40)
for s in steps:
    run.log({"loss": 1.0 / (s + 1) + attempt * 0.01}, step=s)
    print(f"rank {rank} attempt {attempt} step {s}", flush=True)
    if attempt == 0 and rank == 1 and s == 25:
        run.flush(timeout=30)
        raise RuntimeError("boom at step 25")
    time.sleep(0.02)
run.flush(timeout=30)
if rank == 0:
    print("waiting for the go file", flush=True)
    while not os.path.exists(${JSON.stringify(go)}):
        time.sleep(0.05)
    print("hello from the live tail", flush=True)
run.finish(timeout=30)
`);
  const job = w.spawn(RELAUNCH, ['run', '--server', w.clientUrl, '--project', 'launched', '--run-id', 'job1',
    '--nproc-per-node', '2', '--max-restarts', '1', '--monitor-interval', '0.1', '--system-metrics-interval', '1',
    '--tracking-dir', join(w.dir, 'client'), script], { env: w.env({ PYTHON_EXEC: PYTHON }) });
  const page = await w.page();
  await until(() => job.output.includes('waiting for the go file'), `the second attempt to wait (output: ${job.output.slice(-2000)})`, 90000);
  await page.goto(`${w.url}/runs/job1?tab=logs`);
  await page.waitForSelector('.log .line:text("waiting for the go file")', { timeout: 20000 });
  assert.ok(await page.$('.log .line:text("rank 1 attempt 0 step 25")'), 'the first attempt\'s lines');
  writeFileSync(go, '');
  await page.waitForSelector('.log .line:text("hello from the live tail")', { timeout: 20000 });
  // Search and the rank filter.
  await page.fill('input[name=q]', 'boom');
  // The search applies after a pause: wait until only matching lines show.
  await until(async () => {
    const shown = await page.$$eval('.log .line', (ls) => ls.map((l) => l.textContent.toLowerCase()));
    return shown.length >= 1 && shown.every((l) => l.includes('boom'));
  }, 'only the traceback lines shown');
  await page.fill('input[name=q]', '');
  await page.selectOption('select[name=rank]', '1');
  await until(async () => (await page.$$eval('.log .line .rank', (rs) => rs.every((r) => r.textContent === '[1]'))), 'rank 1 only');
  await w.screenshot(page, 'run-logs');

  await until(() => job.exitCode !== null, 'the job to end', 60000);
  assert.equal(job.exitCode, 0, job.output.slice(-3000));

  await page.goto(`${w.url}/runs/job1`);
  const marker = await page.waitForSelector('.chart[data-key=loss] .marker:text("restart")', { timeout: 20000 });
  assert.match(await marker.textContent(), /restart · attempt 0 · step 2\d/);
  const loss = await chartData(page, 'loss');
  assert.equal(loss[0].at(-1), 39, 'the second attempt ran to step 39');
  await w.screenshot(page, 'run-restart');

  await page.click('nav.tabs a[data-tab=events]');
  const failure = await page.waitForSelector('li.event[data-kind=worker_failed] details[open] pre.traceback');
  assert.match(await failure.textContent(), /RuntimeError: boom at step 25/);
  assert.ok(await page.$('li.event[data-kind=restart]'));
  assert.ok(await page.$('li.event[data-kind=finished]'));
  await w.screenshot(page, 'run-events');

  await page.click('nav.tabs a[data-tab=system]');
  await until(async () => (await page.$$('.chart')).length > 0, 'system metric charts');
  await w.screenshot(page, 'run-system');
  assert.deepEqual(w.errors, []);
});

test('goodput: a run with a restart shows a bar per attempt with the server\'s numbers', async (t) => {
  const w = await World.start(t);
  // Attempt 0 logs steps 0..14 and is killed; attempt 1 resumes at step 10
  // (5 steps re-run) and runs to step 29.
  const script = join(w.dir, 'goodput.py');
  writeFileSync(script, `
import os, signal, time
import relaunch
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
run = relaunch.init()
for s in (range(0, 15) if restart == 0 else range(10, 30)):
    time.sleep(0.05)
    run.log({"loss": 1.0 / (s + 1)}, step=s)
run.flush(timeout=30)
if restart == 0:
    os.kill(os.getpid(), signal.SIGKILL)
run.finish(timeout=30)
`);
  const job = w.spawn(RELAUNCH, ['run', '--server', w.clientUrl, '--project', 'goodput', '--run-id', 'gp1',
    '--nproc-per-node', '1', '--max-restarts', '1', '--monitor-interval', '0.1',
    '--tracking-dir', join(w.dir, 'client'), script], { env: w.env({ PYTHON_EXEC: PYTHON }) });
  await until(() => job.exitCode !== null, 'the job to end', 90000);
  assert.equal(job.exitCode, 0, job.output.slice(-3000));

  const page = await w.page();
  await page.goto(`${w.url}/runs/gp1`);
  await page.waitForSelector('details.goodput .goodput-row[data-attempt="1"] .seg', { timeout: 20000 });
  const g = await page.evaluate(async () => (await fetch('/api/v1/runs/gp1/goodput')).json());
  assert.equal(g.steps_re_run, 5);
  assert.ok(g.goodput > 0 && g.goodput < 1, `goodput ${g.goodput}`);

  // The numbers: goodput, steps re-run, the interruption's cost.
  const percent = `${(g.goodput * 100).toFixed(1)}%`;
  assert.equal(await page.textContent('details.goodput summary [data-field=goodput]'), percent);
  assert.equal(await page.textContent('.goodput-numbers [data-field=goodput]'), percent);
  assert.equal(await page.textContent('.goodput-numbers [data-field=steps_re_run]'), '5');
  assert.equal(await page.textContent('.goodput-numbers [data-field=interruptions]'), '1');
  const lost = await page.getAttribute('tr[data-interruption="0"] td[data-field=lost_s]', 'data-seconds');
  assert.equal(Number(lost), g.interruptions[0].lost_s);
  assert.equal(await page.textContent('tr[data-interruption="0"] td[data-field=steps_re_run]'), '5');
  const labels = await page.$$eval('.goodput-row .goodput-label', (ls) => ls.map((l) => l.textContent));
  assert.deepEqual(labels, ['attempt 0', 'attempt 1']);
  const legend = await page.$$eval('.goodput-legend [data-total]', (ks) => ks.map((k) => k.dataset.total));
  assert.deepEqual(legend, ['startup_s', 'productive_s', 'rerun_s', 'stop_s', 'restart_s']);

  // The bars: each segment is its share of the wall time, and the two
  // rows together span the whole time line.
  const rows = await page.$$eval('.goodput-row', (rs) => rs.map((r) => {
    const bar = r.querySelector('.goodput-bar');
    const total = bar.getBoundingClientRect().width;
    const gap = r.querySelector('.seg-gap');
    return {
      attempt: Number(r.dataset.attempt),
      start: gap ? gap.getBoundingClientRect().width / total : 0,
      segs: [...r.querySelectorAll('.seg')].map((s) => ({
        field: s.dataset.seg, seconds: Number(s.dataset.seconds), share: s.getBoundingClientRect().width / total,
      })),
    };
  }));
  assert.equal(rows.length, 2);
  for (const [i, row] of rows.entries()) {
    const a = g.attempts[i];
    assert.equal(row.attempt, a.attempt);
    const fields = ['startup_s', 'productive_s', 'rerun_s', 'stop_s', 'restart_s'].filter((f) => a[f] > 0);
    assert.deepEqual(row.segs.map((s) => s.field), fields);
    for (const s of row.segs) {
      assert.equal(s.seconds, a[s.field]);
      assert.ok(Math.abs(s.share - a[s.field] / g.wall_s) < 0.01, `${s.field}: ${s.share} of the bar, ${a[s.field] / g.wall_s} of the wall`);
    }
  }
  assert.ok(rows[0].segs.some((s) => s.field === 'rerun_s'), 'attempt 0 shows its re-run steps');
  const end = rows[1].start + rows[1].segs.reduce((sum, s) => sum + s.share, 0);
  assert.ok(Math.abs(end - 1) < 0.01, `the last attempt ends at ${end} of the time line`);
  assert.doesNotMatch(await page.textContent('details.goodput'), /null|undefined|NaN/);
  await w.screenshot(page, 'run-goodput');
  assert.deepEqual(w.errors, []);
});

test('a hang: its report among the run\'s events, every rank\'s step time charted', async (t) => {
  const w = await World.start(t);
  const script = join(w.dir, 'hang.py');
  writeFileSync(script, `
import os, time
import relaunch
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank = int(os.environ["RANK"])
run = relaunch.init()
for s in range(80):
    if attempt == 0 and rank == 1 and s == 30:
        run.flush(timeout=30)
        time.sleep(3600)  # stuck: no more beats
    run.log({"loss": 1.0 / (s + 1)}, step=s)
    time.sleep(0.1)
run.finish(timeout=30)
`);
  const job = w.spawn(RELAUNCH, ['run', '--server', w.clientUrl, '--project', 'hangs', '--run-id', 'hung1',
    '--nproc-per-node', '2', '--max-restarts', '1', '--hang-timeout', '2', '--system-metrics-interval', '1',
    '--tracking-dir', join(w.dir, 'client'), script], { env: w.env({ PYTHON_EXEC: PYTHON, RELAUNCH_PY_SPY: 'off' }) });
  await until(() => job.exitCode !== null, `the job to end (output: ${job.output.slice(-2000)})`, 120000);
  assert.equal(job.exitCode, 0, job.output.slice(-3000));
  const page = await w.page();
  await page.goto(`${w.url}/runs/hung1`);
  await page.click('nav.tabs a[data-tab=events]');
  const hang = await page.waitForSelector('li.event[data-kind=hang]', { timeout: 20000 });
  assert.match(await hang.textContent(), /stopped beating first/);
  assert.ok(await page.$('li.event[data-kind=hang] details[open]'), 'the report is open, like a failure');
  await w.screenshot(page, 'run-hang');
  await page.click('nav.tabs a[data-tab=system]');
  await page.waitForSelector('.chart[data-key="system/step_time_s/rank_0"]', { timeout: 20000 });
  assert.ok(await page.$('.chart[data-key="system/step_time_s/rank_1"]'));
  assert.deepEqual(w.errors, []);
});

test('files and checkpoints are listed with sizes and download', async (t) => {
  const w = await World.start(t);
  const src = join(w.dir, 'notes.txt');
  writeFileSync(src, 'the weights are fine\n'.repeat(1000));
  const id = w.python(`
import relaunch
run = relaunch.init("files", name="with-files")
run.save_file(${JSON.stringify(src)}, "notes.txt")
run.save_file(${JSON.stringify(src)}, "checkpoints/step_10/model.pt")
run.save_file(${JSON.stringify(src)}, "checkpoints/step_20/model.pt")
run.finish(timeout=60)
print(run.id)
`);
  const page = await w.page();
  await page.goto(`${w.url}/runs/${id}?tab=files`);
  await page.waitForSelector('tr[data-file="notes.txt"]');
  assert.match(await page.textContent('tr[data-file="notes.txt"] td.num'), /20\.5 KiB/);
  const steps = await page.$$eval('details.ckpt', (ds) => ds.map((d) => d.dataset.step));
  assert.deepEqual(steps, ['20', '10'], 'newest checkpoint first');
  await page.click('details.ckpt[data-step="20"] summary');
  await w.screenshot(page, 'run-files');
  const [download] = await Promise.all([
    page.waitForEvent('download'),
    page.click('tr[data-file="notes.txt"] a'),
  ]);
  const saved = await download.path();
  assert.equal(readFileSync(saved, 'utf8'), readFileSync(src, 'utf8'));
  assert.deepEqual(w.errors, []);
});

test('parallel coordinates: a line per run across params and a metric, brushing filters the table', async (t) => {
  const w = await World.start(t);
  w.python(`
import relaunch
for i in range(10):
    run = relaunch.init("pc", name=f"r{i}", config={"lr": [0.1, 0.01, 0.001][i % 3], "opt": ["sgd", "adam"][i % 2]})
    run.log({"loss": float(i)}, step=0)
    run.finish(timeout=60)
`);
  const page = await w.page();
  await page.goto(`${w.url}/?project=pc&cols=p:lr,p:opt,m:loss&pc=1`);
  await page.waitForSelector('canvas.parallel-canvas[data-lines="10"]');
  assert.deepEqual(await page.$$eval('.parallel-axis', (a) => a.map((x) => x.textContent)), ['lr', 'opt', 'loss']);
  assert.match(await page.getAttribute('.parallel-axis[data-axis="p:lr"]', 'title'), /log scale/);
  // Drag along the loss axis over its upper half: runs with loss 4.5 or more.
  const box = await page.$eval('canvas.parallel-canvas', (c) => {
    const r = c.getBoundingClientRect();
    return { left: r.left, top: r.top, width: r.width, scale: r.width / c.width, canvasWidth: c.width };
  });
  const axisX = box.left + (box.canvasWidth - 60) * box.scale;
  const yAt = (at) => box.top + 28 + (1 - at) * (260 - 28 - 24);
  await page.mouse.move(axisX, yAt(1.02));
  await page.mouse.down();
  await page.mouse.move(axisX, yAt(0.7), { steps: 3 });
  await page.mouse.move(axisX, yAt(0.5), { steps: 3 });
  await page.mouse.up();
  await until(async () => (await page.textContent('.count')).startsWith('5 of 10 runs'), 'the table filtered to the brushed runs');
  const names = await shownRuns(page);
  assert.deepEqual([...names].sort(), ['r5', 'r6', 'r7', 'r8', 'r9']);
  assert.equal(await page.getAttribute('canvas.parallel-canvas', 'data-lines'), '5');
  await w.screenshot(page, 'runs-parallel');
  // A click on the axis clears its range.
  await page.mouse.click(axisX, yAt(0.2));
  await until(async () => (await page.textContent('.count')).startsWith('10 of 10 runs'), 'every run again');
  assert.deepEqual(w.errors, []);
});

test('images and histograms: a panel per key with a step slider, runs side by side', async (t) => {
  const w = await World.start(t);
  const log = (name, colors) => w.python(`
import numpy, relaunch
run = relaunch.init("media", name=${JSON.stringify(name)})
for step, color in enumerate(${JSON.stringify(colors)}):
    image = numpy.zeros((8, 8, 3), dtype=numpy.uint8)
    image[:, :] = color
    run.log({"loss": 1.0 / (step + 1), "samples": relaunch.Image(image, caption=f"color {step}"),
             "weights": relaunch.Histogram(numpy.arange(10.0) * (step + 1))}, step=step * 10)
# What another client may send: 200,000 bins (relaunch's own caps them at 512).
run.event("histogram", "", {"key": "wide", "step": 0, "counts": [1.0] * 200_000,
                            "edges": [float(i) for i in range(200_001)], "nonfinite": 0})
run.finish(timeout=60)
print(run.id)
`);
  const a = log('rgb', [[255, 0, 0], [0, 255, 0], [0, 0, 255]]);
  const b = log('gray', [[40, 40, 40], [90, 90, 90], [200, 200, 200]]);
  const page = await w.page();
  /** The pixel at the middle of the image shown (of `run` when given). */
  const shown = (run) => page.evaluate(async (run) => {
    const scope = run ? document.querySelector(`.media-run[data-run="${run}"]`) : document;
    const img = scope.querySelector('section[data-key="samples"] img.media-image');
    if (!img || !img.complete || !img.naturalWidth) return null;
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    const g = c.getContext('2d');
    g.drawImage(img, 0, 0);
    return { step: Number(img.dataset.step), rgb: [...g.getImageData(4, 4, 1, 1).data.slice(0, 3)] };
  }, run);
  const slide = (to) => page.$eval('section[data-key="samples"] input[type=range]', (el, to) => {
    el.value = String(to);
    el.dispatchEvent(new Event('input'));
  }, to);

  await page.goto(`${w.url}/runs/${a}?tab=media`);
  await page.waitForSelector('section[data-key="samples"]');
  // The newest step first; the slider goes back to each earlier one.
  await until(async () => JSON.stringify(await shown()) === JSON.stringify({ step: 20, rgb: [0, 0, 255] }), 'the last image');
  await slide(0);
  await until(async () => JSON.stringify(await shown()) === JSON.stringify({ step: 0, rgb: [255, 0, 0] }), 'the first image');
  assert.match(await page.textContent('section[data-key="samples"] figcaption'), /color 0 · step 0/);
  await slide(1);
  await until(async () => JSON.stringify(await shown()) === JSON.stringify({ step: 10, rgb: [0, 255, 0] }), 'the middle image');
  // The histogram's bars, at the step chosen for it.
  const bars = await page.$$eval('section[data-key="weights"] svg.histogram rect', (rs) => rs.length);
  assert.equal(bars, 64);
  // Issue 35: 200,000 bins threw a RangeError (Math.max over as many
  // arguments) and hid every panel; they are drawn as neighbours summed.
  const wide = await page.$eval('section[data-key="wide"] svg.histogram', (svg) => ({
    bins: Number(svg.dataset.bins), bars: svg.querySelectorAll('rect').length,
  }));
  assert.equal(wide.bins, 200000);
  assert.ok(wide.bars > 0 && wide.bars <= 640, `${wide.bars} bars`);
  // Media are not listed among the events.
  await w.screenshot(page, 'run-media');
  await page.click('nav.tabs a[data-tab="events"]');
  await page.waitForSelector('ol.events li');
  assert.deepEqual(await page.$$eval('ol.events li[data-kind="media"]', (l) => l.length), 0);

  // Compared: each run's image at the chosen step, side by side.
  await page.goto(`${w.url}/compare?runs=${a},${b}`);
  await page.waitForSelector('section[data-key="samples"] .media-run');
  await until(async () => JSON.stringify(await shown(b)) === JSON.stringify({ step: 20, rgb: [200, 200, 200] }), 'run b at the last step');
  await slide(0);
  await until(async () => JSON.stringify(await shown(a)) === JSON.stringify({ step: 0, rgb: [255, 0, 0] }), 'run a at step 0');
  await until(async () => JSON.stringify(await shown(b)) === JSON.stringify({ step: 0, rgb: [40, 40, 40] }), 'run b at step 0');
  await w.screenshot(page, 'compare-media');
  assert.deepEqual(w.errors, []);
});

test('videos: an animated GIF plays as an image, a WebM in a video player', async (t) => {
  const w = await World.start(t);
  const page = await w.page();
  // A WebM made by the browser itself (a canvas recorded), so that the test
  // needs no encoder: the Python client logs the file as it is.
  await page.goto(`${w.url}/`);
  const webm = await page.evaluate(async () => {
    const canvas = document.createElement('canvas');
    canvas.width = 64; canvas.height = 48;
    const g = canvas.getContext('2d');
    const recorder = new MediaRecorder(canvas.captureStream(25), { mimeType: 'video/webm' });
    const chunks = [];
    recorder.ondataavailable = (e) => chunks.push(e.data);
    const stopped = new Promise((r) => { recorder.onstop = r; });
    recorder.start();
    for (let i = 0; i < 20; i++) {
      g.fillStyle = i % 2 ? '#00f' : '#f00';
      g.fillRect(0, 0, 64, 48);
      await new Promise((r) => setTimeout(r, 40));
    }
    recorder.stop();
    await stopped;
    const bytes = new Uint8Array(await new Blob(chunks).arrayBuffer());
    let text = '';
    for (const b of bytes) text += String.fromCharCode(b);
    return btoa(text);
  });
  const clip = join(w.dir, 'clip.webm');
  writeFileSync(clip, Buffer.from(webm, 'base64'));
  const id = w.python(`
import numpy, relaunch
run = relaunch.init("videos", name="rollouts")
frames = numpy.zeros((2, 16, 16, 3), dtype=numpy.uint8)
frames[0, :, :, 0] = 255
frames[1, :, :, 2] = 255
run.log({"loss": 1.0, "rollout": relaunch.Video(frames, fps=2, caption="red then blue"),
         "clip": relaunch.Video(${JSON.stringify(clip)})}, step=3)
run.finish(timeout=60)
print(run.id)
`);
  await page.goto(`${w.url}/runs/${id}?tab=media`);
  await page.waitForSelector('section[data-key="rollout"] img.media-video');
  // The GIF animates: both its frames are seen on the page, in turn (a
  // canvas would only ever draw an animation's first frame: screenshots).
  const gif = page.locator('section[data-key="rollout"] img.media-video');
  await until(() => gif.evaluate((img) => img.complete && img.naturalWidth === 16), 'the GIF loaded');
  const seen = new Set();
  await until(async () => {
    const shot = (await gif.screenshot()).toString('base64');
    const rgb = await page.evaluate(async (b64) => {
      const img = new Image();
      img.src = `data:image/png;base64,${b64}`;
      await img.decode();
      const c = document.createElement('canvas');
      c.width = img.naturalWidth; c.height = img.naturalHeight;
      const g = c.getContext('2d');
      g.drawImage(img, 0, 0);
      return [...g.getImageData(c.width >> 1, c.height >> 1, 1, 1).data.slice(0, 3)];
    }, shot);
    seen.add(rgb.join(','));
    return seen.has('255,0,0') && seen.has('0,0,255');
  }, `both frames of the GIF (seen ${[...seen].join(' ')})`);
  assert.match(await page.textContent('section[data-key="rollout"] figcaption'), /red then blue · step 3 · 2 frames at 2 fps/);
  // The WebM: a video element, served as video/webm, playing by itself.
  const played = await until(() => page.evaluate(() => {
    const v = document.querySelector('section[data-key="clip"] video.media-video');
    return v && v.readyState >= 2 && v.videoWidth === 64 && !v.paused && v.currentTime > 0
      && { width: v.videoWidth, height: v.videoHeight, src: v.getAttribute('src') };
  }), 'the WebM playing');
  assert.equal(played.height, 48);
  const type = await page.evaluate(async (src) => (await fetch(src)).headers.get('content-type'), played.src);
  assert.equal(type, 'video/webm');
  await w.screenshot(page, 'run-videos');
  assert.deepEqual(w.errors, []);
});

test('with a token the page asks for it once, remembers it, and downloads with it', async (t) => {
  const w = await World.start(t, { token: 's3cret-token' });
  const src = join(w.dir, 'a.txt');
  writeFileSync(src, 'guarded bytes');
  const id = w.python(`
import relaunch
run = relaunch.init("guarded", name="needs-token")
run.log({"loss": 1.0}, step=0)
run.save_file(${JSON.stringify(src)}, "a.txt")
run.finish(timeout=60)
print(run.id)
`);
  const page = await w.page();
  await page.goto(`${w.url}/`);
  await page.waitForSelector('#token-dialog[open]');
  await page.fill('#token-input', 's3cret-token');
  await page.click('#token-dialog button[type=submit]');
  await until(async () => (await shownRuns(page)).join() === 'needs-token', 'the run listed with the token');
  await w.screenshot(page, 'token');
  // Remembered: a new page asks nothing.
  await page.goto(`${w.url}/runs/${id}?tab=files`);
  await page.waitForSelector('tr[data-file="a.txt"]');
  assert.equal(await page.$('#token-dialog[open]'), null);
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('tr[data-file="a.txt"] a')]);
  assert.equal(readFileSync(await download.path(), 'utf8'), 'guarded bytes');
  // A plain link the browser streams to disk (the token rides in the
  // read-only cookie), not bytes fetched into the page's memory.
  assert.match(download.url(), /^http:\/\/[^/]+\/api\/v1\/runs\/[^/]+\/files\/a\.txt$/);
  // Issue 35: the token was the cookie, set by script (so readable by any
  // page of the host: cookies are not kept apart by port). Now the cookie
  // is the server's, HttpOnly, and holds no token; no script sees it.
  const cookies = await page.context().cookies();
  assert.ok(cookies.length > 0 && cookies.every((c) => c.httpOnly && c.sameSite === 'Strict'
    && c.path === '/api/v1' && c.name.startsWith('relaunch_session_')), JSON.stringify(cookies));
  assert.ok(cookies.every((c) => !c.value.includes('s3cret')), JSON.stringify(cookies));
  assert.equal(await page.evaluate(() => document.cookie), '');
  // The only errors: the first requests' 401s, before the token was given.
  assert.ok(w.errors.every((e) => /401/.test(e)), w.errors.join('\n'));
});
