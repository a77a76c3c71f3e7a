// Writes one /v1/cache/stats snapshot into the page. Every number lands in an element with a
// data-stat key (a dotted path into the stats JSON, or a derived name such as cost.relative);
// the raw value goes into data-value and the formatted text into the element.
import {
  fmtInt, fmtPct, fmtMs, fmtSeconds, fmtUsd, fmtRate, fmtBytes, tokenSplit, cacheCost,
  prefillSavedSeconds, historyPoints, escapeHtml,
} from './format.js';
import { chartWindow, drawHitChart, drawReasonChart, drawSparkline, REASON_ORDER } from './charts.js';

const HISTORY_WINDOW_S = 600;   // the server keeps ten minutes of per-second samples

// A null/undefined value shows `missing` ('n/a': not measurable here; '—': no samples yet).
function setStat(root, key, value, format, missing = 'n/a') {
  for (const el of root.querySelectorAll(`[data-stat="${key}"]`)) {
    if (value === null || value === undefined) {
      el.dataset.value = '';
      el.textContent = missing;
    } else {
      el.dataset.value = String(value);
      el.textContent = format(value);
    }
  }
}

function setWidths(container, parts) {
  const total = Object.values(parts).reduce((a, b) => a + b, 0);
  for (const [name, value] of Object.entries(parts)) {
    const seg = container.querySelector(`.seg.${name}`) || container.querySelector(`#split-${name}`);
    if (seg) seg.style.width = total > 0 ? `${(100 * value) / total}%` : '0%';
  }
}

function renderHeader(doc, stats) {
  const scope = doc.getElementById('scope');
  const tenant = stats.tenant || null;
  scope.dataset.value = tenant ? `tenant:${tenant}` : 'server';
  scope.textContent = tenant ? `tenant ${tenant}` : 'all tenants';
  scope.classList.toggle('tenant', !!tenant);
  doc.body.classList.toggle('tenant-scope', !!tenant);
  setStat(doc, 'model', stats.model, String);
  setStat(doc, 'block_size', stats.block_size, fmtInt);
  setStat(doc, 'uptime_s', stats.uptime_s, fmtSeconds);
}

function renderTokens(doc, stats, basePrice) {
  const t = stats.tokens || {};
  const split = tokenSplit(t);
  setStat(doc, 'hit_rate', stats.hit_rate, fmtPct);
  for (const key of ['prompt', 'cache_read', 'cache_creation', 'uncached', 'output']) {
    setStat(doc, `tokens.${key}`, t[key] ?? 0, fmtInt);
  }
  setStat(doc, 'tokens.computed', split.computed, fmtInt);
  setStat(doc, 'tokens.cache_creation_1h', t.cache_creation_1h ?? null, fmtInt);   // optional key
  setWidths(doc.querySelector('.split'), { read: split.read, computed: split.computed });
  setStat(doc, 'prefill_tokens_per_s', stats.prefill_tokens_per_s > 0 ? stats.prefill_tokens_per_s : null, fmtRate);
  setStat(doc, 'prefill_saved_s', prefillSavedSeconds(stats), fmtSeconds);
  const cost = cacheCost(t, basePrice);
  setStat(doc, 'cost.relative', cost.relative, fmtPct);
  setStat(doc, 'cost.with_cache_usd', cost.withCache, fmtUsd);
  setStat(doc, 'cost.without_cache_usd', cost.withoutCache, fmtUsd);
  setStat(doc, 'cost.saved_usd', cost.saved, fmtUsd);
}

function renderGroups(doc, stats) {
  const groups = {
    blocks: ['total', 'free', 'cached', 'pinned', 'in_use'],
    tree: ['nodes', 'cached_tokens', 'evictable_tokens', 'pinned_tokens'],
    requests: ['running', 'waiting', 'finished', 'errors'],
    evictions: ['lru', 'ttl', 'flush'],
  };
  for (const [group, keys] of Object.entries(groups)) {
    for (const key of keys) setStat(doc, `${group}.${key}`, (stats[group] || {})[key] ?? 0, fmtInt);
  }
  const b = stats.blocks || {};
  setWidths(doc.getElementById('block-bar'), {
    in_use: b.in_use || 0, pinned: b.pinned || 0, cached: b.cached || 0, free: b.free || 0,
  });
  for (const kind of ['hit', 'miss']) {
    for (const q of ['p50', 'p95']) {
      const v = ((stats.ttft_ms || {})[kind] || {})[q];
      setStat(doc, `ttft_ms.${kind}.${q}`, typeof v === 'number' ? v : null, fmtMs, '—');
    }
  }
}

function tenantRow(name, info) {
  const tokens = info.tokens || {};
  const rate = info.hit_rate ?? 0;
  const cell = (key, value, text, cls = 'num') => (
    `<td class="${cls}" data-stat="${key}" data-value="${value}">${text}</td>`);
  return `<tr data-tenant="${escapeHtml(name)}">`
    + `<th class="tenant-name">${escapeHtml(name)}</th>`
    + `<td data-stat="hit_rate" data-value="${rate}"><span class="meter"><i></i></span>`
    + `<span class="meter-text">${fmtPct(rate)}</span></td>`
    + cell('tokens.prompt', tokens.prompt ?? 0, fmtInt(tokens.prompt ?? 0))
    + cell('tokens.cache_read', tokens.cache_read ?? 0, fmtInt(tokens.cache_read ?? 0))
    + cell('pinned_tokens', info.pinned_tokens ?? 0, fmtInt(info.pinned_tokens ?? 0))
    + cell('running', info.running ?? 0, fmtInt(info.running ?? 0))
    + cell('waiting', info.waiting ?? 0, fmtInt(info.waiting ?? 0))
    + '<td><svg class="sparkline" preserveAspectRatio="none"></svg></td></tr>';
}

// Meter widths are set through the CSSOM: the CSP forbids inline style attributes.
function applyMeterWidths(tbody) {
  for (const td of tbody.querySelectorAll('td[data-stat="hit_rate"]')) {
    td.querySelector('.meter i').style.width = `${(100 * Number(td.dataset.value)).toFixed(1)}%`;
  }
}

function renderTenants(doc, stats, tenantHistory) {
  const tbody = doc.querySelector('#tenants tbody');
  const names = Object.keys(stats.tenants || {}).sort();
  tbody.innerHTML = names.length
    ? names.map((n) => tenantRow(n, stats.tenants[n])).join('')
    : '<tr class="empty-row"><td colspan="8">No tenant traffic yet.</td></tr>';
  applyMeterWidths(tbody);
  for (const name of names) {
    const row = tbody.querySelector(`tr[data-tenant="${CSS.escape(name)}"]`);
    const info = stats.tenants[name];
    const points = info.history ? historyPoints(info.history).filter((p) => p.rate !== null)
      : tenantHistory(name);
    drawSparkline(row.querySelector('svg'), points);
  }
}

// Scale-out: one row per engine replica (the card stays hidden with one engine).
function replicaRow(r) {
  const blocks = r.blocks || {};
  const rate = r.hit_rate ?? 0;
  const cell = (key, value) => `<td class="num" data-stat="replica.${key}" data-value="${value ?? 0}">${fmtInt(value ?? 0)}</td>`;
  return `<tr data-replica="${escapeHtml(r.replica)}"><th>${escapeHtml(r.replica)}</th>`
    + `<td data-stat="replica.hit_rate" data-value="${rate}"><span class="meter"><i></i></span>`
    + `<span class="meter-text">${fmtPct(rate)}</span></td>`
    + cell('blocks.cached', blocks.cached) + cell('blocks.in_use', blocks.in_use)
    + cell('blocks.free', blocks.free) + cell('running', r.running)
    + cell('waiting', r.waiting) + '</tr>';
}

function renderReplicas(doc, stats) {
  const replicas = stats.replicas || [];
  doc.getElementById('replicas-card').hidden = replicas.length === 0;
  const tbody = doc.querySelector('#replicas tbody');
  tbody.innerHTML = replicas.map(replicaRow).join('');
  for (const td of tbody.querySelectorAll('td[data-stat="replica.hit_rate"]')) {
    td.querySelector('.meter i').style.width = `${(100 * Number(td.dataset.value)).toFixed(1)}%`;
  }
}

// Preview text with the chat template's special tokens (<|im_start|> ...) dimmed.
function previewHtml(text) {
  return text.split(/(<\|[^|<>]{1,40}\|>)/).map((part, i) => (
    i % 2 ? `<span class="special">${escapeHtml(part)}</span>` : escapeHtml(part))).join('');
}

function prefixRow(p, i, showPreview) {
  const length = typeof p.tokens === 'number' ? p.tokens : (p.length ?? 0);
  const ttl = typeof p.pin_ttl_s === 'number' && p.pin_ttl_s > 0 ? p.pin_ttl_s : 0;
  const preview = showPreview
    ? `<td class="preview" data-stat="preview" title="${escapeHtml(p.preview || '')}">${previewHtml(p.preview || '')}</td>` : '';
  return `<tr data-prefix-index="${i}">`
    + `<td class="rank">${i + 1}</td>`
    + `<td class="tenant-col" data-stat="tenant" data-value="${escapeHtml(p.tenant ?? '')}">${escapeHtml(p.tenant ?? '')}</td>`
    + `<td class="num" data-stat="tokens" data-value="${length}">${fmtInt(length)}</td>`
    + `<td class="num" data-stat="hits" data-value="${p.hits ?? 0}">${fmtInt(p.hits ?? 0)}</td>`
    + `<td class="num" data-stat="pin_ttl_s" data-value="${ttl}">${ttl > 0 ? fmtSeconds(ttl) : '—'}</td>`
    + preview + '</tr>';
}

function renderPrefixes(doc, stats) {
  const prefixes = stats.top_prefixes || [];
  const showPreview = prefixes.some((p) => typeof p.preview === 'string');
  doc.body.classList.toggle('no-preview', !showPreview);
  const tbody = doc.querySelector('#prefixes tbody');
  tbody.innerHTML = prefixes.length
    ? prefixes.map((p, i) => prefixRow(p, i, showPreview)).join('')
    : '<tr class="empty-row"><td colspan="6">No cached prefixes yet.</td></tr>';
}

function renderChart(doc, stats) {
  const points = historyPoints(stats.history);
  const now = stats.uptime_s ?? (points.length ? points[points.length - 1].t : 0);
  const svg = doc.getElementById('hit-chart');
  const rated = drawHitChart(svg, points, now, HISTORY_WINDOW_S);
  const { tMin, tMax } = chartWindow(points, now, HISTORY_WINDOW_S);
  svg.dataset.samples = String(points.filter((p) => p.t >= tMin).length);
  doc.getElementById('chart-empty').hidden = rated > 0;
  doc.getElementById('chart-window').textContent = `last ${fmtSeconds(tMax - tMin)}`;
}

// Memory and the disk tier side by side; without a disk tier its figures read "n/a".
function renderTiers(doc, stats) {
  const tiers = stats.tiers || {};
  const memory = tiers.memory || {};
  const disk = tiers.disk || {};
  const on = !!disk.enabled;
  setStat(doc, 'tiers.memory.blocks', memory.blocks ?? 0, fmtInt);
  setStat(doc, 'tiers.memory.bytes', memory.bytes ?? 0, fmtBytes);
  setStat(doc, 'tiers.memory.hit_tokens', memory.hit_tokens ?? 0, fmtInt);
  for (const key of ['blocks', 'hit_tokens', 'loads', 'writes']) {
    setStat(doc, `tiers.disk.${key}`, on ? disk[key] ?? 0 : null, fmtInt);
  }
  const dropped = Object.values(disk.drops || {}).reduce((a, b) => a + b, 0);
  setStat(doc, 'tiers.disk.dropped', on ? dropped : null, fmtInt);
  for (const key of ['bytes', 'budget_bytes']) setStat(doc, `tiers.disk.${key}`, on ? disk[key] ?? 0 : null, fmtBytes);
  setStat(doc, 'tiers.disk.load_gb_per_s', on ? disk.load_gb_per_s : null, (v) => `${v.toFixed(2)} GB/s`);
  setStat(doc, 'tiers.disk.full', on ? (disk.full ? 'yes' : 'no') : null, String);
}

// Speculative decoding: drafted and kept tokens, the acceptance and tokens per verify step.
function renderSpec(doc, stats) {
  const spec = stats.spec || {};
  setStat(doc, 'spec.drafted', spec.drafted ?? 0, fmtInt);
  setStat(doc, 'spec.accepted', spec.accepted ?? 0, fmtInt);
  setStat(doc, 'spec.acceptance_rate', spec.drafted ? spec.acceptance_rate : null,
          (v) => `${(100 * v).toFixed(1)}%`);
  setStat(doc, 'spec.tokens_per_step', spec.verify_steps ? spec.tokens_per_step : null,
          (v) => v.toFixed(2));
}

// Why prompts read what they read, per minute (the caller's tenant; admin: everyone).
const REASON_LABELS = {
  hit: 'read whole', new_content: 'new content', expired: 'pin expired',
  evicted: 'evicted', first: 'first of its kind',
};

function renderReasons(doc, stats) {
  const minutes = stats.miss_reasons || [];
  doc.getElementById('reason-empty').hidden = minutes.length > 0;
  drawReasonChart(doc.getElementById('reason-chart'), minutes);
  const totals = REASON_ORDER.map((r) => [r, minutes.reduce((s, m) => s + (m[r] || 0), 0)]);
  doc.getElementById('reason-legend').innerHTML = totals.map(([r, n]) =>
    `<span class="key ${r}" data-reason-total="${r}" data-value="${n}"><i></i>`
    + `${REASON_LABELS[r]} <b>${fmtInt(n)}</b></span>`).join(' ');
}

function cacheRow(c) {
  const name = c.display_name ? `${c.display_name} (${c.name})` : c.name;
  return `<tr data-cache="${escapeHtml(c.name)}"><th>${escapeHtml(name)}</th>`
    + `<td class="num">${fmtInt(c.tokens)}</td><td class="num">${fmtInt(c.expires_in_s)} s</td></tr>`;
}

function renderCaches(doc, stats) {
  doc.querySelector('#explicit-caches tbody').innerHTML =
    (stats.explicit_caches || []).map(cacheRow).join('');
}

// Render a snapshot. ctx: {basePrice: $/MTok, tenantHistory: name -> [{t, rate}]}.
export function renderStats(doc, stats, ctx) {
  renderHeader(doc, stats);
  renderTokens(doc, stats, ctx.basePrice);
  renderGroups(doc, stats);
  renderTiers(doc, stats);
  renderSpec(doc, stats);
  renderTenants(doc, stats, ctx.tenantHistory);
  renderReplicas(doc, stats);
  renderPrefixes(doc, stats);
  renderChart(doc, stats);
  renderReasons(doc, stats);
  renderCaches(doc, stats);
}
