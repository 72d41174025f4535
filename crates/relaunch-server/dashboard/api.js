// Calls to /api/v1. The pages are open; the API may need a token: on a 401
// the page asks for it once (a dialog), keeps it in localStorage (this
// origin's alone) and sends it as `Authorization: Bearer` from then on. With
// it the page asks the server for its read cookie (`POST /session`: HttpOnly,
// SameSite=Strict, path /api/v1, derived from the token, reads only), so
// that download links stream straight to disk; the token itself is never in
// a cookie, which every port of the host would get.

const TOKEN_KEY = 'relaunch.token';
export const API = '/api/v1';

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

let asking = null;

function token() {
  try { return localStorage.getItem(TOKEN_KEY); } catch { return null; }
}

/** Has the server set its read cookie for downloads, made with `value`. */
function openSession(value) {
  return fetch(`${API}/session`, { method: 'POST', headers: { Authorization: `Bearer ${value}` } })
    .catch(() => {});
}

// A token kept from an earlier visit: its session too, before any answer
// (and so any download link) is shown.
let session = token() ? openSession(token()) : Promise.resolve();

/** Asks the person for the token; concurrent 401s share one question. */
function askToken(why) {
  if (asking) return asking;
  const dialog = document.getElementById('token-dialog');
  const input = document.getElementById('token-input');
  document.getElementById('token-why').textContent = why;
  input.value = '';
  asking = new Promise((resolve) => {
    dialog.addEventListener('close', () => {
      const value = input.value.trim();
      if (value) {
        localStorage.setItem(TOKEN_KEY, value);
        session = openSession(value);
      }
      asking = null;
      session.then(() => resolve(Boolean(value)));
    }, { once: true });
  });
  dialog.showModal();
  return asking;
}

export function authHeaders() {
  const t = token();
  return t ? { Authorization: `Bearer ${t}` } : {};
}

async function errorText(res) {
  try {
    const body = await res.json();
    return body.error || `${res.status} ${res.statusText}`;
  } catch {
    return `${res.status} ${res.statusText}`;
  }
}

/** GETs (or sends) `path` under /api/v1 and returns the JSON answer. */
export async function api(path, options = {}) {
  return (await respond(path, options)).json();
}

/**
 * GETs a listing under /api/v1: its rows, and how many the filter selects
 * in all (the server's `X-Total-Count`, else the rows').
 */
export async function apiPage(path, options = {}) {
  const res = await respond(path, options);
  const rows = await res.json();
  const total = Number(res.headers.get('X-Total-Count'));
  return { rows, total: Number.isFinite(total) && res.headers.has('X-Total-Count') ? total : rows.length };
}

async function respond(path, { signal, method = 'GET', body } = {}) {
  await session;
  for (let tries = 0; ; tries++) {
    const res = await fetch(API + path, {
      method, signal, body,
      headers: { ...authHeaders(), ...(body ? { 'Content-Type': 'application/json' } : {}) },
    });
    if (res.status === 401 && tries < 5) {
      const why = await errorText(res);
      if (!(await askToken(token() ? `That token was refused (${why}).` : 'This server needs a token (its --token or RELAUNCH_SERVER_TOKEN).'))) {
        throw new ApiError(401, why);
      }
      continue;
    }
    if (!res.ok) throw new ApiError(res.status, await errorText(res));
    return res;
  }
}

/** A query string from a map; arrays repeat the name, empty values are left out. */
export function qs(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
    else if (v !== null && v !== undefined && v !== '') q.set(k, v);
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

export function fileUrl(run, name) {
  return `${API}/runs/${encodeURIComponent(run)}/files/${name.split('/').map(encodeURIComponent).join('/')}`;
}
