// The runs table: server-side filters (project, status, tag, param and
// latest metric values), columns of params and latest metrics chosen by
// the person, sorting and a text search, selection for the compare view.
// The page holds the first 10,000 runs of the filter in the table's
// order: when that is all of them, sorting and search happen here, at
// once; when the filter selects more, they go to the server, which sorts
// and searches every run (`sort=`, `q=`). Rows are drawn only where they
// are visible; the latest metric values come in one request (`GET
// /latest`). Parallel coordinates of the chosen columns (`parallel.js`)
// filter it by brushing.

import { api, apiPage, qs } from './api.js';
import { markPainted } from './chart.js';
import { parallelView } from './parallel.js';
import {
  crumbs, debounce, flatten, fmtAgo, fmtNum, fmtTime, fmtValue, h, listParam, metricValue, query,
  setQuery, showError, statusBadge,
} from './util.js';

const ROW = 30;
// Runs a page holds (`?rows=N` sets fewer).
const LIMIT = 10000;
const REFRESH_MS = 15000;
const STATUSES = ['running', 'restarting', 'preempted', 'failed', 'finished'];

const BUILTIN = [
  { id: 'name', label: 'name', width: 220 },
  { id: 'status', label: 'status', width: 92 },
  { id: 'project', label: 'project', width: 120 },
  { id: 'created', label: 'created', width: 92 },
  { id: 'attempts', label: 'attempts', width: 76 },
  { id: 'tags', label: 'tags', width: 140 },
];

export function runsPage(root) {
  crumbs(h('span', {}, 'runs'));
  const q = query();
  const filter = {
    project: q.get('project') || '',
    status: q.get('status') || '',
    tag: q.get('tag') || '',
    param: q.getAll('param'),
    metric: q.getAll('metric'),
  };
  let text = q.get('q') || '';
  const rows = Math.min(LIMIT, Math.max(1, Number(q.get('rows')) || LIMIT));
  let cols = q.has('cols') ? listParam(q, 'cols') : null;
  let sort = q.get('sort') || '-created';
  const selected = new Set(listParam(q, 'sel'));

  let runs = [];
  let total = 0;
  let loadedQ = '';
  let flat = new Map();
  let metricNames = [];
  let paramPaths = [];
  let latest = new Map();
  let shown = [];
  let timer = null;
  let alive = true;
  const controller = new AbortController();

  // The filters.
  const input = (name, value, placeholder, width) => h('input', {
    name, value, placeholder, style: { width }, spellcheck: false,
  });
  const projectIn = input('project', filter.project, 'project', '9em');
  projectIn.setAttribute('list', 'projects');
  const projectList = h('datalist', { id: 'projects' });
  const statusIn = h('select', { name: 'status' },
    h('option', { value: '' }, 'any status'),
    STATUSES.map((s) => h('option', { value: s, selected: s === filter.status }, s)));
  const tagIn = input('tag', filter.tag, 'tag', '7em');
  const paramIn = input('param', filter.param.join(' '), 'param=value …', '14em');
  paramIn.title = 'config values, PATH=VALUE separated by spaces (optim.lr=0.001 layers>4)';
  const metricIn = input('metric', filter.metric.join(' '), 'metric<value …', '11em');
  metricIn.title = 'latest metric values, KEY OP NUMBER separated by spaces (loss<0.5 acc>=0.9); OP one of = != < <= > >=';
  const textIn = input('q', text, 'search name, id, tags, notes', '16em');
  textIn.type = 'search';
  const form = h('form', { class: 'filters', onsubmit: (e) => { e.preventDefault(); applyFilters(); } },
    projectIn, projectList, statusIn, tagIn, paramIn, metricIn, h('button', { type: 'submit' }, 'Filter'), textIn);
  statusIn.addEventListener('change', () => applyFilters());
  projectIn.addEventListener('change', () => applyFilters());
  textIn.addEventListener('input', debounce(() => {
    text = textIn.value;
    setQuery({ q: text });
    // Every run is here: search them here; else the server searches all.
    if (everything()) refilter(); else load(false);
  }, 80));

  const count = h('span', { class: 'count' });
  const compareLink = h('a', { class: 'button', href: '/compare' }, 'Compare');
  const clearSel = h('button', { type: 'button', onclick: () => { selected.clear(); selectionChanged(); renderRows(true); } }, 'Clear selection');
  const chooser = h('details', { class: 'chooser' }, h('summary', {}, 'Columns'));
  const bar = h('div', { class: 'bar' }, count, h('span', { class: 'spacer' }), chooser, clearSel, compareLink);
  const message = h('div');
  const thead = h('thead');
  const tbody = h('tbody');
  const colgroup = h('colgroup');
  const table = h('table', { class: 'runs' }, colgroup, thead, tbody);
  const wrap = h('div', { class: 'table-wrap' }, table);
  wrap.addEventListener('scroll', () => renderRows(), { passive: true });
  const parallel = parallelView({ onBrush: () => refilter() });
  const parallelPanel = h('details', { class: 'parallel-panel', open: q.get('pc') === '1' },
    h('summary', {}, 'Parallel coordinates'), parallel.el);
  parallelPanel.addEventListener('toggle', () => { setQuery({ pc: parallelPanel.open ? '1' : '' }); refilter(); });
  root.append(form, bar, message, parallelPanel, wrap);

  function applyFilters() {
    filter.project = projectIn.value.trim();
    filter.status = statusIn.value;
    filter.tag = tagIn.value.trim();
    filter.param = paramIn.value.split(/\s+/).filter(Boolean);
    filter.metric = metricIn.value.split(/\s+/).filter(Boolean);
    setQuery({ project: filter.project, status: filter.status, tag: filter.tag, param: filter.param, metric: filter.metric });
    load(true);
  }

  /** Whether the page holds every run the filter selects, whatever the search. */
  function everything() {
    return !loadedQ && runs.length >= total;
  }

  /** The table's order as the server names it (`sort=`). */
  function serverSort() {
    const desc = sort.startsWith('-');
    const id = desc ? sort.slice(1) : sort;
    const names = { name: 'name', status: 'status', project: 'project', created: 'created', attempts: 'attempts' };
    let by = names[id];
    if (id.startsWith('p:')) by = `config.${id.slice(2)}`;
    if (id.startsWith('m:')) by = `summary.${id.slice(2)}`;
    return by ? `${desc ? '-' : ''}${by}` : '-created';
  }

  /** The query of the runs this page holds: the filter, its order, the search when asked, its size. */
  function pageQuery(withText) {
    return { ...filter, sort: serverSort(), q: withText ? text.trim() : '', limit: rows };
  }

  function selectionChanged() {
    setQuery({ sel: [...selected].join(',') });
    const n = selected.size;
    compareLink.textContent = `Compare ${n}`;
    compareLink.href = `/compare${qs({ runs: [...selected].join(',') })}`;
    compareLink.classList.toggle('disabled', n < 1);
    clearSel.hidden = n === 0;
  }

  function columns() {
    const extra = (cols || []).map((id) => ({
      id,
      label: id.slice(2),
      kind: id.slice(0, 1),
      width: 110,
    }));
    return [{ id: 'sel', label: '', width: 40 }, ...BUILTIN, ...extra];
  }

  /** Params that differ between runs, then metrics: the default columns. */
  function defaultColumns() {
    const varying = [];
    for (const path of paramPaths) {
      let first;
      let differs = false;
      for (const run of runs) {
        const v = JSON.stringify(flat.get(run.id).get(path));
        if (first === undefined) first = v;
        else if (v !== first) { differs = true; break; }
      }
      if (differs) varying.push(`p:${path}`);
      if (varying.length >= 4) break;
    }
    const metrics = metricNames.filter((k) => !k.startsWith('system/')).slice(0, 4).map((k) => `m:${k}`);
    return [...varying, ...metrics];
  }

  function cellValue(run, id) {
    switch (id) {
      case 'name': return run.name || run.id;
      case 'status': return run.status;
      case 'project': return run.project;
      case 'created': return run.created_at;
      case 'attempts': return run.attempts;
      case 'tags': return run.tags.join(' ');
      default:
        if (id.startsWith('p:')) return flat.get(run.id).get(id.slice(2));
        if (id.startsWith('m:')) {
          const l = latest.get(run.id);
          return l ? l.get(id.slice(2)) : undefined;
        }
        return undefined;
    }
  }

  function compare(a, b) {
    const undef = (v) => v === undefined || v === null || Number.isNaN(v);
    if (undef(a)) return undef(b) ? 0 : 1;
    if (undef(b)) return -1;
    if (typeof a === 'number' && typeof b === 'number') return a - b;
    return String(a).localeCompare(String(b), undefined, { numeric: true });
  }

  function refilter() {
    const needle = text.trim().toLowerCase();
    const matching = needle
      ? runs.filter((r) => `${r.name} ${r.id} ${r.project} ${r.tags.join(' ')} ${r.notes}`.toLowerCase().includes(needle))
      : runs.slice();
    if (parallelPanel.open) {
      parallel.draw(matching, columns().filter((c) => c.kind === 'p' || c.kind === 'm'), cellValue);
    }
    shown = parallelPanel.open && parallel.active()
      ? matching.filter((r) => parallel.keeps(r, cellValue))
      : matching;
    const desc = sort.startsWith('-');
    const key = desc ? sort.slice(1) : sort;
    const vals = new Map(shown.map((r) => [r.id, cellValue(r, key)]));
    shown.sort((a, b) => {
      const va = vals.get(a.id);
      const vb = vals.get(b.id);
      const undef = (v) => v === undefined || v === null || Number.isNaN(v);
      if (undef(va) || undef(vb)) return compare(va, vb);
      return desc ? compare(vb, va) : compare(va, vb);
    });
    if (runs.length >= total) count.textContent = `${shown.length} of ${total} runs`;
    else count.textContent = `${shown.length} of ${total} runs (the first ${runs.length} in this order; the server sorts and searches them all)`;
    renderHead();
    renderRows(true);
  }

  function renderHead() {
    const all = columns();
    colgroup.replaceChildren(...all.map((c) => h('col', { style: { width: `${c.width}px` } })));
    table.style.width = `${all.reduce((s, c) => s + c.width, 0)}px`;
    const allBox = h('input', {
      type: 'checkbox',
      title: 'select every run shown',
      checked: shown.length > 0 && shown.every((r) => selected.has(r.id)),
      onchange: (e) => {
        for (const r of shown) (e.target.checked ? selected.add(r.id) : selected.delete(r.id));
        selectionChanged();
        renderRows(true);
      },
    });
    thead.replaceChildren(h('tr', {}, all.map((c) => {
      if (c.id === 'sel') return h('th', {}, allBox);
      const mark = sort === c.id ? ' ▲' : sort === `-${c.id}` ? ' ▼' : '';
      return h('th', {
        title: c.kind === 'm' ? `latest ${c.label}` : c.kind === 'p' ? `param ${c.label}` : c.label,
        class: c.kind ? `col-${c.kind}` : '',
        onclick: () => {
          sort = sort === `-${c.id}` ? c.id : `-${c.id}`;
          setQuery({ sort });
          if (everything()) refilter(); else load(false);
        },
      }, c.label + mark);
    })));
  }

  let lastRange = '';
  function renderRows(force = false) {
    const all = columns();
    const first = Math.max(0, Math.floor(wrap.scrollTop / ROW) - 10);
    const visible = Math.ceil((wrap.clientHeight || 800) / ROW) + 20;
    const last = Math.min(shown.length, first + visible);
    const range = `${first}:${last}`;
    if (!force && range === lastRange) return;
    lastRange = range;
    const rows = [h('tr', { class: 'spacer', style: { height: `${first * ROW}px` } })];
    for (let i = first; i < last; i++) rows.push(row(shown[i], all));
    rows.push(h('tr', { class: 'spacer', style: { height: `${(shown.length - last) * ROW}px` } }));
    tbody.replaceChildren(...rows);
  }

  function row(run, all) {
    return h('tr', { 'data-run': run.id, class: selected.has(run.id) ? 'selected' : '' }, all.map((c) => {
      switch (c.id) {
        case 'sel':
          return h('td', {}, h('input', {
            type: 'checkbox',
            checked: selected.has(run.id),
            'aria-label': `select ${run.id}`,
            onchange: (e) => {
              (e.target.checked ? selected.add(run.id) : selected.delete(run.id));
              e.target.closest('tr').classList.toggle('selected', e.target.checked);
              selectionChanged();
            },
          }));
        case 'name':
          return h('td', { title: run.id }, h('a', { href: `/runs/${encodeURIComponent(run.id)}` }, run.name || run.id));
        case 'status': return h('td', {}, statusBadge(run.status));
        case 'created': return h('td', { title: fmtTime(run.created_at) }, fmtAgo(run.created_at));
        case 'tags': return h('td', {}, run.tags.map((t) => h('span', { class: 'tag' }, t)));
        default: {
          const v = cellValue(run, c.id);
          return h('td', { class: c.kind === 'm' || typeof v === 'number' ? 'num' : '', title: c.kind === 'm' ? fmtValue(v) : '' },
            c.kind === 'm' ? fmtNum(v) : fmtValue(v));
        }
      }
    }));
  }

  function renderChooser() {
    const filterIn = h('input', { type: 'search', placeholder: 'filter columns' });
    const list = h('div', { class: 'chooser-list' });
    const box = (id, label) => h('label', { 'data-col': id },
      h('input', {
        type: 'checkbox',
        checked: (cols || []).includes(id),
        onchange: (e) => {
          const now = new Set(cols || []);
          if (e.target.checked) now.add(id); else now.delete(id);
          cols = [...(cols || []).filter((c) => now.has(c)), ...[...now].filter((c) => !(cols || []).includes(c))];
          setQuery({ cols: cols.join(',') || ',' });
          loadLatest().then(refilter, (err) => showError(message, err));
        },
      }), label);
    const fill = () => {
      const needle = filterIn.value.toLowerCase();
      const match = (s) => s.toLowerCase().includes(needle);
      list.replaceChildren(
        h('h4', {}, 'Params'), paramPaths.filter(match).map((p) => box(`p:${p}`, p)),
        h('h4', {}, 'Latest metrics'), metricNames.filter(match).map((k) => box(`m:${k}`, k)));
    };
    filterIn.addEventListener('input', fill);
    fill();
    chooser.replaceChildren(h('summary', {}, 'Columns'), h('div', { class: 'chooser-panel' }, filterIn, list));
  }

  async function loadLatest(query = pageQuery(Boolean(loadedQ))) {
    const keys = (cols || []).filter((c) => c.startsWith('m:')).map((c) => c.slice(2));
    latest = new Map();
    if (!keys.length || !runs.length) return;
    const rows = await api(`/latest${qs({ ...query, key: keys })}`, { signal: controller.signal });
    for (const r of rows) {
      let m = latest.get(r.run);
      if (!m) latest.set(r.run, (m = new Map()));
      m.set(r.key, metricValue(r.value));
    }
  }

  async function load(fresh) {
    clearTimeout(timer);
    try {
      const read = (f) => Promise.all([
        apiPage(`/runs${qs(f)}`, { signal: controller.signal }),
        api(`/keys${qs(f)}`, { signal: controller.signal }),
      ]);
      // The whole filter when the page can hold it (sorting and search are
      // then done here); else the server orders and searches every run.
      let f = pageQuery(!fresh && !everything());
      let [page, names] = await read(f);
      if (!f.q && text.trim() && page.total > page.rows.length) {
        f = pageQuery(true);
        [page, names] = await read(f);
      }
      runs = page.rows;
      total = page.total;
      loadedQ = f.q;
      metricNames = names;
      flat = new Map(runs.map((r) => [r.id, flatten(r.config)]));
      const paths = new Set();
      for (const m of flat.values()) for (const k of m.keys()) paths.add(k);
      paramPaths = [...paths].sort();
      if (cols === null && runs.length) cols = defaultColumns();
      await loadLatest(f);
      message.replaceChildren();
      projectList.replaceChildren(...[...new Set(runs.map((r) => r.project))].sort().map((p) => h('option', { value: p })));
      if (fresh || !chooser.open) renderChooser();
      refilter();
      if (runs.length) markPainted('runs-table');
      // Each load drawn (a filter's change, a sort by the server): timed by
      // bench/dashboard.
      requestAnimationFrame(() => requestAnimationFrame(() => performance.mark('relaunch:runs-loaded')));
      if (!runs.length) message.replaceChildren(h('p', { class: 'empty' }, 'No runs match. Log one with relaunch.init(project=...) and run.log({...}).'));
    } catch (err) {
      showError(message, err);
    }
    if (alive) timer = setTimeout(() => load(false), REFRESH_MS);
  }

  selectionChanged();
  load(true);
  return {
    dispose() {
      alive = false;
      clearTimeout(timer);
      controller.abort();
      parallel.dispose();
    },
  };
}
