// The only module that touches Tauri's global API (app.withGlobalTauri = true).

const T = window.__TAURI__;

export const available = Boolean(T && T.core && T.event);

/** Calls a backend command. Rejects with `{kind, message, fields?}`. */
export async function invoke(cmd, args = {}) {
  if (!available) throw { kind: 'no_backend', message: 'Not running inside the Ostinato app.' };
  try {
    return await T.core.invoke(cmd, args);
  } catch (e) {
    if (e && typeof e === 'object' && 'message' in e) throw e;
    throw { kind: 'ipc', message: String(e) };
  }
}

/** Follows a backend event; resolves once listening (events sent earlier are lost). */
export function listen(name, handler) {
  if (!available) return Promise.resolve(() => {});
  return T.event.listen(name, (e) => handler(e.payload));
}

/** Drag and drop of files/folders onto the window: cb({type, paths}). */
export function onDragDrop(cb) {
  if (!available || !T.webview) return Promise.resolve(() => {});
  return T.webview.getCurrentWebview().onDragDropEvent((e) => cb(e.payload));
}

export function errorText(e) {
  if (!e) return 'Unknown error';
  if (typeof e === 'string') return e;
  return e.message || JSON.stringify(e);
}
