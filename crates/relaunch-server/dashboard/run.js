// One run: its goodput (a bar per attempt, above the tabs), its charts
// (live while it runs, restarts marked), system metrics, console logs,
// events, files and checkpoints, and params. The tab and every chart
// setting live in the query string.

import { api, fileUrl, qs } from './api.js';
import { Chart, columns, fetchSeries, markerPositions, smooth } from './chart.js';
import { goodputView } from './goodput.js';
import { logsView } from './logs.js';
import { mediaView } from './media.js';
import {
  crumbs, flatten, fmtAgo, fmtBytes, fmtTime, fmtValue, h, isLive, listParam, query, setQuery,
  showError, statusBadge,
} from './util.js';

const LIVE_MS = 2000;
const IDLE_MS = 15000;
const TABS = ['charts', 'system', 'media', 'logs', 'events', 'files', 'params'];
// Data that rides on events, not what happened to the run: media and
// histograms (listed in the media tab), and the text values of ml-logger's
// metric rows (read back by its layer).
const DATA_KINDS = new Set(['media', 'histogram', 'ml-logger.row-texts']);
const MAX_DEFAULT_CHARTS = 24;

export function runPage(root, id) {
  const controller = new AbortController();
  const ctx = { id, run: null, events: [], keys: [], signal: controller.signal };
  let tab = query().get('tab') || 'charts';
  if (!TABS.includes(tab)) tab = 'charts';
  let view = null;
  let timer = null;
  let alive = true;

  const head = h('div', { class: 'run-head' });
  const tabs = h('nav', { class: 'tabs' });
  const body = h('div', { class: 'tab-body' });
  const message = h('div');
  const goodput = h('div');
  root.append(head, message, goodput, tabs, body);
  let gp = null;
  crumbs(h('a', { href: '/' }, 'runs'), h('span', {}, id));

  function renderHead() {
    const r = ctx.run;
    head.replaceChildren(...[
      h('h1', {}, r.name || r.id, ' ', statusBadge(r.status)),
      h('dl', { class: 'meta' },
        h('dt', {}, 'id'), h('dd', {}, h('code', {}, r.id)),
        h('dt', {}, 'project'), h('dd', {}, h('a', { href: `/${qs({ project: r.project })}` }, r.project)),
        h('dt', {}, 'attempts'), h('dd', {}, r.attempts),
        h('dt', {}, 'created'), h('dd', { title: fmtTime(r.created_at) }, fmtAgo(r.created_at)),
        h('dt', {}, 'updated'), h('dd', { title: fmtTime(r.updated_at) }, fmtAgo(r.updated_at)),
        r.tags.length ? [h('dt', {}, 'tags'), h('dd', {}, r.tags.map((t) => h('span', { class: 'tag' }, t)))] : null),
      r.notes ? h('p', { class: 'notes' }, r.notes) : null,
    ].filter(Boolean));
  }

  function renderTabs() {
    tabs.replaceChildren(...TABS.map((t) => h('a', {
      href: `${location.pathname}${qs({ tab: t === 'charts' ? '' : t })}`,
      class: t === tab ? 'active' : '',
      'data-tab': t,
      onclick: (e) => { e.preventDefault(); switchTab(t); },
    }, t)));
  }

  function switchTab(t) {
    if (view && view.dispose) view.dispose();
    tab = t;
    setQuery({ tab: t === 'charts' ? '' : t });
    renderTabs();
    body.replaceChildren();
    const make = {
      charts: () => chartsView(body, ctx, { system: false }),
      system: () => chartsView(body, ctx, { system: true }),
      media: () => mediaView(body, ctx),
      logs: () => logsView(body, ctx),
      events: () => eventsView(body, ctx),
      files: () => filesView(body, ctx),
      params: () => paramsView(body, ctx),
    }[t];
    view = make();
  }

  async function poll(first) {
    try {
      const [run, events, keys] = await Promise.all([
        api(`/runs/${encodeURIComponent(id)}`, { signal: controller.signal }),
        api(`/runs/${encodeURIComponent(id)}/events`, { signal: controller.signal }),
        api(`/runs/${encodeURIComponent(id)}/keys`, { signal: controller.signal }),
      ]);
      Object.assign(ctx, { run, events, keys });
      renderHead();
      message.replaceChildren();
      // Not awaited: a slow goodput read never holds up the tab.
      if (gp) gp.refresh();
      else gp = goodputView(goodput, ctx);
      if (first) {
        renderTabs();
        switchTab(tab);
      } else if (view && view.refresh) {
        await view.refresh();
      }
    } catch (err) {
      showError(message, err);
    }
    if (alive) timer = setTimeout(() => poll(false), isLive(ctx.run) ? LIVE_MS : IDLE_MS);
  }

  poll(true);
  return {
    dispose() {
      alive = false;
      clearTimeout(timer);
      controller.abort();
      if (view && view.dispose) view.dispose();
    },
  };
}

/**
 * Metric charts of one run: a chart per chosen key, x by step or wall
 * time, smoothing, log scale, and a zoom shared by all charts (on the step
 * axis the zoomed range is fetched again at full detail).
 */
function chartsView(root, ctx, { system }) {
  const param = system ? 'sys' : 'metrics';
  // System metrics are samples in time (their step is a timestamp): wall
  // time is their default axis, kept apart from the metrics' choice.
  const xParam = system ? 'sx' : 'x';
  const xDefault = system ? 'wall' : 'step';
  const q = query();
  const s = {
    x: (q.get(xParam) || xDefault) === 'wall' ? 'wall' : 'step',
    smooth: Math.min(0.99, Math.max(0, Number(q.get('smooth')) || 0)),
    log: q.get('log') === '1',
    chosen: q.has(param) ? listParam(q, param) : null,
    zoom: (q.get('zoom') || '').split(':').map(Number),
  };
  if (s.zoom.length !== 2 || !s.zoom.every(Number.isFinite)) s.zoom = null;
  const charts = new Map();
  const data = new Map();

  const ofKind = () => ctx.keys.filter((k) => k.startsWith('system/') === system);
  const wanted = () => (s.chosen ?? ofKind().slice(0, system ? 64 : MAX_DEFAULT_CHARTS)).filter((k) => ctx.keys.includes(k));

  const xIn = h('select', { name: 'x', onchange: () => { s.x = xIn.value; s.zoom = null; setQuery({ [xParam]: s.x === xDefault ? '' : s.x, zoom: '' }); rebuild(); } },
    h('option', { value: 'step', selected: s.x === 'step' }, 'step'),
    h('option', { value: 'wall', selected: s.x === 'wall' }, 'wall time'));
  const smoothOut = h('output', {}, s.smooth.toFixed(2));
  const smoothIn = h('input', {
    type: 'range', name: 'smooth', min: 0, max: 0.99, step: 0.01, value: s.smooth,
    oninput: () => {
      s.smooth = Number(smoothIn.value);
      smoothOut.textContent = s.smooth.toFixed(2);
      setQuery({ smooth: s.smooth ? String(s.smooth) : '' });
      rebuild();
    },
  });
  const logIn = h('input', { type: 'checkbox', name: 'log', checked: s.log, onchange: () => { s.log = logIn.checked; setQuery({ log: s.log ? '1' : '' }); rebuild(); } });
  const picker = h('details', { class: 'chooser' }, h('summary', {}, 'Metrics'));
  const resetZoom = h('button', { type: 'button', hidden: !s.zoom, onclick: () => zoomAll(null, null) }, 'Reset zoom');
  const controls = h('div', { class: 'bar chart-controls' },
    h('label', {}, 'x ', xIn), h('label', {}, 'smoothing ', smoothIn, smoothOut), h('label', {}, logIn, ' log scale'),
    resetZoom, h('span', { class: 'spacer' }), picker);
  const grid = h('div', { class: 'charts' });
  const empty = h('div');
  root.append(controls, empty, grid);

  function renderPicker() {
    const keep = picker.open;
    const list = h('div', { class: 'chooser-list' }, ofKind().map((k) => h('label', {},
      h('input', {
        type: 'checkbox',
        checked: wanted().includes(k),
        onchange: (e) => {
          const now = new Set(wanted());
          if (e.target.checked) now.add(k); else now.delete(k);
          s.chosen = ofKind().filter((x) => now.has(x));
          setQuery({ [param]: s.chosen.join(',') || ',' });
          rebuild();
        },
      }), k)));
    picker.replaceChildren(h('summary', {}, `Metrics (${wanted().length}/${ofKind().length})`), h('div', { class: 'chooser-panel' }, list));
    picker.open = keep;
  }

  function lines() {
    const color = '#1f77b4';
    return s.smooth > 0
      ? [{ label: 'raw', color, faint: true, width: 1 }, { label: 'smoothed', color }]
      : [{ label: 'value', color }];
  }

  function draw(key) {
    const chart = charts.get(key);
    const series = data.get(key);
    if (!chart || !series) return;
    const c = columns(series, s.x, s.log);
    const ys = s.smooth > 0 ? [c.y, smooth(c.y, s.smooth)] : [c.y];
    chart.setData(c.x, ys, { min: c.min, max: c.max });
    chart.setMarkers(markerPositions(ctx.events, series.points, s.x));
  }

  async function load(key) {
    const chart = charts.get(key);
    if (!chart) return;
    const zoomed = s.zoom && s.x === 'step';
    const buckets = Math.max(200, Math.min(4000, Math.round(chart.plot.clientWidth || 1000)));
    const series = await fetchSeries(ctx.id, key, {
      buckets,
      minStep: zoomed ? Math.floor(s.zoom[0]) : undefined,
      maxStep: zoomed ? Math.ceil(s.zoom[1]) : undefined,
      signal: ctx.signal,
    });
    data.set(key, series);
    draw(key);
    if (s.zoom) chart.zoomTo(s.zoom[0], s.zoom[1]);
  }

  function zoomAll(min, max) {
    s.zoom = min === null ? null : [min, max];
    setQuery({ zoom: s.zoom ? `${+min.toPrecision(8)}:${+max.toPrecision(8)}` : '' });
    resetZoom.hidden = !s.zoom;
    for (const [key, chart] of charts) {
      chart.zoomed = Boolean(s.zoom);
      if (s.x === 'step') load(key).catch((err) => showError(empty, err));
      else if (s.zoom) chart.zoomTo(min, max);
      else draw(key);
    }
  }

  function rebuild() {
    for (const c of charts.values()) c.destroy();
    charts.clear();
    grid.replaceChildren();
    renderPicker();
    const keys = wanted();
    empty.replaceChildren(keys.length ? '' : h('p', { class: 'empty' }, system
      ? 'No system metrics: `relaunch run --server URL` samples them on every node.'
      : 'No metrics yet.'));
    for (const key of keys) {
      charts.set(key, new Chart(grid, {
        title: key, xKind: s.x, log: s.log, lines: lines(), band: true,
        onZoom: (min, max) => zoomAll(min, max),
      }));
    }
    return Promise.all(keys.map((k) => load(k).catch((err) => showError(empty, err))));
  }

  rebuild();
  return {
    async refresh() {
      const keys = wanted();
      if (keys.length !== charts.size || keys.some((k) => !charts.has(k))) return rebuild();
      renderPicker();
      if (s.zoom) {
        for (const key of keys) draw(key);
        return undefined;
      }
      return Promise.all(keys.map((k) => load(k).catch((err) => showError(empty, err))));
    },
    dispose() {
      for (const c of charts.values()) c.destroy();
    },
  };
}

/** Starts, restarts, preemptions, failures (their tracebacks open), finish. */
function eventsView(root, ctx) {
  const list = h('ol', { class: 'events' });
  root.append(list);
  let shown = -1;
  function render() {
    if (ctx.events.length === shown) return;
    shown = ctx.events.length;
    const events = ctx.events.filter((e) => !DATA_KINDS.has(e.kind));
    if (!events.length) {
      list.replaceChildren(h('p', { class: 'empty' }, 'No events. `relaunch run --server URL` records starts, restarts and failures.'));
      return;
    }
    list.replaceChildren(...events.map((e) => {
      const failure = e.kind === 'failed' || e.kind === 'worker_failed' || e.kind === 'hang';
      const [first, ...rest] = (e.text || '').split('\n');
      const hasData = e.data && typeof e.data === 'object' && Object.keys(e.data).length > 0;
      return h('li', { class: `event kind-${e.kind}`, 'data-kind': e.kind },
        h('div', { class: 'event-line' },
          h('time', { title: fmtTime(e.wall) }, fmtTime(e.wall)),
          h('span', { class: 'badge' }, e.kind),
          h('span', { class: 'attempt' }, `attempt ${e.attempt}`),
          h('span', { class: 'event-text' }, first)),
        rest.length || hasData ? h('details', { open: failure },
          h('summary', {}, failure ? 'traceback and details' : 'details'),
          rest.length ? h('pre', { class: 'traceback' }, rest.join('\n')) : null,
          hasData ? h('pre', { class: 'data' }, JSON.stringify(e.data, null, 2)) : null) : null);
    }));
  }
  render();
  return { refresh: render };
}

/** Files and checkpoints (`checkpoints/step_N/...`), with sizes and downloads. */
function filesView(root, ctx) {
  const out = h('div');
  root.append(out);
  let signature = '';
  async function load() {
    try {
      const files = await api(`/runs/${encodeURIComponent(ctx.id)}/files`, { signal: ctx.signal });
      const sig = files.map((f) => `${f.name}:${f.blake3}`).join('|');
      if (sig === signature) return;
      signature = sig;
      const ckpts = new Map();
      const plain = [];
      for (const f of files) {
        const m = f.name.match(/^checkpoints\/(step_(\d+))\//);
        if (m) {
          if (!ckpts.has(m[1])) ckpts.set(m[1], { step: Number(m[2]), files: [] });
          ckpts.get(m[1]).files.push(f);
        } else plain.push(f);
      }
      const fileRows = (list) => list.map((f) => {
        const url = fileUrl(ctx.id, f.name);
        return h('tr', { 'data-file': f.name },
          h('td', {}, h('a', { href: url, download: f.name.split('/').pop() }, f.name)),
          h('td', { class: 'num' }, fmtBytes(f.size)),
          h('td', { title: fmtTime(f.created_at) }, fmtAgo(f.created_at)),
          h('td', {}, h('code', { title: f.blake3 }, f.blake3.slice(0, 12))));
      });
      const table = (rows) => h('table', { class: 'list' },
        h('thead', {}, h('tr', {}, h('th', {}, 'name'), h('th', {}, 'size'), h('th', {}, 'saved'), h('th', {}, 'blake3'))),
        h('tbody', {}, rows));
      const steps = [...ckpts.values()].sort((a, b) => b.step - a.step);
      out.replaceChildren(
        h('h3', {}, `Checkpoints (${steps.length})`),
        steps.length ? h('div', {}, steps.map((c) => h('details', { class: 'ckpt', 'data-step': c.step },
          h('summary', {}, `step ${c.step} · ${c.files.length} files · ${fmtBytes(c.files.reduce((s, f) => s + f.size, 0))}`),
          table(fileRows(c.files))))) : h('p', { class: 'empty' }, 'No checkpoints shipped.'),
        h('h3', {}, `Files (${plain.length})`),
        plain.length ? table(fileRows(plain)) : h('p', { class: 'empty' }, 'No files. run.save_file(path) uploads one.'));
    } catch (err) {
      showError(out, err);
    }
  }
  load();
  return { refresh: load };
}

/** The run's config, flattened, with a filter. */
function paramsView(root, ctx) {
  const filterIn = h('input', { type: 'search', placeholder: 'filter params' });
  const tbody = h('tbody');
  root.append(h('div', { class: 'bar' }, filterIn), h('table', { class: 'list params' },
    h('thead', {}, h('tr', {}, h('th', {}, 'param'), h('th', {}, 'value'))), tbody));
  function render() {
    const needle = filterIn.value.toLowerCase();
    const rows = [...flatten(ctx.run.config)].filter(([k, v]) => !needle || `${k} ${fmtValue(v)}`.toLowerCase().includes(needle));
    tbody.replaceChildren(...(rows.length
      ? rows.map(([k, v]) => h('tr', {}, h('td', {}, h('code', {}, k)), h('td', {}, fmtValue(v))))
      : [h('tr', {}, h('td', { colspan: 2, class: 'empty' }, 'No params. relaunch.init(config={...}) records them.'))]));
  }
  filterIn.addEventListener('input', render);
  render();
  return { refresh: render };
}
