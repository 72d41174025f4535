// Line charts over uPlot: the server's downsampled series as columns,
// smoothing, log scale, drag to zoom (double-click to reset), and markers
// (restarts, preemptions, failures) drawn as dashed vertical lines.

import uPlot from './vendor/uplot/uPlot.esm.js';
import { api, qs } from './api.js';
import { h, fmtNum, metricValue } from './util.js';

/** Events drawn on charts, and their colours. */
export const MARKERS = {
  restart: '#d62728',
  preempted: '#ff7f0e',
  failed: '#d62728',
  worker_failed: '#9467bd',
};

/** The charts on the page, by title, for tests and debugging. */
export const registry = new Map();
window.__relaunch = { charts: registry };

/**
 * Marks `relaunch:NAME` in the performance timeline once, after the next
 * paint (two animation frames): the benchmark reads these.
 */
export function markPainted(name) {
  if (performance.getEntriesByName(`relaunch:${name}`).length || markPainted[name]) return;
  markPainted[name] = true;
  requestAnimationFrame(() => requestAnimationFrame(() => performance.mark(`relaunch:${name}`)));
}

/** One key of one run, downsampled by the server to at most `buckets` points. */
export async function fetchSeries(run, key, { buckets = 1000, minStep, maxStep, signal } = {}) {
  const series = await api(`/runs/${encodeURIComponent(run)}/series${qs({ key, buckets, min_step: minStep, max_step: maxStep })}`, { signal });
  for (const p of series.points) {
    p.value = metricValue(p.value);
    p.min = metricValue(p.min);
    p.max = metricValue(p.max);
  }
  return series;
}

/**
 * A series' points as columns against `xKind` (`step` or `wall`), sorted
 * by x (uPlot needs ascending x). NaN and the infinities become null: a
 * gap in the line (uPlot breaks a line at null, never draws it as 0);
 * `log` skips values a log scale cannot show (undefined: the line joins
 * over them). A band's min and max skip NaN on the server already.
 */
export function columns(series, xKind, log = false) {
  let pts = series.points;
  if (xKind === 'wall') {
    const sorted = pts.every((p, i) => i === 0 || pts[i - 1].wall <= p.wall);
    if (!sorted) pts = [...pts].sort((a, b) => a.wall - b.wall);
  }
  const ok = (v) => (typeof v !== 'number' || !Number.isFinite(v) ? null : log && v <= 0 ? undefined : v);
  return {
    x: pts.map((p) => (xKind === 'wall' ? p.wall : p.step)),
    y: pts.map((p) => ok(p.value)),
    min: pts.map((p) => ok(p.min)),
    max: pts.map((p) => ok(p.max)),
    points: pts,
  };
}

/** Exponential moving average, debiased like TensorBoard's; gaps stay gaps. */
export function smooth(ys, weight) {
  if (!weight) return ys;
  const out = new Array(ys.length);
  let last = 0;
  let n = 0;
  for (let i = 0; i < ys.length; i++) {
    const y = ys[i];
    if (y === undefined) { out[i] = undefined; continue; }
    if (y === null || !Number.isFinite(y)) { out[i] = null; continue; }
    last = last * weight + (1 - weight) * y;
    n++;
    out[i] = last / (1 - weight ** n);
  }
  return out;
}

/** Where each marker event sits on the x axis of `points` (sorted by step). */
export function markerPositions(events, points, xKind) {
  const out = [];
  for (const e of events) {
    const color = MARKERS[e.kind];
    if (!color) continue;
    let x = e.wall;
    if (xKind === 'step') {
      // The first step logged after the event: where the next attempt
      // took over (or the failure's last step when nothing followed).
      const after = points.find((p) => p.wall >= e.wall);
      const before = points.length ? points[points.length - 1] : null;
      if (after) x = after.step;
      else if (before) x = before.step;
      else continue;
    }
    out.push({ x, color, label: e.kind.replace('_', ' '), kind: e.kind, attempt: e.attempt });
  }
  return out;
}

/** An axis tick: short, SI prefixes for large numbers. */
export function fmtTick(v) {
  if (v === null || v === undefined) return '';
  const a = Math.abs(v);
  if (a >= 1e3) {
    const units = [[1e15, 'P'], [1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']];
    const [div, unit] = units.find(([d]) => a >= d);
    return `${+(v / div).toPrecision(4)}${unit}`;
  }
  if (a !== 0 && a < 1e-3) return v.toExponential(1);
  return String(+v.toPrecision(4));
}

function withAlpha(color, alpha) {
  const a = Math.round(alpha * 255).toString(16).padStart(2, '0');
  return color + a;
}

function drawMarkers(u, markers) {
  const { ctx } = u;
  const dpr = devicePixelRatio || 1;
  const { left, top, width, height } = u.bbox;
  ctx.save();
  ctx.font = `${10 * dpr}px system-ui, sans-serif`;
  // Labels of markers close together go one under another.
  let lastX = -Infinity;
  let row = 0;
  for (const m of markers) {
    const x = Math.round(u.valToPos(m.x, 'x', true));
    if (!(x >= left && x <= left + width)) continue;
    row = x - lastX < 80 * dpr ? row + 1 : 0;
    lastX = x;
    ctx.strokeStyle = m.color;
    ctx.fillStyle = m.color;
    ctx.lineWidth = dpr;
    ctx.setLineDash([4 * dpr, 3 * dpr]);
    ctx.beginPath();
    ctx.moveTo(x, top);
    ctx.lineTo(x, top + height);
    ctx.stroke();
    ctx.fillText(m.label, x + 3 * dpr, top + (11 + 12 * row) * dpr);
  }
  ctx.restore();
}

/**
 * A chart card: a title with the newest value, the plot, and a line per
 * marker under it. `lines` are `{label, color, width?, faint?}`; a `band`
 * (min/max of each bucket) shades behind line 0.
 */
export class Chart {
  constructor(parent, { title, xKind = 'step', log = false, lines, band = false, onZoom = null, height = 220, showLast = true }) {
    this.title = title;
    this.xKind = xKind;
    this.onZoom = onZoom;
    this.showLast = showLast;
    this.markers = [];
    this.zoomed = false;
    this.value = h('span', { class: 'chart-value' });
    this.plot = h('div', { class: 'chart-plot' });
    this.markerList = h('div', { class: 'chart-markers' });
    this.el = h('div', { class: 'chart', 'data-key': title },
      h('div', { class: 'chart-head' }, h('span', { class: 'chart-title' }, title), this.value),
      this.plot, this.markerList);
    parent.append(this.el);
    const series = [{ label: xKind }];
    for (const l of lines) {
      series.push({
        label: l.label,
        stroke: l.faint ? withAlpha(l.color, 0.3) : l.color,
        width: l.width ?? 1.5,
        // null (a NaN or infinite value) breaks the line; undefined (no
        // point at this x: another run's step) is joined over.
        spanGaps: false,
        points: { show: false },
        value: (u, v) => fmtNum(v),
      });
    }
    const bands = [];
    if (band) {
      const c = lines[0].color;
      series.push({ label: 'max', stroke: withAlpha(c, 0), spanGaps: true, points: { show: false }, value: (u, v) => fmtNum(v) });
      series.push({ label: 'min', stroke: withAlpha(c, 0), spanGaps: true, points: { show: false }, value: (u, v) => fmtNum(v) });
      bands.push({ series: [series.length - 2, series.length - 1], fill: withAlpha(c, 0.12) });
    }
    this.nLines = lines.length;
    this.band = band;
    const width = Math.max(200, this.plot.clientWidth || parent.clientWidth || 400);
    const opts = {
      width,
      height,
      series,
      bands,
      scales: { x: { time: xKind === 'wall' }, y: log ? { distr: 3, log: 10 } : {} },
      axes: [
        xKind === 'wall'
          ? { stroke: '#555', grid: { stroke: '#eee' }, ticks: { stroke: '#ddd' } }
          : { stroke: '#555', grid: { stroke: '#eee' }, ticks: { stroke: '#ddd' }, values: (u, vals) => vals.map(fmtTick) },
        { stroke: '#555', grid: { stroke: '#eee' }, ticks: { stroke: '#ddd' }, size: 60, values: (u, vals) => vals.map(fmtTick) },
      ],
      cursor: {
        // Zoom is ours: a drag selects, setSelect reports it, the page
        // fetches that range at full detail and zooms every chart.
        drag: { x: true, y: false, setScale: false },
        bind: {
          dblclick: () => () => { this.resetZoom(); return null; },
        },
      },
      legend: { live: true },
      hooks: {
        setSelect: [(u) => {
          const { left, width } = u.select;
          if (width < 3) return;
          const min = u.posToVal(left, 'x');
          const max = u.posToVal(left + width, 'x');
          u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
          this.zoomed = true;
          if (this.onZoom) this.onZoom(min, max);
          else this.zoomTo(min, max);
        }],
        draw: [(u) => drawMarkers(u, this.markers)],
      },
    };
    this.u = new uPlot(opts, [[], ...series.slice(1).map(() => [])], this.plot);
    this.resize = new ResizeObserver(() => {
      const w = this.plot.clientWidth;
      if (w > 0 && Math.abs(w - this.u.width) > 1) this.u.setSize({ width: w, height });
    });
    this.resize.observe(this.plot);
    registry.set(title, this);
  }

  /**
   * New data: `x`, one array per line, and the band's `min`/`max`. The
   * view keeps its zoom unless `reset`.
   */
  setData(x, ys, { min, max } = {}, reset = !this.zoomed) {
    const data = [x, ...ys];
    if (this.band) data.push(max, min);
    this.u.setData(data, reset);
    if (x.length) markPainted('first-chart');
    if (!this.showLast) return;
    const last = ys[ys.length - 1];
    let i = last.length - 1;
    while (i >= 0 && (last[i] === null || last[i] === undefined)) i--;
    this.value.textContent = i >= 0 && this.nLines === ys.length
      ? `${fmtNum(last[i])} @ ${this.xKind === 'wall' ? new Date(x[i] * 1000).toLocaleTimeString() : `step ${x[i]}`}`
      : '';
  }

  /** Sets the x range (another chart's zoom, a shared link's). */
  zoomTo(min, max) {
    this.u.setScale('x', { min, max });
    this.zoomed = true;
  }

  resetZoom() {
    this.zoomed = false;
    if (this.onZoom) this.onZoom(null, null);
    else {
      const x = this.u.data[0];
      if (x.length) this.zoomTo(x[0], x[x.length - 1]);
      this.zoomed = false;
    }
  }

  setMarkers(markers) {
    this.markers = markers;
    this.markerList.replaceChildren(...markers.map((m) => h('span', { class: 'marker', style: { borderColor: m.color, color: m.color } },
      `${m.label} · attempt ${m.attempt} · ${this.xKind === 'wall' ? new Date(m.x * 1000).toLocaleTimeString() : `step ${m.x}`}`)));
    this.u.redraw(false, false);
  }

  destroy() {
    this.resize.disconnect();
    this.u.destroy();
    if (registry.get(this.title) === this) registry.delete(this.title);
  }
}
