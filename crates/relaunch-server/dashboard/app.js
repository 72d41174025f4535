// The dashboard's entry: routes the URL to a page. Page routes are paths
// (`/`, `/runs/ID`, `/compare`); each page keeps its state in the query
// string, so any view is a link. Links within the dashboard navigate
// without reloading.

import { runsPage } from './runs.js';
import { runPage } from './run.js';
import { comparePage } from './compare.js';
import { h } from './util.js';

const ROUTES = [
  [/^\/$/, () => runsPage],
  [/^\/runs\/([^/]+)\/?$/, () => runPage],
  [/^\/compare\/?$/, () => comparePage],
];

let current = null;

function route() {
  if (current && current.dispose) current.dispose();
  current = null;
  const main = document.getElementById('app');
  main.replaceChildren();
  document.getElementById('crumbs').replaceChildren();
  for (const [pattern, page] of ROUTES) {
    const m = location.pathname.match(pattern);
    if (m) {
      current = page()(main, ...m.slice(1).map(decodeURIComponent));
      return;
    }
  }
  main.append(h('p', { class: 'error' }, `No page at ${location.pathname}. `, h('a', { href: '/' }, 'All runs')));
}

/** Goes to `url` within the dashboard. */
export function navigate(url) {
  history.pushState(null, '', url);
  route();
}

document.addEventListener('click', (e) => {
  if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const a = e.target.closest('a[href]');
  if (!a || a.target || a.hasAttribute('download')) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || url.pathname.startsWith('/api/') || url.pathname.startsWith('/assets/')) return;
  e.preventDefault();
  if (url.href !== location.href) navigate(url.pathname + url.search);
});

window.addEventListener('popstate', route);
window.addEventListener('unhandledrejection', (e) => {
  if (e.reason && e.reason.name === 'AbortError') e.preventDefault();
});
route();
