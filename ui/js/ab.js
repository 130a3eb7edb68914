// A/B at the same seed: two voices (the base model, this run's adapter at a kept step,
// another run's adapter, the mix set in Generate) make Generate's song at its seed, one
// after the other; the pair plays side by side with the engine's pictures of both, and
// is kept in the run's `ab` folder, so it is listed (and played) again later.

import { invoke, listen } from './api.js';
import { playButton, runAudio, audioPicture, stageText, stageProgress } from './player.js';
import { adapterLabel, keptAdapters, mixChoices, markFields } from './mix.js';

const $ = (id) => document.getElementById(id);
const baseName = (path) => path.split(/[\\/]/).filter(Boolean).pop();

const state = {
  dir: null,         // the run the pairs are made from
  own: null,         // its newest adapter folder (the mix's first), null before one
  pairs: new Map(),  // pair id -> its row, while it is made
  say: () => {},
  song: () => ({}),  // Generate's song: caption, lyrics, seconds, seed, plan, parts
};

/** The voices a side can be, `select`'s pick kept where it is still offered. */
function fillVoices(select) {
  const keep = select.value;
  const mine = state.dir && baseName(state.dir);
  const option = (voice, text) => new Option(text, JSON.stringify(voice));
  const options = [option({ kind: 'base' }, 'The base model')];
  for (const a of keptAdapters()) {
    if (a.run === mine && a.kind === 'step') options.push(option({ kind: 'step', step: a.step }, `This run · step ${a.step}`));
    else options.push(option({ kind: 'adapter', path: a.path }, a.run === mine ? `This run · ${a.kind}` : adapterLabel(a)));
  }
  options.push(option({ kind: 'mix' }, 'The mix set in Generate'));
  select.replaceChildren(...options);
  if (options.some((o) => o.value === keep)) select.value = keep;
}

/** A strength means something for one adapter; the base model and the mix set their own. */
function syncStrength(side) {
  const kind = JSON.parse($(`ab-${side}`).value || '{}').kind;
  $(`ab-${side}-strength`).disabled = kind === 'base' || kind === 'mix';
}

/** A side's voice as the engine takes it. */
function voice(side) {
  const picked = JSON.parse($(`ab-${side}`).value);
  if (picked.kind === 'base') return picked;
  if (picked.kind === 'mix') {
    const own = state.own ? [{ path: state.own, scale: Number($('gen-strength').value) }] : [];
    return { kind: 'mix', adapters: [...own, ...mixChoices()] };
  }
  return { ...picked, scale: Number($(`ab-${side}-strength`).value) };
}

function voiceText(side) {
  const select = $(`ab-${side}`);
  return select.options[select.selectedIndex]?.text || '';
}

// ---- a pair's row -------------------------------------------------------------------

function sideBox(pairKey, side, view) {
  const box = document.createElement('div');
  box.className = 'pair-side';
  box.dataset.side = side;
  box.dataset.testid = `pair-${side}`;
  const head = document.createElement('b');
  head.textContent = `${side.toUpperCase()} · ${view.voice || 'unknown voice'}`;
  const status = document.createElement('small');
  box.append(head, status);
  if (view.path) made(box, pairKey, view.path);
  else status.textContent = 'Not made';
  return box;
}

/** A side made: its play button (switching sides keeps the place) and its picture. */
function made(box, pairKey, path) {
  box.dataset.path = path;
  box.dataset.stage = 'written';
  box.querySelector('small').textContent = '';
  box.querySelector('progress')?.remove();
  const play = playButton(path, runAudio(path), `Play ${box.dataset.side.toUpperCase()}`, pairKey);
  box.querySelector('b').before(play);
  box.append(audioPicture(path));
}

function pairRow(view, key) {
  const li = document.createElement('li');
  li.className = 'pair';
  li.dataset.testid = 'pair';
  const head = document.createElement('div');
  head.className = 'pair-head';
  head.textContent = view.problem
    ? `A pair whose request is unreadable: ${view.problem}`
    : `${view.caption || 'no caption'} · seed ${view.seed} · ${view.seconds} s`;
  const sides = document.createElement('div');
  sides.className = 'pair-sides';
  sides.append(sideBox(key, 'a', view.a), sideBox(key, 'b', view.b));
  li.append(head, sides);
  li.dataset.stage = view.a.path && view.b.path ? 'written' : 'incomplete';
  return li;
}

/** Shows the pairs kept under the run in `dir` (null: none), newest first, and offers its
 * voices. `own` is its newest adapter folder. */
export async function showPairs(dir, own) {
  state.dir = dir;
  state.own = own;
  $('btn-ab').disabled = !dir;
  const list = $('pair-list');
  list.replaceChildren();
  for (const side of ['a', 'b']) fillVoices($(`ab-${side}`));
  // B starts as the run's own newest adapter, A as the base model.
  if ($('ab-a').value === $('ab-b').value && $('ab-b').options.length > 2) $('ab-b').selectedIndex = 1;
  for (const side of ['a', 'b']) syncStrength(side);
  if (!dir) return;
  let pairs = [];
  try {
    pairs = await invoke('run_pairs', { dir });
  } catch (e) {
    state.say(markFields($('ab-form'), e), { error: true });
  }
  if (state.dir !== dir) return;
  for (const p of pairs.reverse()) list.append(pairRow(p, p.dir));
}

async function makePair() {
  if (!state.dir) return;
  const song = state.song();
  const choices = { a: voice('a'), b: voice('b'), song };
  markFields($('ab-form'));
  let id;
  try {
    id = await invoke('generate_pair', { dir: state.dir, choices });
  } catch (e) {
    state.say(markFields($('ab-form'), e), { error: true });
    return;
  }
  const view = {
    caption: song.caption,
    seed: song.seed,
    seconds: song.duration_seconds,
    a: { voice: voiceText('a') },
    b: { voice: voiceText('b') },
  };
  const li = pairRow(view, `pair-${id}`);
  li.dataset.stage = 'making';
  li.dataset.pair = String(id);
  for (const box of li.querySelectorAll('.pair-side')) {
    box.querySelector('small').textContent = box.dataset.side === 'a' ? 'Asked…' : 'After A';
    const bar = document.createElement('progress');
    bar.max = 1;
    bar.value = 0;
    box.append(bar);
  }
  $('pair-list').prepend(li);
  state.pairs.set(id, li);
}

/** A `pair` event: the progress of one side of a pair asked for. */
function onPair(p) {
  const li = state.pairs.get(p.id);
  if (!li) return;
  const box = li.querySelector(`.pair-side[data-side=${p.side}]`);
  if (p.stage === 'written') {
    made(box, `pair-${p.id}`, p.path);
    if (li.querySelectorAll('.pair-side[data-stage=written]').length === 2) li.dataset.stage = 'written';
    return;
  }
  box.querySelector('small').textContent = stageText(p) ?? '';
  const progress = stageProgress(p);
  if (progress !== null) box.querySelector('progress').value = progress;
  if (p.stage === 'failed') {
    li.dataset.stage = 'failed';
    li.classList.add('bad');
  }
}

export async function setupAb(options) {
  state.say = options.say;
  state.song = options.song;
  $('btn-ab').addEventListener('click', makePair);
  for (const side of ['a', 'b']) $(`ab-${side}`).addEventListener('change', () => syncStrength(side));
  await listen('pair', onPair);
}
