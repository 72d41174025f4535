// Images, videos and histograms logged with relaunch.Image / relaunch.Video
// / relaunch.Histogram: a panel per key with a step slider (the run page's
// media tab), and the same panels with the chosen runs side by side (the
// compare page). What was logged comes from the run's `media` and
// `histogram` events; images and videos are the run's files (an animated
// GIF shows as an image, MP4 and WebM in a video player).

import { api, fileUrl } from './api.js';
import { PALETTE, h } from './util.js';

/** `{key: [{step, ...data}]}` of one kind, each list by step. */
export function byKey(events, kind) {
  const out = new Map();
  for (const e of events) {
    if (e.kind !== kind || !e.data || typeof e.data.key !== 'string') continue;
    if (!out.has(e.data.key)) out.set(e.data.key, []);
    out.get(e.data.key).push({ ...e.data, attempt: e.attempt });
  }
  for (const list of out.values()) list.sort((a, b) => a.step - b.step);
  return out;
}

/** The entry shown at `step`: the last logged at or before it. */
function atStep(list, step) {
  let found = null;
  for (const m of list) {
    if (m.step <= step) found = m;
    else break;
  }
  return found;
}

/**
 * An image or a video; a file just logged may not be uploaded yet, so a
 * failed load is tried again a few times.
 */
function image(run, m) {
  if (!m) return h('p', { class: 'empty' }, 'nothing logged yet at this step');
  const video = m.type === 'video';
  const player = video && m.format !== 'gif';
  let tries = 0;
  const attrs = {
    src: fileUrl(run, m.file), 'data-step': m.step,
    width: m.width || undefined, height: m.height || undefined,
  };
  const el = player
    // Muted, so that the browser lets it play by itself; looped, as a GIF is.
    ? h('video', {
      ...attrs, class: 'media-video', controls: true, loop: true, muted: true, autoplay: true, playsInline: true,
      'aria-label': m.caption || m.key, style: { display: 'block', minWidth: '128px', maxWidth: '480px', height: 'auto' },
    })
    : h('img', { ...attrs, class: video ? 'media-image media-video' : 'media-image', alt: m.caption || m.key });
  el.addEventListener('error', () => {
    if (tries++ < 10) setTimeout(() => { el.src = `${fileUrl(run, m.file)}?try=${tries}`; }, 1000);
  });
  const about = video && m.frames ? ` · ${m.frames} frames at ${m.fps} fps` : '';
  return h('figure', { class: 'media' }, el,
    h('figcaption', {}, m.caption ? `${m.caption} · ` : '', `step ${m.step}${about}`));
}

// More bins than this are drawn as this many bars, each the sum of
// neighbouring bins (the panel is 320 units wide).
const MAX_BARS = 640;

/** `counts` over `edges` as at most MAX_BARS bins: neighbours summed. */
export function rebin(counts, edges) {
  if (counts.length <= MAX_BARS) return { counts, edges };
  const per = Math.ceil(counts.length / MAX_BARS);
  const out = [];
  const outEdges = [edges[0]];
  for (let i = 0; i < counts.length; i += per) {
    let sum = 0;
    const end = Math.min(i + per, counts.length);
    for (let j = i; j < end; j++) sum += counts[j];
    out.push(sum);
    outEdges.push(edges[end]);
  }
  return { counts: out, edges: outEdges };
}

/** A histogram as bars, in SVG. */
function histogram(m, color) {
  if (!m) return h('p', { class: 'empty' }, 'nothing logged yet at this step');
  const W = 320;
  const H = 120;
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  svg.setAttribute('class', 'histogram');
  svg.setAttribute('data-step', m.step);
  svg.setAttribute('data-bins', m.counts.length);
  const { counts, edges } = rebin(m.counts, m.edges);
  // A loop, not Math.max(...counts): that many arguments overflow the stack.
  const top = counts.reduce((a, c) => (c > a ? c : a), 1);
  const lo = edges[0];
  const span = (edges[edges.length - 1] - lo) || 1;
  counts.forEach((c, i) => {
    const x0 = ((edges[i] - lo) / span) * W;
    const x1 = ((edges[i + 1] - lo) / span) * W;
    const bar = document.createElementNS(ns, 'rect');
    bar.setAttribute('x', x0);
    bar.setAttribute('width', Math.max(0.5, x1 - x0 - 0.5));
    bar.setAttribute('y', H - (c / top) * H);
    bar.setAttribute('height', (c / top) * H);
    bar.setAttribute('fill', color || PALETTE[0]);
    svg.append(bar);
  });
  const range = edges.length ? `${edges[0].toPrecision(3)} … ${edges[edges.length - 1].toPrecision(3)}` : 'no finite values';
  return h('figure', { class: 'media' }, svg,
    h('figcaption', {}, `step ${m.step} · ${range}${m.nonfinite ? ` · ${m.nonfinite} not finite` : ''}`));
}

/**
 * A panel for one key: its name, a step slider over the steps any of the
 * runs logged, and for each run what it logged at the chosen step.
 */
function panel(key, kind, perRun, onStep) {
  const steps = [...new Set(perRun.flatMap(({ list }) => list.map((m) => m.step)))].sort((a, b) => a - b);
  const body = h('div', { class: 'media-row' });
  const label = h('output', {});
  const slider = h('input', {
    type: 'range', min: 0, max: Math.max(0, steps.length - 1), step: 1, value: steps.length - 1,
    'aria-label': `${key} step`, name: `step-${key}`,
  });
  function show() {
    const step = steps[Number(slider.value)];
    label.textContent = `step ${step}`;
    body.replaceChildren(...perRun.map(({ run, name, color, list }) => {
      const m = atStep(list, step);
      const shown = kind === 'media' ? image(run, m) : histogram(m, color);
      return perRun.length > 1
        ? h('div', { class: 'media-run', 'data-run': run }, h('div', { class: 'media-run-name' },
          h('span', { class: 'swatch', style: { background: color } }), name), shown)
        : shown;
    }));
    if (onStep) onStep(step);
  }
  slider.addEventListener('input', show);
  show();
  return {
    el: h('section', { class: 'media-panel', 'data-key': key, 'data-kind': kind },
      h('h3', {}, key), h('div', { class: 'bar' }, h('label', {}, 'step ', slider, ' ', label)), body),
    steps,
  };
}

/** The run page's media tab. */
export function mediaView(root, ctx) {
  const out = h('div', { class: 'media-panels' });
  root.append(out);
  let signature = '';
  function render() {
    const images = byKey(ctx.events, 'media');
    const hists = byKey(ctx.events, 'histogram');
    const sig = [...images.values(), ...hists.values()].map((l) => l.length).join(',') + [...images.keys(), ...hists.keys()].join('|');
    if (sig === signature) return;
    signature = sig;
    if (!images.size && !hists.size) {
      out.replaceChildren(h('p', { class: 'empty' }, 'No images, videos or histograms. run.log({"samples": relaunch.Image(array)}) logs one.'));
      return;
    }
    const panels = [];
    for (const [key, list] of images) panels.push(panel(key, 'media', [{ run: ctx.id, list }]).el);
    for (const [key, list] of hists) panels.push(panel(key, 'histogram', [{ run: ctx.id, list }]).el);
    out.replaceChildren(...panels);
  }
  render();
  return { refresh: render };
}

/** The compare page's images, videos and histograms, the runs side by side. */
export async function compareMedia(root, runs, signal) {
  const events = await Promise.all(runs.map((r) => api(`/runs/${encodeURIComponent(r.id)}/events`, { signal })));
  const perKind = (kind) => {
    const keys = new Map();
    runs.forEach((r, i) => {
      for (const [key, list] of byKey(events[i], kind)) {
        if (!keys.has(key)) keys.set(key, []);
        keys.get(key).push({ run: r.id, name: r.name || r.id, color: PALETTE[i % PALETTE.length], list });
      }
    });
    return keys;
  };
  const panels = [];
  for (const kind of ['media', 'histogram']) {
    for (const [key, perRun] of perKind(kind)) panels.push(panel(key, kind, perRun).el);
  }
  root.replaceChildren(...(panels.length ? [h('h3', {}, 'Images, videos and histograms'), ...panels] : []));
}
