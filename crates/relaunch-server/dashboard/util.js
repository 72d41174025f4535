// Small helpers every page uses: building DOM, formatting numbers, sizes
// and times, flattening configs, and the page state kept in the URL.

/** `h('div', {class: 'x', onclick: f}, child, ...)`: an element. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'style' && typeof v === 'object') Object.assign(el.style, v);
    else if (k in el && typeof v !== 'string') el[k] = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

/**
 * A metric value from the API as a number: the server writes NaN and the
 * infinities as the strings "NaN", "Infinity" and "-Infinity" (JSON has no
 * numbers for them); older servers wrote null, read as NaN.
 */
export function metricValue(v) {
  if (typeof v === 'number') return v;
  if (v === 'Infinity') return Infinity;
  if (v === '-Infinity') return -Infinity;
  return NaN;
}

/** A number for a person: a few significant digits, exponents when tiny or huge. */
export function fmtNum(v) {
  if (v === null || v === undefined) return '–';
  if (typeof v !== 'number') return String(v);
  if (Number.isNaN(v)) return 'NaN';
  if (v === Infinity) return '∞';
  if (v === -Infinity) return '-∞';
  if (Number.isInteger(v) && Math.abs(v) < 1e9) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3);
  return String(Number(v.toPrecision(5)));
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

/** Seconds since the epoch, as local date and time. */
export function fmtTime(t) {
  if (!t) return '–';
  const d = new Date(t * 1000);
  const pad = (x) => String(x).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function fmtAgo(t) {
  if (!t) return '–';
  const s = Date.now() / 1000 - t;
  if (s < 60) return `${Math.max(0, Math.round(s))}s ago`;
  if (s < 3600) return `${Math.round(s / 60)}m ago`;
  if (s < 86400) return `${Math.round(s / 3600)}h ago`;
  return `${Math.round(s / 86400)}d ago`;
}

/** A nested config as `[dotted.path, value]` pairs (arrays stay whole). */
export function flatten(value, prefix = '', out = new Map()) {
  if (value && typeof value === 'object' && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value)) flatten(v, prefix ? `${prefix}.${k}` : k, out);
  } else if (prefix) {
    out.set(prefix, value);
  }
  return out;
}

/** A config value for a table cell. */
export function fmtValue(v) {
  if (v === undefined) return '';
  if (typeof v === 'number') return fmtNum(v);
  if (typeof v === 'string') return v;
  return JSON.stringify(v);
}

/** The page's query string. */
export function query() {
  return new URLSearchParams(location.search);
}

/**
 * Changes the page's query without reloading or adding history: every
 * view is a link. `changes` maps names to a value, a list (repeated), or
 * null/'' (removed).
 */
export function setQuery(changes, { push = false } = {}) {
  const q = query();
  for (const [k, v] of Object.entries(changes)) {
    q.delete(k);
    if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
    else if (v !== null && v !== undefined && v !== '') q.set(k, v);
  }
  const s = q.toString();
  const url = location.pathname + (s ? `?${s}` : '');
  if (push) history.pushState(null, '', url);
  else history.replaceState(null, '', url);
}

/** A list kept in one query value, comma-separated. */
export function listParam(q, name) {
  const v = q.get(name);
  return v ? v.split(',').filter(Boolean) : [];
}

export function debounce(f, ms) {
  let t;
  return (...args) => { clearTimeout(t); t = setTimeout(() => f(...args), ms); };
}

/** Twenty colours that stay apart on white. */
export const PALETTE = [
  '#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf',
  '#bcbd22', '#7f7f7f', '#393b79', '#ad494a', '#637939', '#e6550d', '#7b4173', '#3182bd',
  '#31a354', '#756bb1', '#de9ed6', '#843c39',
];

export function statusBadge(status) {
  return h('span', { class: `badge status-${status}` }, status);
}

/** Whether a run may still log (the page polls while it does). */
export function isLive(run) {
  return run && (run.status === 'running' || run.status === 'restarting');
}

/** Navigates within the dashboard (app.js routes on popstate). */
export function go(url) {
  history.pushState(null, '', url);
  window.dispatchEvent(new PopStateEvent('popstate'));
}

/** Breadcrumbs in the header. */
export function crumbs(...parts) {
  document.getElementById('crumbs').replaceChildren(...parts.flatMap((p) => [h('span', { class: 'sep' }, '/'), p]));
}

/** Shows a failure where the person looks, once per message. */
export function showError(target, err) {
  if (err && err.name === 'AbortError') return;
  const msg = err && err.message ? err.message : String(err);
  target.replaceChildren(h('p', { class: 'error' }, msg));
}
