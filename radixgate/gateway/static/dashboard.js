// Entry point: the API key prompt and the polling loop over GET /v1/cache/stats.
// The key lives only in this tab's sessionStorage and travels in the x-api-key header;
// it is never put into a URL. Without keys configured (local mode) stats answers without one.
import { renderStats } from './render.js';

const STATS_URL = 'v1/cache/stats';          // relative to /dashboard -> /v1/cache/stats
const KEY_STORAGE = 'radixgate.api_key';
const PRICE_STORAGE = 'radixgate.base_price';
const POLL_MS = 1500;
const TENANT_WINDOW_S = 600;
const DEFAULT_PRICE = 3;

const state = {
  timer: null,
  epoch: 0,                  // bumped when the key changes: late answers for the old key are dropped
  lastStats: null,
  generation: 0,
  tenantSeries: new Map(),   // tenant -> [{t, rate}] measured between polls (client side)
  tenantLast: new Map(),     // tenant -> {t, prompt, read} at the previous poll
};

const $ = (id) => document.getElementById(id);

function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || '';
}

function basePrice() {
  const v = Number($('base-price').value);
  return Number.isFinite(v) && v >= 0 ? v : DEFAULT_PRICE;
}

function setLive(kind, text) {
  $('live').dataset.kind = kind;
  $('live-text').textContent = text;
}

// Per-tenant hit rate between consecutive polls, for the sparklines when the server's
// tenant entries carry no history of their own.
function recordTenantSeries(stats) {
  const now = performance.now() / 1000;
  for (const [name, info] of Object.entries(stats.tenants || {})) {
    const tokens = info.tokens || {};
    const cur = { t: now, prompt: tokens.prompt || 0, read: tokens.cache_read || 0 };
    const last = state.tenantLast.get(name);
    const series = state.tenantSeries.get(name) || [];
    if (last && cur.prompt < last.prompt) series.length = 0;          // counters were reset
    if (last && cur.prompt > last.prompt) {
      series.push({ t: now, rate: (cur.read - last.read) / (cur.prompt - last.prompt) });
    }
    while (series.length && series[0].t < now - TENANT_WINDOW_S) series.shift();
    state.tenantSeries.set(name, series);
    state.tenantLast.set(name, cur);
  }
}

function keyChanged() {
  state.epoch += 1;
  state.lastStats = null;
  state.tenantSeries.clear();
  state.tenantLast.clear();
}

function render() {
  if (!state.lastStats) return;
  renderStats(document, state.lastStats, {
    basePrice: basePrice(),
    tenantHistory: (name) => state.tenantSeries.get(name) || [],
  });
}

function schedule(ms = POLL_MS) {
  clearTimeout(state.timer);
  state.timer = setTimeout(poll, ms);
}

async function poll() {
  if (document.hidden) return schedule();
  const key = apiKey();
  const epoch = state.epoch;
  let resp, stats;
  try {
    resp = await fetch(STATS_URL, {
      headers: key ? { 'x-api-key': key } : {}, cache: 'no-store', credentials: 'omit',
    });
    stats = resp.ok ? await resp.json() : null;
  } catch (err) {
    setLive('offline', 'server unreachable, retrying');
    return schedule(POLL_MS * 2);
  }
  if (epoch !== state.epoch) return;        // the key changed while this request was out
  if (resp.status === 401 || resp.status === 403) {
    setLive('auth', 'API key needed');
    document.body.dataset.state = 'auth';
    return askForKey(key ? 'The server rejected that key. Enter another one.'
      : 'This server needs an API key to show cache statistics.');
  }
  if (!resp.ok) {
    setLive('error', `stats: HTTP ${resp.status}, retrying`);
    return schedule(POLL_MS * 2);
  }
  show(stats);
  schedule();
}

function show(stats) {
  state.lastStats = stats;
  recordTenantSeries(stats);
  try {
    render();
  } catch (err) {
    setLive('error', `cannot show stats: ${err.message}`);
    return;
  }
  state.generation += 1;
  document.body.dataset.generation = String(state.generation);
  document.body.dataset.state = 'live';
  setLive('ok', `live · ${new Date().toLocaleTimeString()}`);
}

function askForKey(reason) {
  clearTimeout(state.timer);
  $('key-reason').textContent = reason;
  $('key-input').value = '';
  const dialog = $('key-dialog');
  if (!dialog.open) dialog.showModal();
  $('key-input').focus();
}

function useKey(event) {
  event.preventDefault();
  const key = $('key-input').value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORAGE, key);
  $('key-input').value = '';
  $('key-dialog').close();
  keyChanged();
  poll();
}

function forgetKey() {
  sessionStorage.removeItem(KEY_STORAGE);
  $('key-dialog').close();
  keyChanged();
  poll();
}

function setupPrice() {
  const input = $('base-price');
  const saved = localStorage.getItem(PRICE_STORAGE);
  if (saved !== null && Number(saved) >= 0) input.value = saved;
  input.addEventListener('input', () => {
    localStorage.setItem(PRICE_STORAGE, String(basePrice()));
    render();
  });
}

function setup() {
  $('key-form').addEventListener('submit', useKey);
  $('key-forget').addEventListener('click', forgetKey);
  $('key-button').addEventListener('click', () => askForKey(
    'Enter an admin key for the whole server, or a tenant key for one tenant.'));
  $('key-dialog').addEventListener('cancel', () => {
    if (document.body.dataset.state === 'auth') return;   // nothing to show without a key
    schedule(0);
  });
  setupPrice();
  let resizeTimer = null;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(render, 100);
  });
  document.addEventListener('visibilitychange', () => { if (!document.hidden) schedule(0); });
  poll();
}

setup();
