// Hand-drawn SVG charts. Markup is built as strings of numbers only (no user text), and set
// with innerHTML on an <svg> element, which parses it as SVG.

// Two panels over one time axis: the hit rate (0..100%) on top, the prompt tokens of each
// sample (from cache / computed, stacked) below with an axis of its own, so no bar can be
// read against the hit-rate scale.
const MARGIN = { left: 52, right: 14, top: 8, bottom: 22 };
const TITLE_H = 16;          // room for a panel's title above it
const PANEL_GAP = 10;        // between the hit-rate panel's 0% line and the tokens panel's title
const TICK_STEPS_S = [5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600];

function r1(x) {
  return Math.round(x * 10) / 10;
}

function tickLabel(secondsAgo) {
  if (secondsAgo === 0) return 'now';
  if (secondsAgo % 60 === 0) return `-${secondsAgo / 60}m`;
  return `-${secondsAgo}s`;
}

function pickTickStep(spanS) {
  return TICK_STEPS_S.find((step) => spanS / step <= 6) || 3600;
}

// The smallest 1, 2 or 5 times a power of ten at or above `value` (at least 1).
export function niceCeiling(value) {
  if (!(value > 1)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((m) => m * power).find((c) => c >= value - 1e-9);
}

function tokenLabel(n) {
  if (n >= 1e6) return `${+(n / 1e6).toFixed(1)}M`;
  if (n >= 1e3) return `${+(n / 1e3).toFixed(1)}k`;
  return String(n);
}

// Size the viewBox to the element's box so text and strokes are not stretched.
function fitViewBox(svg, fallbackW, fallbackH) {
  const w = Math.max(200, Math.round(svg.clientWidth || fallbackW));
  const h = Math.max(160, Math.round(svg.clientHeight || fallbackH));
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  return { w, h };
}

// Vertical gridlines at round "seconds ago" marks through each panel; labels under the last.
function timeAxis(tMin, tMax, x, panels, labelY) {
  const step = pickTickStep(tMax - tMin);
  let out = '';
  for (let ago = 0; tMax - ago >= tMin - 1e-9; ago += step) {
    const xi = r1(x(tMax - ago));
    for (const [top, bottom] of panels) {
      out += `<line class="grid" x1="${xi}" x2="${xi}" y1="${r1(top)}" y2="${r1(bottom)}"/>`;
    }
    out += `<text class="axis" x="${xi}" y="${r1(labelY)}" text-anchor="middle">${tickLabel(ago)}</text>`;
  }
  return out;
}

function panelTitle(x0, yTop, text, id) {
  return `<text class="axis-title" id="${id}" x="${x0}" y="${r1(yTop - 5)}">${text}</text>`;
}

function rateAxis(x0, x1, y) {
  let out = '';
  for (const pct of [0, 25, 50, 75, 100]) {
    const yi = r1(y(pct / 100));
    out += `<line class="grid${pct % 50 ? ' faint' : ''}" data-pct="${pct}" x1="${x0}" x2="${x1}" y1="${yi}" y2="${yi}"/>`;
    if (pct % 50 === 0) out += `<text class="axis" data-pct-label="${pct}" x="${x0 - 6}" y="${yi + 4}" text-anchor="end">${pct}%</text>`;
  }
  return out;
}

// Gridlines at 0, half and the top of the tokens axis, each labelled; the 0 line is solid.
function tokenAxis(x0, x1, yTokens, top) {
  let out = '';
  for (const value of [0, top / 2, top]) {
    const yi = r1(yTokens(value));
    const cls = value === 0 ? 'baseline' : 'grid faint';
    out += `<line class="${cls}" data-tokens="${value}" x1="${x0}" x2="${x1}" y1="${yi}" y2="${yi}"/>`;
    out += `<text class="axis" data-tokens-label="${value}" x="${x0 - 6}" y="${yi + 4}" text-anchor="end">${tokenLabel(value)}</text>`;
  }
  return out;
}

// One stacked bar per sample with prompt tokens: the computed part over the part from cache.
function tokenBars(points, x, yTokens, barW) {
  let out = '';
  for (const p of points) {
    if (p.prompt <= 0) continue;
    const xi = r1(x(p.t) - barW / 2);
    const yAll = yTokens(p.prompt), yRead = yTokens(p.read), yZero = yTokens(0);
    out += `<g class="bar-pair" data-t="${p.t}">`
      + `<rect class="bar computed" x="${xi}" y="${r1(yAll)}" width="${r1(barW)}" height="${r1(yRead - yAll)}"/>`
      + `<rect class="bar read" x="${xi}" y="${r1(yRead)}" width="${r1(barW)}" height="${r1(yZero - yRead)}"/>`
      + `<title>${p.prompt} prompt tokens: ${p.read} from cache, ${p.prompt - p.read} computed</title></g>`;
  }
  return out;
}

// Samples further apart than this are not joined: seconds without requests have no hit
// rate, so the line breaks there (a gap) instead of bridging the quiet time or dropping
// to 0%.
export const GAP_S = 10;

// Rated points -> runs of samples at most GAP_S apart, oldest first.
export function rateRuns(points, gapS = GAP_S) {
  const runs = [];
  points.forEach((p, i) => {
    if (!i || p.t - points[i - 1].t > gapS) runs.push([]);
    runs[runs.length - 1].push(p);
  });
  return runs;
}

// One subpath per run (each starts with M): the gaps between runs are not drawn.
export function ratePath(points, x, y) {
  return rateRuns(points).map((run) => run.map(
    (p, i) => `${i ? 'L' : 'M'}${r1(x(p.t))},${r1(y(p.rate))}`).join(' ')).join(' ');
}

function runArea(run, x, y) {
  const first = run[0], last = run[run.length - 1];
  return `${ratePath(run, x, y)} L${r1(x(last.t))},${r1(y(0))} L${r1(x(first.t))},${r1(y(0))} Z`;
}

function rateLine(rated, x, y, tMax) {
  const d = ratePath(rated, x, y);
  const last = rated[rated.length - 1];
  const area = rateRuns(rated).map((run) => runArea(run, x, y)).join(' ');
  let out = `<path class="rate-area" d="${area}"/>`;
  out += `<path class="rate-line" id="hit-line" data-points="${rated.length}" d="${d}"/>`;
  // every sample a dot while there are few; else only the lone ones (a run of one has no line)
  const dotted = rated.length <= 120 ? rated
    : rateRuns(rated).filter((run) => run.length === 1).flat();
  out += dotted.map((p) => `<circle class="rate-dot" cx="${r1(x(p.t))}" cy="${r1(y(p.rate))}" r="2.2">`
    + `<title>${Math.round(tMax - p.t)} s ago: ${(100 * p.rate).toFixed(1)}% of ${p.prompt} prompt tokens</title></circle>`).join('');
  out += `<circle class="rate-last" cx="${r1(x(last.t))}" cy="${r1(y(last.rate))}" r="4"/>`;
  return out;
}

// The time window a chart shows: ends at `now`, at least a minute, at most `maxSpanS`.
export function chartWindow(points, now, maxSpanS) {
  const tMax = Math.max(now, points.length ? points[points.length - 1].t : now);
  const first = points.length ? points[0].t : tMax;
  return { tMin: Math.max(tMax - maxSpanS, Math.min(first, tMax - 60)), tMax };
}

// Where the two panels sit in an svg of height h: [top, bottom] of each plot area.
function panelLayout(h) {
  const plot = h - MARGIN.top - MARGIN.bottom - 2 * TITLE_H - PANEL_GAP;
  const rateTop = MARGIN.top + TITLE_H;
  const rateBottom = rateTop + plot * 0.62;
  const tokensTop = rateBottom + PANEL_GAP + TITLE_H;
  return { rate: [rateTop, rateBottom], tokens: [tokensTop, h - MARGIN.bottom] };
}

// points: [{t, prompt, read, rate}] oldest first (see format.historyPoints), `now` on the
// same clock as t. Draws the per-sample hit rate as a line in the top panel (broken where
// samples are more than GAP_S apart) and each sample's prompt tokens as a stacked bar in
// the panel below; returns how many samples carried a hit rate (the line's vertices).
export function drawHitChart(svg, allPoints, now, maxSpanS = 600) {
  const { w, h } = fitViewBox(svg, 640, 300);
  const { tMin, tMax } = chartWindow(allPoints, now, maxSpanS);
  const points = allPoints.filter((p) => p.t >= tMin);
  const rated = points.filter((p) => p.rate !== null);
  const x0 = MARGIN.left, x1 = w - MARGIN.right;
  const { rate, tokens } = panelLayout(h);
  const top = niceCeiling(Math.max(0, ...points.map((p) => p.prompt)));
  const x = (t) => x0 + ((t - tMin) / (tMax - tMin)) * (x1 - x0);
  const y = (r) => rate[1] - r * (rate[1] - rate[0]);
  const yTokens = (n) => tokens[1] - (n / top) * (tokens[1] - tokens[0]);
  const barW = Math.max(1.5, Math.min(10, ((x1 - x0) / Math.max(1, (tMax - tMin))) * 0.7));

  let body = panelTitle(x0, rate[0], 'hit rate per second', 'rate-axis-title');
  body += panelTitle(x0, tokens[0], 'prompt tokens per second: from cache, computed', 'tokens-axis-title');
  body += timeAxis(tMin, tMax, x, [rate, tokens], h - MARGIN.bottom + 15);
  body += rateAxis(x0, x1, y) + tokenAxis(x0, x1, yTokens, top);
  body += tokenBars(points, x, yTokens, barW);
  if (rated.length) body += rateLine(rated, x, y, tMax);
  svg.innerHTML = body;
  return rated.length;
}

// A small line of hit rates (0..1) over time in a fixed 120x28 box; fewer than two points
// draw a single dot or nothing.
export function drawSparkline(svg, points) {
  const w = 120, h = 28, pad = 3;
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  if (!points.length) {
    svg.innerHTML = `<line class="spark-empty" x1="${pad}" x2="${w - pad}" y1="${h / 2}" y2="${h / 2}"/>`;
    return;
  }
  const tMin = points[0].t, tMax = points[points.length - 1].t;
  const x = (t) => (tMax > tMin ? pad + ((t - tMin) / (tMax - tMin)) * (w - 2 * pad) : w - pad);
  const y = (rate) => pad + (1 - rate) * (h - 2 * pad);
  const last = points[points.length - 1];
  const line = points.length > 1 ? `<path class="spark" d="${ratePath(points, x, y)}"/>` : '';
  svg.innerHTML = line + `<circle class="spark-last" cx="${r1(x(last.t))}" cy="${r1(y(last.rate))}" r="2.5"/>`;
}

// Requests per minute stacked by the reason they read what they read (diagnostics.py's
// REASONS), one bar a minute with traffic; the legend is the caller's (labels are fixed).
export const REASON_ORDER = ['hit', 'new_content', 'expired', 'evicted', 'first'];

export function drawReasonChart(svg, minutes) {
  const { w, h } = fitViewBox(svg, 480, 160);
  const x0 = MARGIN.left, x1 = w - MARGIN.right, yTop = MARGIN.top, yBottom = h - MARGIN.bottom;
  const peak = niceCeiling(Math.max(1, ...minutes.map(
    (m) => REASON_ORDER.reduce((sum, r) => sum + (m[r] || 0), 0))));
  const y = (n) => yBottom - (n / peak) * (yBottom - yTop);
  const slot = minutes.length ? (x1 - x0) / minutes.length : 0;
  const barW = Math.min(24, Math.max(2, slot * 0.7));
  let bars = '';
  minutes.forEach((m, i) => {
    let base = 0;
    for (const reason of REASON_ORDER) {
      const n = m[reason] || 0;
      if (!n) continue;
      bars += `<rect class="reason ${reason}" data-reason="${reason}" x="${r1(x0 + i * slot)}" `
        + `y="${r1(y(base + n))}" width="${r1(barW)}" height="${r1(y(base) - y(base + n))}"/>`;
      base += n;
    }
  });
  const axis = `<line class="axis" x1="${x0}" x2="${x1}" y1="${yBottom}" y2="${yBottom}"/>`
    + `<text class="tick" x="${x0 - 6}" y="${r1(y(peak)) + 4}" text-anchor="end">${peak}</text>`
    + `<text class="tick" x="${x0 - 6}" y="${yBottom + 4}" text-anchor="end">0</text>`;
  svg.innerHTML = axis + bars;
}
