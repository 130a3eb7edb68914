// The model picker: the ACE-Step models the engine found on this machine (2B or XL,
// turbo, base or SFT, bytes, complete or what is missing) and a download with progress and cancel.
// Picking a model hands its folder to `onPick`, which saves it as the model choice.

import { invoke, listen, errorText } from './api.js';
import * as fmt from './format.js';

const $ = (id) => document.getElementById(id);

let onPick = () => {};
let onError = () => {};

function el(tag, props = {}, text = '') {
  const e = document.createElement(tag);
  Object.assign(e, props);
  if (text) e.textContent = text;
  return e;
}

function showModels(models) {
  const list = $('model-list');
  list.replaceChildren();
  if (!models.length) {
    list.append(el('li', { className: 'incomplete' }, 'None found yet: download one below, or choose its folder.'));
    return;
  }
  for (const m of models) {
    const li = el('li', { className: m.complete ? 'complete' : 'incomplete' });
    li.dataset.testid = 'model-row';
    const status = m.complete ? 'complete' : 'incomplete';
    const what = el('span', { className: 'what', title: [m.path, ...m.problems].join('\n') },
      `${m.label} · ${fmt.bytes(m.bytes)} · ${status} · ${m.path}`);
    li.append(what);
    if (m.complete) {
      const use = el('button', { className: 'btn small' }, 'Use');
      use.addEventListener('click', () => onPick(m.path));
      li.append(use);
    } else if (m.problems.length) {
      li.append(el('span', { className: 'problem', title: m.problems.join('\n') }, `${m.problems.length} problem(s)`));
    }
    list.append(li);
  }
}

export async function refreshModels() {
  try {
    showModels(await invoke('list_models'));
  } catch (e) { onError(errorText(e)); }
}

function downloading(on) {
  $('btn-download-model').disabled = on;
  $('download-variant').disabled = on;
  $('btn-cancel-download').hidden = !on;
  $('download-progress').hidden = !on;
}

function status(text) {
  $('download-status').textContent = text;
}

/** One `model-download` event: the engine's DownloadEvent, or how it ended. */
function onDownloadEvent(ev) {
  switch (ev.type) {
    case 'planned':
      downloading(true);
      status(`${ev.variant}: ${ev.files} files, ${fmt.bytes(ev.missing_bytes)} to fetch of ${fmt.bytes(ev.bytes)}`);
      $('download-progress').max = Math.max(ev.missing_bytes, 1);
      $('download-progress').value = 0;
      break;
    case 'progress':
      $('download-progress').value = ev.total_done;
      status(`${ev.path}: ${fmt.bytes(ev.done)} of ${fmt.bytes(ev.size)} · ${fmt.bytes(ev.total_done)} of ${fmt.bytes(ev.total)}`);
      break;
    case 'listing_files':
      status(`Asking ${ev.endpoint} for the files of ${ev.repo}…`);
      break;
    case 'retrying':
      status(`${ev.what}: ${ev.reason}; try ${ev.next_try} of ${ev.tries} in ${ev.wait_ms / 1000} s`);
      break;
    case 'finished':
      downloading(false);
      status(`Ready: ${ev.model}`);
      refreshModels();
      onPick(ev.model);
      break;
    case 'cancelled':
      downloading(false);
      status('Cancelled. Download again to resume where it stopped.');
      refreshModels();
      break;
    case 'failed':
      downloading(false);
      status(`Download failed: ${ev.error}`);
      $('download-status').classList.add('error');
      break;
    default:
      break;
  }
}

export async function setupModels({ pick, error }) {
  onPick = pick;
  onError = error;
  $('btn-refresh-models').addEventListener('click', refreshModels);
  $('btn-download-model').addEventListener('click', async () => {
    $('download-status').classList.remove('error');
    try {
      downloading(true);
      status('Asking the hub for the file list…');
      await invoke('download_model', { variant: $('download-variant').value });
    } catch (e) {
      downloading(false);
      status(errorText(e));
    }
  });
  $('btn-cancel-download').addEventListener('click', () => invoke('cancel_download').catch((e) => onError(errorText(e))));
  await listen('model-download', onDownloadEvent);
}
