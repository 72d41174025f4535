// A run's goodput on its page: a bar per attempt on the run's time line,
// split into start-up, productive, re-run, stop and restart time, a legend
// with each one's total, and the numbers (goodput, steps re-run, time lost
// per interruption), from GET /runs/{id}/goodput, refreshed with the page.

import { api } from './api.js';
import { fmtTime, h, query, setQuery, showError } from './util.js';

/** The segments of an attempt's bar, in the order they happen. */
export const SEGMENTS = [
  { field: 'startup_s', name: 'start-up' },
  { field: 'productive_s', name: 'productive' },
  { field: 'rerun_s', name: 're-run' },
  { field: 'stop_s', name: 'stop' },
  { field: 'restart_s', name: 'restart' },
];

/** Seconds for a person: `1h 02m`, `3m 04s`, `12.3s`, `0.25s`. */
export function fmtDuration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return '–';
  if (s >= 3600) return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
  if (s >= 60) return `${Math.floor(s / 60)}m ${String(Math.floor(s % 60)).padStart(2, '0')}s`;
  if (s >= 10) return `${s.toFixed(1)}s`;
  return `${Number(s.toPrecision(2))}s`;
}

/** Goodput (0 to 1, or null: unknown) as a percentage. */
export function fmtGoodput(g) {
  return g === null || g === undefined ? 'unknown' : `${(g * 100).toFixed(1)}%`;
}

const slug = (name) => name.replace(/[^a-z]/g, '');

export function goodputView(root, ctx) {
  const box = h('details', {
    class: 'goodput',
    open: query().get('goodput') !== 'hide',
    ontoggle: () => setQuery({ goodput: box.open ? '' : 'hide' }),
  });
  const summary = h('summary', {}, 'Goodput');
  const out = h('div', { class: 'goodput-body' });
  box.append(summary, out);
  root.append(box);
  let busy = false;

  function attemptLabel(a, launches) {
    const n = a.launch_attempt ?? a.attempt;
    return launches > 1 ? `launch ${a.launch} · attempt ${n}` : `attempt ${n}`;
  }

  function render(g) {
    summary.replaceChildren('Goodput ', h('b', { 'data-field': 'goodput' }, fmtGoodput(g.goodput)),
      h('span', { class: 'goodput-brief' }, ` · wall ${fmtDuration(g.wall_s)}${g.running ? ' (running)' : ''}`));
    if (!g.attempts.length) {
      out.replaceChildren(h('p', { class: 'empty' }, 'No attempts yet.'));
      return;
    }
    const wall = g.wall_s > 0 ? g.wall_s : 1;
    const launches = new Set(g.attempts.map((a) => a.launch)).size;
    const numbers = h('dl', { class: 'meta goodput-numbers' },
      h('dt', {}, 'goodput'), h('dd', { 'data-field': 'goodput' }, fmtGoodput(g.goodput)),
      h('dt', {}, 'productive'), h('dd', { 'data-field': 'productive_s', 'data-seconds': g.productive_s }, fmtDuration(g.productive_s)),
      h('dt', {}, 'wall'), h('dd', { 'data-field': 'wall_s', 'data-seconds': g.wall_s }, fmtDuration(g.wall_s)),
      h('dt', {}, 'steps re-run'), h('dd', { 'data-field': 'steps_re_run' }, g.steps_re_run),
      h('dt', {}, 'interruptions'), h('dd', { 'data-field': 'interruptions' }, g.interruptions.length));
    const legend = h('div', { class: 'goodput-legend' }, SEGMENTS.map((s) => h('span', { class: 'goodput-key' },
      h('span', { class: `swatch seg-${slug(s.name)}` }),
      `${s.name} `, h('span', { 'data-total': s.field }, fmtDuration(g[s.field])))));
    const rows = g.attempts.map((a) => {
      const offset = ((a.start - g.started) / wall) * 100;
      const segments = SEGMENTS.filter((s) => a[s.field] > 0).map((s) => h('span', {
        class: `seg seg-${slug(s.name)}`,
        'data-seg': s.field,
        'data-seconds': a[s.field],
        style: { width: `${(a[s.field] / wall) * 100}%` },
        title: `${s.name}: ${fmtDuration(a[s.field])}`,
      }));
      const steps = a.first_step === null ? 'no step' : `steps ${a.first_step}–${a.last_step}`;
      const note = [steps, a.ended];
      if (a.steps_re_run) note.push(`${a.steps_re_run} re-run`);
      return h('div', { class: 'goodput-row', 'data-attempt': a.attempt },
        h('span', { class: 'goodput-label', title: `${fmtTime(a.start)} to ${fmtTime(a.end)}` }, attemptLabel(a, launches)),
        // Widths and the offset are shares of the run's wall time, so the
        // rows line up as one time line.
        h('div', { class: 'goodput-bar' },
          offset > 0 ? h('span', { class: 'seg-gap', style: { width: `${offset}%` } }) : null, segments),
        h('span', { class: 'goodput-note' }, note.join(' · ')));
    });
    const byAttempt = new Map(g.attempts.map((a) => [a.attempt, a]));
    const lost = g.interruptions.length ? h('table', { class: 'list goodput-lost' },
      h('thead', {}, h('tr', {}, ['after', 'why', 'when', 'steps re-run', 're-run', 'stop', 'restart', 'next start-up', 'lost']
        .map((c) => h('th', {}, c)))),
      h('tbody', {}, g.interruptions.map((i) => h('tr', { 'data-interruption': i.attempt },
        h('td', {}, byAttempt.has(i.attempt) ? attemptLabel(byAttempt.get(i.attempt), launches) : i.attempt),
        h('td', {}, i.reason),
        h('td', {}, fmtTime(i.at)),
        h('td', { class: 'num', 'data-field': 'steps_re_run' }, i.steps_re_run),
        ...['rerun_s', 'stop_s', 'restart_s', 'startup_s', 'lost_s'].map((f) => h('td', {
          class: 'num', 'data-field': f, 'data-seconds': i[f],
        }, fmtDuration(i[f]))))))) : null;
    const unknown = g.goodput === null
      ? h('p', { class: 'empty' }, 'No step logged: goodput is unknown until run.log(..., step=...) records one.')
      : null;
    out.replaceChildren(...[numbers, unknown, legend, h('div', { class: 'goodput-rows' }, rows), lost].filter(Boolean));
  }

  async function load() {
    if (busy) return;
    busy = true;
    try {
      render(await api(`/runs/${encodeURIComponent(ctx.id)}/goodput`, { signal: ctx.signal }));
    } catch (err) {
      showError(out, err);
    } finally {
      busy = false;
    }
  }

  load();
  return { refresh: load };
}
