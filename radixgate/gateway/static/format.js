// Pure helpers: number formatting and the figures derived from one /v1/cache/stats snapshot.
// No DOM access here, so every derived number has one definition the page and tests share.

// Anthropic-style prompt-caching prices as multiples of the base input price.
export const PRICE = { read: 0.1, write5m: 1.25, write1h: 2.0, input: 1.0 };

export function fmtInt(n) {
  return Math.round(n).toLocaleString('en-US');
}

export function fmtPct(ratio) {
  return (100 * ratio).toFixed(1) + '%';
}

export function fmtMs(ms) {
  return ms < 100 ? ms.toFixed(1) + ' ms' : fmtInt(ms) + ' ms';
}

// Seconds as "0.42 s", "12.5 s", "3m 05s", "2h 03m" (rounded to the last shown unit).
export function fmtSeconds(s) {
  if (s < 9.995) return s.toFixed(2) + ' s';
  if (s < 59.95) return s.toFixed(1) + ' s';
  if (s < 3599.5) {
    const whole = Math.round(s);
    return `${Math.floor(whole / 60)}m ${String(whole % 60).padStart(2, '0')}s`;
  }
  const minutes = Math.round(s / 60);
  return `${Math.floor(minutes / 60)}h ${String(minutes % 60).padStart(2, '0')}m`;
}

// Dollars with enough digits to show small amounts: "$12.34", "$0.0123", "$0.000042".
export function fmtUsd(x) {
  const a = Math.abs(x);
  if (a >= 1 || a === 0) return (x < 0 ? '-$' : '$') + a.toFixed(2);
  const digits = Math.min(8, Math.max(4, 2 - Math.floor(Math.log10(a))));  // 3 significant
  return (x < 0 ? '-$' : '$') + a.toFixed(digits);
}

// Bytes in binary units: "512 B", "3.4 MiB", "1.25 GiB".
export function fmtBytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return unit === 0 ? `${Math.round(value)} B` : `${value.toFixed(value < 10 ? 2 : 1)} ${units[unit]}`;
}

export function fmtRate(tokensPerS) {
  return fmtInt(tokensPerS) + ' tok/s';
}

// Prompt tokens of a `tokens` object split by how they were paid for.
// prompt = cache_read + cache_creation + uncached; cache_creation_1h (optional) is the part
// of cache_creation written with a 1-hour TTL, the rest counts as 5-minute writes.
export function tokenSplit(tokens) {
  const prompt = tokens.prompt || 0;
  const read = tokens.cache_read || 0;
  const creation = tokens.cache_creation || 0;
  const write1h = Math.min(tokens.cache_creation_1h || 0, creation);
  return {
    prompt, read, computed: prompt - read,
    write5m: creation - write1h, write1h,
    plain: Math.max(0, prompt - read - creation),
  };
}

// What the prompt tokens cost with prompt caching vs without it, at `basePerMTok` dollars
// per million input tokens. relative = with / without (null without prompt traffic).
export function cacheCost(tokens, basePerMTok) {
  const s = tokenSplit(tokens);
  const units = s.read * PRICE.read + s.write5m * PRICE.write5m + s.write1h * PRICE.write1h
    + s.plain * PRICE.input;
  const withCache = units * basePerMTok / 1e6;
  const withoutCache = s.prompt * PRICE.input * basePerMTok / 1e6;
  return {
    withCache, withoutCache, saved: withoutCache - withCache,
    relative: s.prompt > 0 ? units / s.prompt : null,
  };
}

// Seconds of prefill the cache saved: cache_read tokens at the measured prefill rate.
// null when the server has not measured a rate.
export function prefillSavedSeconds(stats) {
  const rate = stats.prefill_tokens_per_s;
  if (!(rate > 0)) return null;
  return (stats.tokens.cache_read || 0) / rate;
}

// History samples -> chart points. Each sample counts the prompt and cache_read tokens of
// the requests it covers; a sample without prompt tokens has no hit rate (rate null).
export function historyPoints(history) {
  return (history || []).map((h) => ({
    t: h.t,
    prompt: h.prompt || 0,
    read: h.cache_read || 0,
    rate: h.prompt > 0 ? h.cache_read / h.prompt : null,
  }));
}

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => (
    { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
}
