// Listening: a run's previews (the base model pinned first), Generate with the run's
// adapter (other adapters mixed in: mix.js), its A/B pairs (ab.js), and the dataset's
// songs, all through the one player (player.js); pictures are SVG drawn by the engine.

import { invoke, listen, errorText } from './api.js';
import * as fmt from './format.js';
import { playButton, runAudio, audioPicture, stageText, stageProgress, setupPlayer } from './player.js';
import { refreshAdapters, mixChoices, partStrengths, markFields, setupMix } from './mix.js';
import { showPairs, setupAb } from './ab.js';

const $ = (id) => document.getElementById(id);

const state = {
  dir: null,        // the run whose previews and songs are shown
  previews: [],     // PreviewView, as the backend lists them
  songs: new Map(), // song id -> its row
  say: () => {},
};

/** A row with a play button, a title, details and the engine's picture of the file. */
function audioRow(path, title, detail, testid) {
  const li = document.createElement('li');
  li.className = 'audio-row';
  li.dataset.testid = testid;
  li.dataset.path = path;
  const text = document.createElement('div');
  text.className = 'audio-text';
  const b = document.createElement('b');
  b.textContent = title;
  const small = document.createElement('small');
  small.textContent = detail;
  text.append(b, small);
  li.append(playButton(path, runAudio(path)), text, audioPicture(path));
  return li;
}

// ---- previews -------------------------------------------------------------------

/** A preview's title; with several prompts, its prompt's number first. */
function previewTitle(step, prompt) {
  const when = step === 0 ? 'Base model (before training)' : `Step ${step}`;
  return state.previews.some((q) => q.prompt > 0) ? `Prompt ${prompt + 1} · ${when}` : when;
}

function previewRow(p) {
  const title = previewTitle(p.step, p.prompt ?? 0);
  const detail = `${p.caption || 'no caption'} · ${fmt.duration(p.seconds)} · made in ${fmt.duration(p.took_s)}`;
  const li = audioRow(p.path, title, detail, p.step === 0 ? 'preview-base' : 'preview');
  li.dataset.step = String(p.step);
  li.dataset.prompt = String(p.prompt ?? 0);
  return li;
}

/** Puts a preview's row in its place: by prompt, the base model first, then the newest. Rows
 * already shown stay as they are (their pictures drawn once, a pressed Play kept). */
function insertPreview(p) {
  const list = $('preview-list');
  list.querySelector('.empty')?.remove();
  // By prompt; within one, the base model first, then the newest.
  const prompt = p.prompt ?? 0;
  const next = [...list.children].find((r) => {
    const other = Number(r.dataset.prompt);
    if (other !== prompt) return other > prompt;
    return r.dataset.step !== '0' && (p.step === 0 || Number(r.dataset.step) < p.step);
  });
  list.insertBefore(previewRow(p), next ?? null);
  // A second prompt's first preview: the first prompt's rows say theirs too.
  for (const row of list.querySelectorAll('[data-prompt="0"]')) {
    row.querySelector('.audio-text b').textContent = previewTitle(Number(row.dataset.step), 0);
  }
  $('listen-count').textContent = String(state.previews.length);
}

function showPreviews() {
  const list = $('preview-list');
  list.replaceChildren();
  $('listen-count').textContent = '';
  for (const p of state.previews) insertPreview(p);
  if (!state.previews.length) {
    list.innerHTML = '<li class="empty">No previews yet. Set "Preview every" (steps) in the settings to hear the adapter as it trains.</li>';
  }
}

/** Shows the run in `dir` (null: none): its previews, its songs (made in any session),
 * and Generate from it. */
export async function showRun(dir, name) {
  const changed = state.dir !== dir;
  if (changed) $('song-list').replaceChildren();
  state.dir = dir;
  $('listen-run').textContent = dir ? `Run ${name || dir}` : 'No run yet: start one, or pick one in History.';
  $('btn-generate').disabled = !dir;
  state.previews = [];
  if (!dir) {
    showPairs(null, null);
    return showPreviews();
  }
  let saved = [];
  let adapter = null;
  try {
    state.previews = await invoke('run_previews', { dir });
    if (changed) saved = await invoke('run_songs', { dir });
    adapter = await invoke('run_adapter', { dir });
    showAdapter(dir, name, adapter);
    await refreshAdapters();
  } catch (e) {
    state.say(errorText(e), { error: true });
  }
  if (state.dir !== dir) return;
  showPairs(dir, adapter?.path ?? null);
  showPreviews();
  // Newest first, as Generate adds them; below any asked for meanwhile.
  for (const s of saved.reverse()) $('song-list').append(savedSongRow(s));
}

/** The run's name with the trigger word kept in its adapter's files (its settings on hover). */
function showAdapter(dir, name, adapter) {
  if (state.dir !== dir || !adapter) return;
  const trigger = adapter.trigger ? `trigger "${adapter.trigger}" (${adapter.trigger_position})` : 'no trigger word';
  const el = $('listen-run');
  el.textContent = `Run ${name || dir} · ${trigger}`;
  el.title = `${adapter.settings} · ${trigger}`;
  el.dataset.trigger = adapter.trigger ?? '';
}

/** A `preview` engine event of the run in `dir`: shown at once when it is the one shown. */
export function onPreview(ev, dir) {
  if (!dir || dir !== state.dir) return;
  const path = `${dir}/${ev.path}`;
  const prompt = ev.prompt ?? 0;
  if (state.previews.some((p) => p.step === ev.step && p.prompt === prompt)) return;
  const p = { step: ev.step, prompt, path, caption: ev.caption, seconds: ev.seconds, took_s: ev.took_s };
  state.previews.push(p);
  insertPreview(p);
}

// ---- generate -------------------------------------------------------------------

function choices() {
  return {
    caption: $('gen-caption').value,
    lyrics: $('gen-lyrics').value,
    duration_seconds: Number($('gen-duration').value),
    seed: Number($('gen-seed').value),
    adapter_scale: Number($('gen-strength').value),
    plan_with_lm: $('gen-plan-lm').checked,
    more_adapters: mixChoices(),
    parts: partStrengths(),
  };
}

/** The song an A/B pair makes: Generate's, its voices setting the adapters. */
function pairSong() {
  const { adapter_scale: _, more_adapters: __, ...song } = choices();
  return song;
}

async function generate() {
  if (!state.dir) return;
  const c = choices();
  markFields($('generate-form'));
  try {
    const id = await invoke('generate_song', { dir: state.dir, choices: c });
    const li = document.createElement('li');
    li.className = 'audio-row pending';
    li.dataset.testid = 'song';
    li.dataset.song = String(id);
    li.dataset.stage = 'waiting';
    const text = document.createElement('div');
    text.className = 'audio-text';
    const b = document.createElement('b');
    b.textContent = songTitle(c);
    const status = document.createElement('small');
    status.textContent = 'Asked…';
    const bar = document.createElement('progress');
    bar.max = 1;
    bar.value = 0;
    bar.dataset.testid = 'song-progress';
    text.append(b, status, bar);
    li.append(text);
    $('song-list').prepend(li);
    state.songs.set(id, li);
  } catch (e) {
    state.say(markFields($('generate-form'), e), { error: true });
  }
}

const songTitle = (s) => {
  const mixed = s.more_adapters?.length ? ` + ${s.more_adapters.length} mixed in` : '';
  return `${s.caption || 'no caption'} · strength ${s.adapter_scale}${mixed} · seed ${s.seed}`;
};

/** A song saved under the run, listed again. */
function savedSongRow(s) {
  const title = s.problem ? 'A song whose settings are unreadable' : songTitle(s);
  const detail = s.problem || `${fmt.duration(s.seconds)} · saved in ${s.path}`;
  const row = audioRow(s.path, title, detail, 'song');
  row.dataset.stage = 'written';
  return row;
}

/** A `song` event: the progress of a song asked for. */
function onSong(p) {
  const li = state.songs.get(p.id);
  if (!li) return;
  li.dataset.stage = p.stage;
  const [status, bar] = [li.querySelector('small'), li.querySelector('progress')];
  const progress = stageProgress(p);
  if (progress !== null) bar.value = progress;
  switch (p.stage) {
    case 'written': {
      const row = audioRow(p.path, li.querySelector('b').textContent, `${fmt.duration(p.seconds)} · saved in ${p.path}`, 'song');
      row.dataset.song = String(p.id);
      row.dataset.stage = 'written';
      li.replaceWith(row);
      state.songs.set(p.id, row);
      break;
    }
    case 'failed':
      status.textContent = stageText(p);
      li.classList.add('bad');
      bar.remove();
      break;
    default:
      status.textContent = stageText(p) ?? '';
  }
}

// ---- the dataset ------------------------------------------------------------------

/** Play buttons of a usable dataset song: as it is, and as the model hears it. */
export function datasetButtons(name) {
  const box = document.createElement('div');
  box.className = 'actions';
  const file = playButton(`dataset:${name}`, () => invoke('dataset_audio', { name, heard: false }), 'Play');
  file.dataset.testid = 'dataset-play';
  file.title = 'The file as it is';
  const heard = playButton(`heard:${name}`, () => invoke('dataset_audio', { name, heard: true }), 'As heard');
  heard.dataset.testid = 'dataset-heard';
  heard.title = 'As the model hears it: its cached latents decoded (train once with latent caching on)';
  box.append(file, heard);
  return box;
}

export async function setupListen({ say }) {
  state.say = say;
  setupPlayer({ say });
  setupMix({ say });
  await setupAb({ say, song: pairSong });
  $('btn-generate').addEventListener('click', generate);
  const strength = $('gen-strength');
  const show = () => { $('gen-strength-value').textContent = Number(strength.value) === 0 ? '0 (base model)' : strength.value; };
  strength.addEventListener('input', show);
  show();
  await listen('song', onSong);
}
