// What the native menu asks of the page (Settings, opening a folder, Start: the items
// that need the page's form) and the menu's shortcut labels, which the backend writes
// in the platform's own words (⌘↩ on a Mac, Ctrl+Enter elsewhere).

import { invoke, listen } from './api.js';

/** Writes the menu's shortcuts into `kbd[data-shortcut]` and the `title` of `[data-shortcut-title]`. */
export async function showShortcuts() {
  const labels = await invoke('shortcuts');
  for (const k of document.querySelectorAll('kbd[data-shortcut]')) {
    k.textContent = labels[k.dataset.shortcut] ?? '';
  }
  for (const el of document.querySelectorAll('[data-shortcut-title]')) {
    const label = labels[el.dataset.shortcutTitle];
    if (label && !el.title.includes(label)) el.title = el.title.replace(/\)$/, ` or ${label})`);
  }
}

/** Follows the menu's `menu` events: `handlers[action](payload)`. */
export function followMenu(handlers) {
  return listen('menu', (p) => handlers[p?.action]?.(p));
}
