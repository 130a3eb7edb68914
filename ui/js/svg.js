// Puts an SVG document drawn by the engine's chart module into the page: parsed as
// XML (never as HTML), stripped of anything active, scaled to its container.

export function setSvg(container, text) {
  const doc = new DOMParser().parseFromString(text || '', 'image/svg+xml');
  const svg = doc.documentElement;
  if (!svg || svg.nodeName.toLowerCase() !== 'svg' || doc.getElementsByTagName('parsererror').length) {
    return false;
  }
  for (const n of [...svg.querySelectorAll('script, foreignObject, iframe')]) n.remove();
  for (const el of [svg, ...svg.querySelectorAll('*')]) {
    for (const a of [...el.attributes]) {
      const name = a.name.toLowerCase();
      if (name.startsWith('on') || (name.endsWith('href') && !a.value.startsWith('#'))) el.removeAttribute(a.name);
    }
  }
  if (!svg.getAttribute('viewBox')) {
    const w = parseFloat(svg.getAttribute('width')), h = parseFloat(svg.getAttribute('height'));
    if (w > 0 && h > 0) svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  }
  svg.removeAttribute('width');
  svg.removeAttribute('height');
  svg.setAttribute('preserveAspectRatio', 'xMidYMid meet');
  svg.setAttribute('role', 'img');
  container.replaceChildren(document.importNode(svg, true));
  container.dataset.empty = 'false';
  return true;
}
