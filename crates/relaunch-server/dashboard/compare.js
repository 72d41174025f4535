// Chosen runs side by side: each metric one chart with a line per run,
// and a table of the params that differ. `?runs=A,B,C`.

import uPlot from './vendor/uplot/uPlot.esm.js';
import { api } from './api.js';
import { Chart, columns, fetchSeries, smooth } from './chart.js';
import { compareMedia } from './media.js';
import {
  PALETTE, crumbs, flatten, fmtValue, h, isLive, listParam, query, setQuery, showError, statusBadge,
} from './util.js';

const LIVE_MS = 3000;
const MAX_DEFAULT_CHARTS = 12;

export function comparePage(root) {
  crumbs(h('a', { href: '/' }, 'runs'), h('span', {}, 'compare'));
  const controller = new AbortController();
  const q = query();
  const ids = listParam(q, 'runs');
  const s = {
    x: q.get('x') === 'wall' ? 'wall' : 'step',
    smooth: Math.min(0.99, Math.max(0, Number(q.get('smooth')) || 0)),
    log: q.get('log') === '1',
    chosen: q.has('metrics') ? listParam(q, 'metrics') : null,
    zoom: null,
    all: q.get('all') === '1',
  };
  let runs = [];
  let keys = [];
  const charts = new Map();
  const data = new Map();
  let timer = null;
  let alive = true;

  const message = h('div');
  const legend = h('div', { class: 'compare-runs' });
  const xIn = h('select', { name: 'x', onchange: () => { s.x = xIn.value; s.zoom = null; setQuery({ x: s.x === 'step' ? '' : s.x }); rebuild(); } },
    h('option', { value: 'step', selected: s.x === 'step' }, 'step'),
    h('option', { value: 'wall', selected: s.x === 'wall' }, 'wall time'));
  const smoothOut = h('output', {}, s.smooth.toFixed(2));
  const smoothIn = h('input', {
    type: 'range', name: 'smooth', min: 0, max: 0.99, step: 0.01, value: s.smooth,
    oninput: () => { s.smooth = Number(smoothIn.value); smoothOut.textContent = s.smooth.toFixed(2); setQuery({ smooth: s.smooth ? String(s.smooth) : '' }); drawAll(); },
  });
  const logIn = h('input', { type: 'checkbox', name: 'log', checked: s.log, onchange: () => { s.log = logIn.checked; setQuery({ log: s.log ? '1' : '' }); rebuild(); } });
  const resetZoom = h('button', { type: 'button', hidden: true, onclick: () => zoomAll(null, null) }, 'Reset zoom');
  const picker = h('details', { class: 'chooser' }, h('summary', {}, 'Metrics'));
  const grid = h('div', { class: 'charts' });
  const diff = h('div', { class: 'diff' });
  const media = h('div', { class: 'media-panels' });
  root.append(message, legend,
    h('div', { class: 'bar chart-controls' }, h('label', {}, 'x ', xIn), h('label', {}, 'smoothing ', smoothIn, smoothOut),
      h('label', {}, logIn, ' log scale'), resetZoom, h('span', { class: 'spacer' }), picker),
    grid, media, h('h3', {}, 'Params'), diff);

  if (!ids.length) {
    message.replaceChildren(h('p', { class: 'empty' }, 'No runs chosen: select runs in the ', h('a', { href: '/' }, 'runs table'), ' and press Compare.'));
    return { dispose() {} };
  }

  const color = (i) => PALETTE[i % PALETTE.length];
  const wanted = () => {
    if (s.chosen) return s.chosen.filter((k) => keys.includes(k));
    const common = keys.filter((k) => !k.startsWith('system/') && runs.every((r) => r.keys.includes(k)));
    return (common.length ? common : keys.filter((k) => !k.startsWith('system/'))).slice(0, MAX_DEFAULT_CHARTS);
  };

  function renderLegend() {
    legend.replaceChildren(...runs.map((r, i) => h('span', { class: 'compare-run', 'data-run': r.id },
      h('span', { class: 'swatch', style: { background: color(i) } }),
      h('a', { href: `/runs/${encodeURIComponent(r.id)}` }, r.name || r.id), ' ', statusBadge(r.status),
      h('button', {
        type: 'button', class: 'link', title: 'remove from the comparison',
        onclick: () => { setQuery({ runs: ids.filter((x) => x !== r.id).join(',') }, { push: true }); window.dispatchEvent(new PopStateEvent('popstate')); },
      }, '×'))));
  }

  function renderPicker() {
    const keep = picker.open;
    const now = wanted();
    picker.replaceChildren(h('summary', {}, `Metrics (${now.length}/${keys.length})`), h('div', { class: 'chooser-panel' }, h('div', { class: 'chooser-list' },
      keys.map((k) => h('label', {}, h('input', {
        type: 'checkbox',
        checked: now.includes(k),
        onchange: (e) => {
          const set = new Set(wanted());
          if (e.target.checked) set.add(k); else set.delete(k);
          s.chosen = keys.filter((x) => set.has(x));
          setQuery({ metrics: s.chosen.join(',') || ',' });
          rebuild();
        },
      }), k)))));
    picker.open = keep;
  }

  function renderDiff() {
    const flats = runs.map((r) => flatten(r.config));
    const paths = [...new Set(flats.flatMap((f) => [...f.keys()]))].sort();
    const differs = (p) => new Set(flats.map((f) => JSON.stringify(f.get(p)))).size > 1;
    const rows = paths.filter((p) => s.all || differs(p));
    const allIn = h('input', { type: 'checkbox', checked: s.all, onchange: () => { s.all = allIn.checked; setQuery({ all: s.all ? '1' : '' }); renderDiff(); } });
    diff.replaceChildren(
      h('label', {}, allIn, ` show all ${paths.length} params (${paths.filter(differs).length} differ)`),
      h('table', { class: 'list diff-table' },
        h('thead', {}, h('tr', {}, h('th', {}, 'param'), runs.map((r, i) => h('th', { style: { color: color(i) } }, r.name || r.id)))),
        h('tbody', {}, rows.length ? rows.map((p) => h('tr', { class: differs(p) ? 'differs' : '', 'data-param': p }, h('td', {}, h('code', {}, p)),
          flats.map((f) => h('td', {}, fmtValue(f.get(p))))))
          : h('tr', {}, h('td', { colspan: runs.length + 1, class: 'empty' }, 'The runs have the same params.')))));
  }

  function draw(key) {
    const chart = charts.get(key);
    const per = data.get(key);
    if (!chart || !per) return;
    const tables = per.map((series) => {
      if (!series) return [[], []];
      const c = columns(series, s.x, s.log);
      return [c.x, smooth(c.y, s.smooth)];
    });
    const joined = uPlot.join(tables);
    chart.setData(joined[0], joined.slice(1));
  }

  function drawAll() { for (const k of charts.keys()) draw(k); }

  async function load(key) {
    const chart = charts.get(key);
    const zoomed = s.zoom && s.x === 'step';
    const buckets = Math.max(200, Math.min(2000, Math.round(chart.plot.clientWidth || 1000)));
    const per = await Promise.all(runs.map((r) => (r.keys.includes(key)
      ? fetchSeries(r.id, key, {
        buckets,
        minStep: zoomed ? Math.floor(s.zoom[0]) : undefined,
        maxStep: zoomed ? Math.ceil(s.zoom[1]) : undefined,
        signal: controller.signal,
      })
      : null)));
    if (charts.get(key) !== chart) return;
    data.set(key, per);
    draw(key);
    if (s.zoom) chart.zoomTo(s.zoom[0], s.zoom[1]);
  }

  function zoomAll(min, max) {
    s.zoom = min === null ? null : [min, max];
    resetZoom.hidden = !s.zoom;
    for (const [key, chart] of charts) {
      chart.zoomed = Boolean(s.zoom);
      if (s.x === 'step') load(key).catch((err) => showError(message, err));
      else if (s.zoom) chart.zoomTo(min, max);
      else draw(key);
    }
  }

  function rebuild() {
    for (const c of charts.values()) c.destroy();
    charts.clear();
    data.clear();
    grid.replaceChildren();
    renderPicker();
    const lines = runs.map((r, i) => ({ label: r.name || r.id, color: color(i) }));
    for (const key of wanted()) {
      charts.set(key, new Chart(grid, { title: key, xKind: s.x, log: s.log, lines, showLast: false, onZoom: (a, b) => zoomAll(a, b) }));
    }
    return Promise.all([...charts.keys()].map((k) => load(k).catch((err) => showError(message, err))));
  }

  async function start() {
    try {
      runs = await Promise.all(ids.map(async (id) => {
        const [run, runKeys] = await Promise.all([
          api(`/runs/${encodeURIComponent(id)}`, { signal: controller.signal }),
          api(`/runs/${encodeURIComponent(id)}/keys`, { signal: controller.signal }),
        ]);
        return { ...run, keys: runKeys };
      }));
      keys = [...new Set(runs.flatMap((r) => r.keys))].sort();
      renderLegend();
      renderDiff();
      await rebuild();
      await compareMedia(media, runs, controller.signal);
    } catch (err) {
      showError(message, err);
    }
    schedule();
  }

  function schedule() {
    if (alive && runs.some(isLive)) timer = setTimeout(refresh, LIVE_MS);
  }

  async function refresh() {
    try {
      const fresh = await Promise.all(runs.map((r) => api(`/runs/${encodeURIComponent(r.id)}`, { signal: controller.signal })));
      runs = runs.map((r, i) => ({ ...fresh[i], keys: r.keys }));
      renderLegend();
      if (!s.zoom) await Promise.all([...charts.keys()].map((k) => load(k)));
    } catch (err) {
      showError(message, err);
    }
    schedule();
  }

  start();
  return {
    dispose() {
      alive = false;
      clearTimeout(timer);
      controller.abort();
      for (const c of charts.values()) c.destroy();
    },
  };
}
