// Hand-drawn SVG charts. Markup is built as strings of numbers only (no user text), and set
// with innerHTML on an <svg> element, which parses it as SVG.

const MARGIN = { left: 44, right: 14, top: 10, bottom: 22 };
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

// Size the viewBox to the element's box so text and strokes are not stretched.
function fitViewBox(svg, fallbackW, fallbackH) {
  const w = Math.max(200, Math.round(svg.clientWidth || fallbackW));
  const h = Math.max(120, Math.round(svg.clientHeight || fallbackH));
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  return { w, h };
}

function timeAxis(tMin, tMax, x, yTop, yBottom) {
  const step = pickTickStep(tMax - tMin);
  let out = '';
  for (let ago = 0; tMax - ago >= tMin - 1e-9; ago += step) {
    const xi = r1(x(tMax - ago));
    out += `<line class="grid" x1="${xi}" x2="${xi}" y1="${yTop}" y2="${yBottom}"/>`;
    out += `<text class="axis" x="${xi}" y="${yBottom + 15}" text-anchor="middle">${tickLabel(ago)}</text>`;
  }
  return out;
}

function rateAxis(x0, x1, y) {
  let out = '';
  for (const pct of [0, 25, 50, 75, 100]) {
    const yi = r1(y(pct / 100));
    out += `<line class="grid${pct % 50 ? ' faint' : ''}" data-pct="${pct}" x1="${x0}" x2="${x1}" y1="${yi}" y2="${yi}"/>`;
    if (pct % 50 === 0) out += `<text class="axis" x="${x0 - 6}" y="${yi + 4}" text-anchor="end">${pct}%</text>`;
  }
  return out;
}

function tokenBars(points, x, yBase, height, barW) {
  const maxPrompt = Math.max(1, ...points.map((p) => p.prompt));
  let out = '';
  for (const p of points) {
    if (p.prompt <= 0) continue;
    const hRead = (p.read / maxPrompt) * height;
    const hAll = (p.prompt / maxPrompt) * height;
    const xi = r1(x(p.t) - barW / 2);
    out += `<rect class="bar computed" x="${xi}" y="${r1(yBase - hAll)}" width="${r1(barW)}" height="${r1(hAll - hRead)}"/>`;
    out += `<rect class="bar read" x="${xi}" y="${r1(yBase - hRead)}" width="${r1(barW)}" height="${r1(hRead)}"/>`;
  }
  return out;
}

function ratePath(points, x, y) {
  return points.map((p, i) => `${i ? 'L' : 'M'}${r1(x(p.t))},${r1(y(p.rate))}`).join(' ');
}

// The time window a chart shows: ends at `now`, at least a minute, at most `maxSpanS`.
export function chartWindow(points, now, maxSpanS) {
  const tMax = Math.max(now, points.length ? points[points.length - 1].t : now);
  const first = points.length ? points[0].t : tMax;
  return { tMin: Math.max(tMax - maxSpanS, Math.min(first, tMax - 60)), tMax };
}

// points: [{t, prompt, read, rate}] oldest first (see format.historyPoints), `now` on the
// same clock as t. Draws the per-sample hit rate as a line over stacked token bars; returns
// how many samples carried a hit rate (the line's vertices).
export function drawHitChart(svg, allPoints, now, maxSpanS = 600) {
  const { w, h } = fitViewBox(svg, 640, 260);
  const { tMin, tMax } = chartWindow(allPoints, now, maxSpanS);
  const points = allPoints.filter((p) => p.t >= tMin);
  const rated = points.filter((p) => p.rate !== null);
  const x0 = MARGIN.left, x1 = w - MARGIN.right;
  const plotH = h - MARGIN.top - MARGIN.bottom;
  const lineH = plotH * 0.64, barsH = plotH * 0.28;
  const barsBase = h - MARGIN.bottom;
  const x = (t) => x0 + ((t - tMin) / (tMax - tMin)) * (x1 - x0);
  const y = (rate) => MARGIN.top + (1 - rate) * lineH;
  const barW = Math.max(1.5, Math.min(10, ((x1 - x0) / Math.max(1, (tMax - tMin))) * 0.7));

  let body = rateAxis(x0, x1, y) + timeAxis(tMin, tMax, x, MARGIN.top, barsBase);
  body += `<line class="baseline" x1="${x0}" x2="${x1}" y1="${barsBase}" y2="${barsBase}"/>`;
  body += tokenBars(points, x, barsBase, barsH, barW);
  if (rated.length) {
    const d = ratePath(rated, x, y);
    const first = rated[0], last = rated[rated.length - 1];
    const area = `${d} L${r1(x(last.t))},${r1(y(0))} L${r1(x(first.t))},${r1(y(0))} Z`;
    body += `<path class="rate-area" d="${area}"/>`;
    body += `<path class="rate-line" id="hit-line" data-points="${rated.length}" d="${d}"/>`;
    body += rated.length <= 120
      ? rated.map((p) => `<circle class="rate-dot" cx="${r1(x(p.t))}" cy="${r1(y(p.rate))}" r="2.2">`
        + `<title>${Math.round(tMax - p.t)} s ago: ${(100 * p.rate).toFixed(1)}% of ${p.prompt} prompt tokens</title></circle>`).join('')
      : '';
    body += `<circle class="rate-last" cx="${r1(x(last.t))}" cy="${r1(y(last.rate))}" r="4"/>`;
  }
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
