// Parallel coordinates of the runs table: an axis per chosen param and
// metric column, a line per run shown, coloured by the last axis (the
// metric the runs are judged by). Dragging along an axis keeps only the
// runs whose value there falls in the dragged range; a click on an axis
// clears its range. Drawn on a canvas, so 10,000 runs stay fast.

import { h } from './util.js';

const HEIGHT = 260;
const PAD = { top: 28, bottom: 24, side: 60 };

/** Where `v` falls on an axis of `values`, 0 (bottom) to 1 (top); null when it has none. */
function scaleOf(values) {
  const nums = values.filter((v) => typeof v === 'number' && Number.isFinite(v));
  if (nums.length && nums.length === values.filter((v) => v !== undefined && v !== null).length) {
    let lo = Math.min(...nums);
    let hi = Math.max(...nums);
    // Learning rates and the like span decades: a log axis when they do.
    const log = lo > 0 && hi / lo >= 100;
    const f = log ? Math.log10 : (x) => x;
    lo = f(lo); hi = f(hi);
    const span = hi - lo || 1;
    return {
      at: (v) => (typeof v === 'number' && Number.isFinite(v) ? (f(v) - lo) / span : null),
      ticks: [[0, fmt(log ? 10 ** lo : lo)], [1, fmt(log ? 10 ** hi : hi)]],
      log,
    };
  }
  const cats = [...new Set(values.filter((v) => v !== undefined && v !== null).map(String))]
    .sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
  const step = cats.length > 1 ? 1 / (cats.length - 1) : 0;
  const index = new Map(cats.map((c, i) => [c, cats.length > 1 ? i * step : 0.5]));
  return {
    at: (v) => (v === undefined || v === null ? null : index.get(String(v)) ?? null),
    ticks: cats.length <= 12 ? cats.map((c) => [index.get(c), c]) : [[0, cats[0]], [1, cats[cats.length - 1]]],
    log: false,
  };
}

function fmt(x) {
  return Math.abs(x) >= 1e4 || (x !== 0 && Math.abs(x) < 1e-3) ? x.toExponential(2) : String(+x.toPrecision(4));
}

/**
 * The panel. `onBrush()` is called when the ranges change; `keeps(run)`
 * says whether a run passes them.
 */
export function parallelView({ onBrush }) {
  const canvas = h('canvas', { class: 'parallel-canvas', height: HEIGHT });
  const axesBox = h('div', { class: 'parallel-axes' });
  const note = h('p', { class: 'empty' });
  const el = h('div', { class: 'parallel' }, axesBox, canvas, note);
  const brushes = new Map();
  let axes = [];
  let scales = new Map();
  let drag = null;

  function x(i) {
    const width = canvas.width;
    return axes.length > 1 ? PAD.side + (i * (width - 2 * PAD.side)) / (axes.length - 1) : width / 2;
  }
  const y = (t) => PAD.top + (1 - t) * (HEIGHT - PAD.top - PAD.bottom);
  const t = (py) => 1 - (py - PAD.top) / (HEIGHT - PAD.top - PAD.bottom);

  function keeps(run, valueOf) {
    for (const [id, [lo, hi]] of brushes) {
      const s = scales.get(id);
      if (!s) continue;
      const at = s.at(valueOf(run, id));
      if (at === null || at < lo || at > hi) return false;
    }
    return true;
  }

  /** Draws `runs` on `columns` (`{id, label}`), their values from `valueOf`. */
  function draw(runs, columns, valueOf) {
    axes = columns;
    canvas.width = Math.max(400, el.clientWidth || 1200);
    scales = new Map(axes.map((a) => [a.id, scaleOf(runs.map((r) => valueOf(r, a.id)))]));
    for (const id of brushes.keys()) if (!scales.has(id)) brushes.delete(id);
    const g = canvas.getContext('2d');
    g.clearRect(0, 0, canvas.width, HEIGHT);
    if (axes.length < 2) {
      note.textContent = 'Choose two or more param or metric columns (Columns) to compare runs across them.';
      canvas.dataset.lines = '0';
      axesBox.replaceChildren();
      return;
    }
    note.textContent = '';
    const last = scales.get(axes[axes.length - 1].id);
    let lines = 0;
    g.lineWidth = runs.length > 2000 ? 0.5 : 1;
    g.globalAlpha = runs.length > 2000 ? 0.35 : 0.7;
    for (const run of runs) {
      const c = last.at(valueOf(run, axes[axes.length - 1].id));
      const kept = keeps(run, valueOf);
      g.strokeStyle = !kept ? '#d0d5dd' : c === null ? '#98a2b3' : `hsl(${220 - 200 * c}, 70%, 45%)`;
      g.beginPath();
      let started = false;
      axes.forEach((a, i) => {
        const at = scales.get(a.id).at(valueOf(run, a.id));
        if (at === null) { started = false; return; }
        if (started) g.lineTo(x(i), y(at)); else { g.moveTo(x(i), y(at)); started = true; }
      });
      g.stroke();
      if (kept) lines += 1;
    }
    g.globalAlpha = 1;
    axes.forEach((a, i) => {
      g.strokeStyle = '#344054';
      g.lineWidth = 1;
      g.beginPath(); g.moveTo(x(i), y(0)); g.lineTo(x(i), y(1)); g.stroke();
      const b = brushes.get(a.id);
      if (b) {
        g.fillStyle = 'rgba(31, 95, 191, 0.25)';
        g.fillRect(x(i) - 8, y(b[1]), 16, y(b[0]) - y(b[1]));
      }
      g.fillStyle = '#667085';
      g.font = '11px sans-serif';
      g.textAlign = 'center';
      for (const [at, label] of scales.get(a.id).ticks) g.fillText(String(label).slice(0, 14), x(i), at === 1 ? y(1) - 6 : y(at) + 14);
    });
    canvas.dataset.lines = String(lines);
    axesBox.replaceChildren(...axes.map((a, i) => h('span', {
      class: 'parallel-axis', 'data-axis': a.id, style: { left: `${x(i)}px` },
      title: scales.get(a.id).log ? `${a.label} (log scale)` : a.label,
    }, a.label)));
  }

  canvas.addEventListener('mousedown', (e) => {
    if (axes.length < 2) return;
    const r = canvas.getBoundingClientRect();
    const px = (e.clientX - r.left) * (canvas.width / r.width);
    const i = axes.findIndex((_, j) => Math.abs(x(j) - px) < 20);
    if (i < 0) return;
    drag = { id: axes[i].id, from: t(e.clientY - r.top), moved: false };
  });
  const onMove = (e) => {
    if (!drag) return;
    const r = canvas.getBoundingClientRect();
    const to = t(e.clientY - r.top);
    drag.moved = true;
    brushes.set(drag.id, [Math.max(0, Math.min(drag.from, to)), Math.min(1, Math.max(drag.from, to))]);
    onBrush();
  };
  const onUp = () => {
    if (drag && !drag.moved) { brushes.delete(drag.id); onBrush(); }
    drag = null;
  };
  window.addEventListener('mousemove', onMove);
  window.addEventListener('mouseup', onUp);

  return {
    el,
    draw,
    keeps,
    active: () => brushes.size > 0,
    dispose() {
      window.removeEventListener('mousemove', onMove);
      window.removeEventListener('mouseup', onUp);
    },
  };
}
