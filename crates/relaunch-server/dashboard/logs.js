// Console lines of a run, every rank, tailed live: the last lines first
// (`?tail=N`), then one long poll (`?after=LAST&wait=20`) that answers as
// soon as lines arrive. Filters by rank and text happen in the page over
// the lines loaded.

import { api, qs } from './api.js';
import { debounce, fmtTime, h, query, setQuery, showError } from './util.js';

/** Lines kept in the page; older ones are dropped (the server keeps all). */
const MAX_LINES = 200000;
/** Lines loaded when the page opens: the newest. */
const FIRST = 50000;
/** Lines drawn at once: the newest that match. */
const MAX_SHOWN = 5000;
const PAGE = 10000;

export function logsView(root, ctx) {
  const q = query();
  let rank = q.get('rank') ?? '';
  let search = q.get('q') || '';
  const lines = [];
  const ranks = new Set();
  let after = 0;
  let dropped = 0;
  let older = false; // lines before the first tail were never loaded
  let alive = true;
  const controller = new AbortController();
  const signal = AbortSignal.any ? AbortSignal.any([controller.signal, ctx.signal]) : controller.signal;

  const rankIn = h('select', { name: 'rank', onchange: () => { rank = rankIn.value; setQuery({ rank }); render(); } });
  const searchIn = h('input', { type: 'search', name: 'q', value: search, placeholder: 'search lines' });
  searchIn.addEventListener('input', debounce(() => { search = searchIn.value; setQuery({ q: search }); render(); }, 100));
  const followIn = h('input', { type: 'checkbox', checked: true, name: 'follow' });
  const count = h('span', { class: 'count' });
  const box = h('div', { class: 'log', tabindex: 0 });
  const message = h('div');
  root.append(h('div', { class: 'bar' }, h('label', {}, 'rank ', rankIn), searchIn, h('label', {}, followIn, ' follow'), h('span', { class: 'spacer' }), count), message, box);

  function renderRanks() {
    const want = ['', ...[...ranks].sort((a, b) => a - b).map(String)];
    if (rankIn.options.length === want.length) return;
    rankIn.replaceChildren(...want.map((r) => h('option', { value: r, selected: r === rank }, r === '' ? 'all' : `rank ${r}`)));
    if (rank !== '' && !ranks.has(Number(rank))) rankIn.append(h('option', { value: rank, selected: true }, `rank ${rank}`));
  }

  const matches = (l) => (rank === '' || l.rank === Number(rank)) && (!search || l.text.toLowerCase().includes(search.toLowerCase()));

  function lineEl(l) {
    let text = [l.text];
    if (search) {
      const lower = l.text.toLowerCase();
      const needle = search.toLowerCase();
      text = [];
      let i = 0;
      for (let j = lower.indexOf(needle); j >= 0; j = lower.indexOf(needle, i)) {
        text.push(l.text.slice(i, j), h('mark', {}, l.text.slice(j, j + needle.length)));
        i = j + needle.length;
      }
      text.push(l.text.slice(i));
    }
    return h('div', { class: `line ${l.stream}`, 'data-id': l.id, title: `${fmtTime(l.wall)} · attempt ${l.attempt} · ${l.stream}` },
      h('span', { class: 'rank' }, `[${l.rank}]`), ' ', text);
  }

  let matching = 0;
  function render() {
    const shown = [];
    matching = 0;
    for (let i = lines.length - 1; i >= 0; i--) {
      if (!matches(lines[i])) continue;
      matching++;
      if (shown.length < MAX_SHOWN) shown.push(lines[i]);
    }
    shown.reverse();
    box.replaceChildren(...shown.map(lineEl));
    updateCount();
    if (followIn.checked) box.scrollTop = box.scrollHeight;
  }

  function append(batch) {
    box.querySelector('.empty')?.remove();
    const add = batch.filter(matches);
    matching += add.length;
    box.append(...add.map(lineEl));
    while (box.childElementCount > MAX_SHOWN) box.firstElementChild.remove();
    updateCount();
    if (followIn.checked && add.length) box.scrollTop = box.scrollHeight;
  }

  function updateCount() {
    const kept = dropped ? ` (${dropped} older not kept here)` : older ? ' (the newest; older ones: relaunch logs RUN)' : '';
    count.textContent = `${matching} of ${lines.length} lines${kept}${matching > MAX_SHOWN ? `; the newest ${MAX_SHOWN} shown` : ''}`;
  }

  async function tail() {
    let caughtUp = false;
    let first = true;
    while (alive) {
      try {
        const opening = first && after === 0;
        const batch = await api(`/runs/${encodeURIComponent(ctx.id)}/logs${qs(opening ? { tail: FIRST } : { after, limit: PAGE, wait: caughtUp ? 20 : 0 })}`, { signal });
        message.replaceChildren();
        // The tail is the newest lines: what follows it is caught up.
        caughtUp = opening || batch.length < PAGE;
        if (opening && batch.length === FIRST) older = true;
        if (batch.length) {
          after = batch[batch.length - 1].id;
          for (const l of batch) { lines.push(l); ranks.add(l.rank); }
          if (lines.length > MAX_LINES) { dropped += lines.length - MAX_LINES; lines.splice(0, lines.length - MAX_LINES); }
          renderRanks();
          if (first) render(); else append(batch);
        } else if (first) {
          renderRanks();
          render();
          if (!lines.length) box.replaceChildren(h('p', { class: 'empty' }, 'No console lines yet. `relaunch run --server URL` ships every rank\'s output.'));
        }
        if (caughtUp) first = false;
      } catch (err) {
        if (!alive || err.name === 'AbortError') return;
        showError(message, err);
        await new Promise((r) => setTimeout(r, 3000));
      }
    }
  }

  tail();
  return {
    dispose() {
      alive = false;
      controller.abort();
    },
  };
}
