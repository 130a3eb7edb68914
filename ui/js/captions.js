// Captioning with ACE-Step's 5 Hz LM in the Files tab: a song's "Caption" button and
// "Caption all" start a batch in the backend (one at a time, Cancel stops it); each song's
// caption, lyrics, language and genre arrive in its row (source `lm`), its tempo, key and
// meter as the LM's guesses, offered like the analysis's estimates and kept only once
// accepted. Without an LM the buttons say so and point to the Model panel's download.

import { invoke, listen, errorText } from './api.js';

const $ = (id) => document.getElementById(id);

const NO_LM = 'No 5 Hz LM found: download one in the Model panel (5 Hz LMs) to caption songs';
const ROW_TITLE = "Caption with ACE-Step's LM: it writes the caption, lyrics, language and genre; its tempo, key and meter are offered to accept";

const state = {
  hooks: { updateRow: () => {}, offerEstimates: () => {}, say: () => {} },
  lms: [],
  running: false,
  // Batches run one after another with rising ids: an event of one that has ended
  // (the web view may get it after the end) is stale.
  ended: 0,
};

/** The editor's hooks: `updateRow(row)`, `offerEstimates(name, estimates)`, `say(text, opts)`. */
export async function setupCaptions(hooks) {
  state.hooks = hooks;
  $('btn-caption-all').addEventListener('click', () => start(null));
  $('btn-caption-cancel').addEventListener('click', () => invoke('cancel_captions').catch((e) => hooks.say(errorText(e), { error: true })));
  $('btn-get-lm').addEventListener('click', showLmDownload);
  // An LM found in a folder the Model panel added, or on disk since.
  $('btn-refresh-models').addEventListener('click', refreshLms);
  await Promise.all([
    listen('caption-progress', onProgress),
    listen('caption-song', onSong),
    listen('caption-done', onDone),
    // A downloaded LM can caption at once.
    listen('model-download', (ev) => { if (ev.type === 'finished') refreshLms(); }),
  ]);
  await refreshLms();
}

/** The complete LMs found (the one used by default first), offered in the LM choice. */
export async function refreshLms() {
  try {
    state.lms = await invoke('caption_lms');
  } catch (e) {
    state.lms = [];
    state.hooks.say(errorText(e), { error: true });
  }
  const select = $('caption-lm');
  const chosen = select.value;
  select.replaceChildren(...state.lms.map((lm) => Object.assign(document.createElement('option'), { value: lm.path, textContent: lm.name, title: lm.path })));
  if (state.lms.some((lm) => lm.path === chosen)) select.value = chosen;
  select.hidden = state.lms.length === 0;
  $('btn-get-lm').hidden = state.lms.length > 0;
  enable();
}

/** A song's Caption button and the line that says how its captioning went. */
export function captionControls(name) {
  const button = document.createElement('button');
  button.className = 'btn small ghost';
  button.textContent = 'Caption';
  button.dataset.testid = 'caption-song';
  button.dataset.captionSong = name;
  button.addEventListener('click', () => start([name]));
  const status = document.createElement('small');
  status.className = 'caption-status';
  status.dataset.testid = 'caption-status';
  status.dataset.captionStatus = name;
  enable(button);
  return [button, status];
}

function buttons() {
  return [$('btn-caption-all'), ...document.querySelectorAll('[data-caption-song]')];
}

/** Caption buttons work while an LM is found and no batch runs; each says why not. */
function enable(...only) {
  const found = state.lms.length > 0;
  for (const b of only.length ? only : buttons()) {
    b.disabled = !found || state.running;
    b.title = found ? (b.dataset.captionSong ? ROW_TITLE : "Caption every usable song with ACE-Step's LM") : NO_LM;
  }
}

function running(on) {
  state.running = on;
  $('btn-caption-cancel').hidden = !on;
  $('caption-lm').disabled = on;
  enable();
}

function statusOf(name) {
  return [...document.querySelectorAll('[data-caption-status]')].find((s) => s.dataset.captionStatus === name);
}

function progressText(text) {
  $('caption-progress').textContent = text;
}

async function start(names) {
  if (state.running) return;
  const lm = $('caption-lm').value || null;
  try {
    running(true);
    progressText("Starting ACE-Step's LM…");
    const started = await invoke('caption_songs', { names, lm });
    if (started.batch > state.ended) progressText(`Captioning ${started.songs} song${started.songs === 1 ? '' : 's'} with ${started.lm}…`);
  } catch (e) {
    running(false);
    progressText('');
    state.hooks.say(errorText(e), { error: true });
  }
}

function stale(event) {
  return event.batch <= state.ended;
}

function onProgress(p) {
  if (stale(p)) return;
  running(true);
  if (!p.song) {
    progressText(`Loading ACE-Step's LM for ${p.songs} song${p.songs === 1 ? '' : 's'}…`);
    return;
  }
  const status = statusOf(p.song);
  if (status) {
    status.textContent = '';
    status.className = 'caption-status';
  }
  const at = `Captioning ${p.number} / ${p.songs}: ${p.song}`;
  if (p.stage === 'listening') progressText(`${at} · listening ${Math.round(p.seconds)} / ${Math.round(p.of)} s`);
  else if (p.stage === 'writing') progressText(`${at} · writing, ${p.tokens} tokens (at most ${p.budget})`);
}

/** A song's outcome holds whenever it arrives. */
function onSong(s) {
  const status = statusOf(s.song);
  if (s.error) {
    if (status) {
      status.textContent = s.error;
      status.className = 'caption-status problem';
    }
    return;
  }
  state.hooks.updateRow(s.row);
  const guesses = {};
  for (const [field, value] of Object.entries(s.guesses)) guesses[field] = { value, from: 'lm' };
  if (Object.keys(guesses).length) state.hooks.offerEstimates(s.song, guesses);
  if (status) {
    const refused = s.refused.map(([field, value, why]) => `its ${field} "${value}" is left out: ${why}`);
    status.textContent = ["captioned by ACE-Step's LM", ...refused].join('; ');
    status.className = 'caption-status note';
  }
}

function onDone(d) {
  if (stale(d)) return;
  state.ended = d.batch;
  running(false);
  if (d.error) {
    progressText('');
    state.hooks.say(d.error, { error: true });
    return;
  }
  const failed = d.failed ? ` (${d.failed} failed: see their rows)` : '';
  const what = d.cancelled ? `Captioning cancelled after ${d.captioned + d.failed} of ${d.songs}` : `Captioned ${d.captioned} of ${d.songs}`;
  progressText(`${what}${failed}${d.captioned ? ": the LM's tempo, key and meter are estimates to accept" : ''}`);
}

/** The Model panel's LM download, in view and focused. */
function showLmDownload() {
  const choice = $('download-lm');
  choice.scrollIntoView({ block: 'center' });
  choice.focus();
}
