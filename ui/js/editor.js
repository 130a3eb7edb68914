// The dataset editor (the Files tab): every file of the folder with its verdict and
// length, and each song's caption, lyrics, tempo, key, time signature and language as
// training will use them, each marked with where its value comes from. Edits are
// checked and kept by the backend (the engine's label store, never the songs' folder);
// "Analyse" reads tempo, key and meter from the audio as estimates, kept only once
// accepted; "Caption" has ACE-Step's LM write them (captions.js), its tempo, key and
// meter offered the same way. Cells are inputs: Tab moves between them, Enter keeps an edit (Shift+Enter
// is a new line in lyrics), Escape undoes it, Enter on an analysed row accepts it.

import { invoke, errorText } from './api.js';
import * as fmt from './format.js';
import { datasetButtons } from './listen.js';
import { captionControls } from './captions.js';

const $ = (id) => document.getElementById(id);

// The label fields in column order, as the engine names them, with their cells' look.
const FIELDS = [
  { field: 'caption', label: 'Caption', multiline: true },
  { field: 'lyrics', label: 'Lyrics', multiline: true, placeholder: '[Instrumental]' },
  { field: 'bpm', label: 'BPM', width: '3.8em' },
  { field: 'keyscale', label: 'Key', width: '6.5em' },
  { field: 'timesignature', label: 'Time signature', width: '2.8em' },
  { field: 'language', label: 'Language', width: '4em', list: 'languages' },
  { field: 'genre', label: 'Genre', width: '6.5em' },
];
const SOURCE_TEXT = {
  edited: 'edited here',
  sidecar: 'from a sidecar file',
  lm: "written by ACE-Step's LM from the audio",
  analysed: 'read from the audio (accepted)',
};

const state = {
  say: () => {},
  dataset: null,
  // file name -> {field: {value, confidence, cannot_tell}}, or {value, from: 'lm'} for
  // the LM's guesses
  estimates: new Map(),
  analysing: null,      // {cancelled} while Analyse runs
};

export function setupEditor({ say }) {
  state.say = say;
  $('btn-analyse-all').addEventListener('click', () => analyse(usableNames()));
  $('btn-analyse-cancel').addEventListener('click', () => { if (state.analysing) state.analysing.cancelled = true; });
  $('btn-write-sidecars').addEventListener('click', () => writeSidecars(false));
  $('btn-replace-sidecars').addEventListener('click', () => writeSidecars(true));
}

export function showDataset(d) {
  state.dataset = d;
  state.estimates.clear();
  const list = $('languages');
  list.replaceChildren(...(d.languages || []).map((l) => Object.assign(document.createElement('option'), { value: l })));
  const body = $('files-body');
  body.replaceChildren();
  if (!d.files.length) {
    body.innerHTML = `<tr class="empty-row"><td colspan="${FIELDS.length + 2}">No audio files in this folder.</td></tr>`;
    return;
  }
  for (const f of d.files) body.append(fileRow(f));
  $('editor-tools').hidden = false;
}

/** A file the run skipped after all: its verdict says so. */
export function markFileProblem(file, reason) {
  const name = String(file);
  for (const tr of $('files-body').querySelectorAll('tr[data-file]')) {
    if (name === tr.dataset.file || name.endsWith('/' + tr.dataset.file)) {
      const verdict = tr.querySelector('.verdict');
      verdict.replaceChildren(badge('skipped', 'bad'), detail(reason, 'problem'));
      tr.dataset.verdict = 'skipped';
    }
  }
}

function usableNames() {
  return (state.dataset?.files || []).filter((f) => f.status === 'ok').map((f) => f.name);
}

function badge(text, cls) {
  const b = document.createElement('span');
  b.className = `badge ${cls}`;
  b.textContent = text;
  return b;
}

function detail(text, cls) {
  const s = document.createElement('small');
  s.className = cls;
  s.textContent = text;
  return s;
}

function td(cls, ...children) {
  const c = document.createElement('td');
  if (cls) c.className = cls;
  c.append(...children);
  return c;
}

function fileRow(f) {
  const tr = document.createElement('tr');
  tr.dataset.file = f.name;
  const ok = f.status === 'ok';
  const verdict = ok ? (f.note ? ['cut', 'warn'] : ['used', 'ok']) : ['skipped', 'bad'];
  tr.dataset.verdict = verdict[0];
  const why = ok ? f.note : f.problem;
  // The file, its verdict and its length in one cell: the table fits a 1200 px window.
  const verdictLine = document.createElement('div');
  verdictLine.className = 'verdict';
  verdictLine.append(badge(...verdict), detail(fmt.duration(f.duration_s), 'duration'), ...(why ? [detail(why, ok ? 'note' : 'problem')] : []));
  const name = td('name', f.name, verdictLine);
  if (f.stale) name.append(detail('the audio changed since these labels were kept', 'stale'));
  tr.append(name);
  for (const spec of FIELDS) tr.append(ok ? labelCell(f, spec) : td('label'));
  const accept = document.createElement('button');
  accept.className = 'btn small';
  accept.textContent = 'Accept';
  accept.dataset.testid = 'accept-estimates';
  accept.title = 'Keep the estimated tempo, key and meter (Enter in the row)';
  accept.hidden = true;
  accept.addEventListener('click', () => acceptEstimates(f.name));
  const analyseOne = document.createElement('button');
  analyseOne.className = 'btn small ghost';
  analyseOne.textContent = 'Analyse';
  analyseOne.dataset.testid = 'analyse-song';
  analyseOne.addEventListener('click', () => analyse([f.name]));
  const [caption, captioned] = ok ? captionControls(f.name) : [];
  const actions = document.createElement('div');
  actions.className = 'row-actions';
  if (ok) actions.append(analyseOne, caption, accept, datasetButtons(f.name), captioned);
  tr.append(td('actions-cell', actions));
  tr.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && state.estimates.has(f.name) && !e.target.dataset.dirty) {
      e.preventDefault();
      acceptEstimates(f.name);
    }
  });
  return tr;
}

function labelCell(f, spec) {
  const cell = td('label');
  const input = document.createElement(spec.multiline ? 'textarea' : 'input');
  if (spec.multiline) input.rows = 1;
  else input.style.width = spec.width;
  if (spec.list) input.setAttribute('list', spec.list);
  input.spellcheck = spec.multiline === true;
  input.dataset.field = spec.field;
  input.dataset.testid = `label-${spec.field}`;
  input.setAttribute('aria-label', `${spec.label} of ${f.name}`);
  if (spec.placeholder) input.placeholder = spec.placeholder;
  showValue(input, f.labels[spec.field]);
  input.addEventListener('input', () => { input.dataset.dirty = 'true'; });
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !(spec.multiline && e.shiftKey) && input.dataset.dirty) {
      e.preventDefault();
      save(f.name, input);
    } else if (e.key === 'Escape') {
      delete input.dataset.dirty;
      showValue(input, input.resolved);
      clearError(input);
    }
  });
  input.addEventListener('change', () => { if (input.dataset.dirty) save(f.name, input); });
  cell.append(input);
  return cell;
}

/** A cell's value as training uses it, marked by where it comes from. */
function showValue(input, resolved) {
  input.resolved = resolved;
  input.value = resolved?.value ?? '';
  const source = resolved?.source || 'none';
  input.dataset.source = source;
  delete input.dataset.estimate;
  delete input.dataset.guess;
  input.title = SOURCE_TEXT[source] || 'not given: N/A to ACE-Step';
}

function clearError(input) {
  input.classList.remove('invalid');
  input.removeAttribute('aria-invalid');
  input.parentElement.querySelector('.cell-error')?.remove();
}

async function save(name, input) {
  const value = input.value;
  try {
    const row = await invoke('set_label', { name, field: input.dataset.field, value });
    if (input.value === value) delete input.dataset.dirty;
    clearError(input);
    updateRow(row);
  } catch (e) {
    clearError(input);
    input.classList.add('invalid');
    input.setAttribute('aria-invalid', 'true');
    input.parentElement.append(detail(errorText(e), 'cell-error'));
  }
}

function rowOf(name) {
  return [...$('files-body').querySelectorAll('tr[data-file]')].find((tr) => tr.dataset.file === name);
}

/** The backend's row after a change: every cell not being typed in shows it. */
export function updateRow(row) {
  const tr = rowOf(row.name);
  if (!tr) return;
  const file = state.dataset.files.findIndex((f) => f.name === row.name);
  if (file >= 0) state.dataset.files[file] = row;
  for (const input of tr.querySelectorAll('[data-field]')) {
    if (!input.dataset.dirty) showValue(input, row.labels[input.dataset.field]);
  }
  tr.querySelector('.stale')?.remove();
  showEstimates(row.name);
}

/** Estimates for a song (the analysis's, or the LM's guesses), offered over earlier ones. */
export function offerEstimates(name, estimates) {
  state.estimates.set(name, { ...state.estimates.get(name), ...estimates });
  showEstimates(name);
}

/** Estimates not yet accepted fill the empty, analysed or LM-written cells, marked as such. */
function showEstimates(name) {
  const tr = rowOf(name);
  const estimates = state.estimates.get(name);
  if (!tr) return;
  tr.querySelector('[data-testid=accept-estimates]').hidden = !estimates;
  tr.dataset.estimates = estimates ? 'true' : 'false';
  for (const input of tr.querySelectorAll('[data-field]')) {
    const e = estimates?.[input.dataset.field];
    if (!e || input.dataset.dirty) continue;
    const shown = input.resolved?.source;
    if (e.value != null && shown !== 'edited' && shown !== 'sidecar') {
      input.value = e.value;
      input.dataset.source = 'estimate';
      input.dataset.estimate = e.from || 'analysis';
      // The engine says which readings are guesses (below its level of sure); the LM's are all guesses.
      input.dataset.guess = String(e.from === 'lm' || e.guess === true);
      const sure = `${Math.round(100 * e.confidence)}% sure`;
      input.title = e.from === 'lm'
        ? "ACE-Step's LM's guess (it may invent it): Enter or Accept keeps it"
        : `${e.guess ? 'a guess' : 'read'} from the audio (${sure}): Enter or Accept keeps it`;
    } else if (e.cannot_tell && input.value === '') {
      input.placeholder = 'cannot tell';
      input.title = `cannot tell from the audio: ${e.cannot_tell}`;
    }
  }
}

async function analyse(names) {
  if (state.analysing || !names.length) return;
  const run = { cancelled: false };
  state.analysing = run;
  const progress = $('analyse-progress');
  $('btn-analyse-cancel').hidden = false;
  $('btn-analyse-all').disabled = true;
  let done = 0;
  try {
    for (const name of names) {
      if (run.cancelled) break;
      progress.textContent = `Analysing ${done + 1} / ${names.length}: ${name}`;
      try {
        offerEstimates(name, await invoke('analyse_song', { name }));
      } catch (e) {
        state.say(errorText(e), { error: true });
      }
      done += 1;
    }
    progress.textContent = run.cancelled ? `Analysis cancelled after ${done} of ${names.length}` : `Analysed ${done} song${done === 1 ? '' : 's'}: accept the estimates to keep them`;
  } finally {
    state.analysing = null;
    $('btn-analyse-cancel').hidden = true;
    $('btn-analyse-all').disabled = false;
  }
}

async function acceptEstimates(name) {
  const estimates = state.estimates.get(name);
  if (!estimates) return;
  const values = {};
  for (const [field, e] of Object.entries(estimates)) if (e.value != null) values[field] = e.value;
  try {
    state.estimates.delete(name);
    updateRow(await invoke('accept_labels', { name, values }));
  } catch (e) {
    state.estimates.set(name, estimates);
    state.say(errorText(e), { error: true });
  }
}

async function writeSidecars(replace) {
  const conflicts = $('sidecar-conflicts');
  // The question stays until the answer is written: it goes when no file is left kept.
  $('btn-replace-sidecars').disabled = true;
  try {
    const report = await invoke('write_sidecars', { replace });
    const c = report.counts;
    const parts = ['written', 'replaced', 'unchanged'].filter((k) => c[k]).map((k) => `${c[k]} ${k}`);
    state.say(`Sidecars: ${parts.join(', ') || 'nothing to write'}`);
    // Asked here, in the window: nothing is replaced until the user says so.
    $('sidecar-conflicts-text').textContent = `${report.kept.length} sidecar file(s) already say something else and were kept: ${report.kept.join(', ')}.`;
    conflicts.hidden = report.kept.length === 0;
  } catch (e) {
    state.say(errorText(e), { error: true });
  } finally {
    $('btn-replace-sidecars').disabled = false;
  }
}
