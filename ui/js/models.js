// The model picker: the ACE-Step models the engine found on this machine (2B or XL,
// turbo, base or SFT, bytes, complete or what is missing), the 5 Hz LMs that label songs,
// and a download of either with progress and cancel.
// Picking a model hands its folder to `onPick`, which saves it as the model choice.

import { invoke, listen, errorText } from './api.js';
import * as fmt from './format.js';

const $ = (id) => document.getElementById(id);

let onPick = () => {};
let onError = () => {};
/** Whether the download in progress is an LM's (its folder is no model to train). */
let downloadingLm = false;

function el(tag, props = {}, text = '') {
  const e = document.createElement(tag);
  Object.assign(e, props);
  if (text) e.textContent = text;
  return e;
}

/** One found model or LM: what it is, its bytes, complete or its problems; `use` when
    complete and it can be picked. */
function foundRow(found, what, use) {
  const li = el('li', { className: found.complete ? 'complete' : 'incomplete' });
  const status = found.complete ? 'complete' : 'incomplete';
  li.append(el('span', { className: 'what', title: [found.path, ...found.problems].join('\n') },
    `${what} · ${fmt.bytes(found.bytes)} · ${status} · ${found.path}`));
  if (found.complete && use) {
    const button = el('button', { className: 'btn small' }, 'Use');
    button.addEventListener('click', use);
    li.append(button);
  } else if (found.problems.length) {
    li.append(el('span', { className: 'problem', title: found.problems.join('\n') }, `${found.problems.length} problem(s)`));
  }
  return li;
}

function showFound(listId, found, empty, row) {
  const list = $(listId);
  list.replaceChildren();
  if (!found.length) {
    list.append(el('li', { className: 'incomplete' }, empty));
    return;
  }
  list.append(...found.map(row));
}

function showModels(models) {
  showFound('model-list', models, 'None found yet: download one below, or choose its folder.', (m) => {
    const li = foundRow(m, m.label, () => onPick(m.path));
    li.dataset.testid = 'model-row';
    return li;
  });
}

function showLms(lms) {
  showFound('lm-list', lms, 'None found yet: download one below to label songs.', (lm) => {
    const li = foundRow(lm, lm.name, null);
    li.dataset.testid = 'lm-row';
    return li;
  });
}

export async function refreshModels() {
  try {
    const [models, lms] = await Promise.all([invoke('list_models'), invoke('list_lms')]);
    showModels(models);
    showLms(lms);
  } catch (e) { onError(errorText(e)); }
}

function downloading(on) {
  for (const id of ['btn-download-model', 'download-variant', 'btn-download-lm', 'download-lm']) $(id).disabled = on;
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
      if (!downloadingLm) onPick(ev.model);
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

/** Downloads the variant `select` names; its option's text (an LM's carries its
    approximate size) is said before the hub is asked. */
async function startDownload(select, isLm) {
  $('download-status').classList.remove('error');
  downloadingLm = isLm;
  try {
    downloading(true);
    status(`${select.selectedOptions[0]?.text ?? select.value}: asking the hub for the file list…`);
    await invoke('download_model', { variant: select.value });
  } catch (e) {
    downloading(false);
    status(errorText(e));
  }
}

export async function setupModels({ pick, error }) {
  onPick = pick;
  onError = error;
  $('btn-refresh-models').addEventListener('click', refreshModels);
  $('btn-download-model').addEventListener('click', () => startDownload($('download-variant'), false));
  $('btn-download-lm').addEventListener('click', () => startDownload($('download-lm'), true));
  $('btn-cancel-download').addEventListener('click', () => invoke('cancel_download').catch((e) => onError(errorText(e))));
  await listen('model-download', onDownloadEvent);
}
