// The value under the pointer on a chart. The engine sends, beside each SVG, a readout:
// where its plotting area lies in the drawing, what its axes span and the points it
// drew. This maps the pointer onto them; it computes nothing of training.

import * as fmt from './format.js';

/** Shows the values under the pointer over `chart` (a .chart whose `readout` is set with its SVG). */
export function followPointer(chart) {
  const figure = chart.parentElement;
  const tip = document.createElement('div');
  tip.className = 'chart-readout';
  tip.dataset.testid = 'chart-readout';
  tip.setAttribute('role', 'status');
  tip.hidden = true;
  // Beside the chart, not in it: a new SVG replaces the chart's children.
  figure.append(tip);
  const hide = () => { tip.hidden = true; };
  chart.addEventListener('mouseleave', hide);
  chart.addEventListener('mousemove', (e) => {
    const svg = chart.querySelector('svg');
    const text = chart.readout && svg ? readAt(chart.readout, svg.getBoundingClientRect(), e.clientX, e.clientY) : null;
    if (!text) { hide(); return; }
    tip.textContent = text;
    tip.hidden = false;
    const box = figure.getBoundingClientRect();
    const x = e.clientX - box.left;
    const y = e.clientY - box.top;
    tip.style.left = `${Math.max(0, Math.min(x + 12, box.width - tip.offsetWidth))}px`;
    tip.style.top = `${Math.max(0, y - tip.offsetHeight - 10)}px`;
  });
}

/** The values of each line nearest the pointer, in words; null off the plotting area. */
export function readAt(r, rect, clientX, clientY) {
  const [w, h] = r.size;
  // The SVG is scaled to fit its box, centred (preserveAspectRatio meet).
  const scale = Math.min(rect.width / w, rect.height / h);
  const px = (clientX - rect.left - (rect.width - w * scale) / 2) / scale;
  const py = (clientY - rect.top - (rect.height - h * scale) / 2) / scale;
  const [left, top, right, bottom] = r.area;
  if (!(scale > 0) || px < left || px > right || py < top || py > bottom) return null;
  const x = r.x_range[0] + ((px - left) / (right - left)) * (r.x_range[1] - r.x_range[0]);
  const name = r.x_desc.split(' (')[0];
  let at = null;
  const parts = [];
  for (const line of r.lines) {
    const p = nearest(line.points, x);
    if (!p) continue;
    at ??= p[0];
    parts.push(`${line.name} ${fmt.num(p[1])}${p[0] === at ? '' : ` (${name} ${number(p[0])})`}`);
  }
  return parts.length ? `${name} ${number(at)} · ${parts.join(' · ')}` : null;
}

/** The point whose x is nearest `x` (points in ascending x). */
function nearest(points, x) {
  let lo = 0;
  let hi = points.length - 1;
  if (hi < 0) return null;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (points[mid][0] < x) lo = mid; else hi = mid;
  }
  return Math.abs(points[lo][0] - x) <= Math.abs(points[hi][0] - x) ? points[lo] : points[hi];
}

function number(x) {
  return Number.isInteger(x) ? String(x) : fmt.num(x, 3);
}
