// The one player element, and the pieces every list of the Listen tab shows audio with:
// a play button, the engine's picture of a file, a song's stage in words. Audio comes
// from the backend as bytes (only files of the runs folder, or songs of the scanned
// dataset) and plays from a blob: URL.

import { invoke, errorText } from './api.js';
import { setSvg } from './svg.js';

const $ = (id) => document.getElementById(id);

let say = () => {};

/** Plays `key`'s audio (fetched by `load` the first time), or pauses it if it is playing.
 * Within one `group` (the two sides of an A/B pair) the other side picks up where the
 * one playing is, so the switch compares the same bars. */
async function toggle(key, load, button, group) {
  const player = $('player');
  if (player.dataset.key === key && !player.paused) {
    player.pause();
    return;
  }
  if (player.dataset.key !== key) {
    const at = group && player.dataset.group === group ? player.currentTime : 0;
    let bytes;
    try {
      bytes = await load();
    } catch (e) {
      say(errorText(e), { error: true });
      return;
    }
    if (player.src) URL.revokeObjectURL(player.src);
    player.src = URL.createObjectURL(new Blob([bytes], { type: 'audio/wav' }));
    player.dataset.key = key;
    player.dataset.group = group || '';
    player.dataset.bytes = String(bytes.byteLength);
    if (at > 0) player.addEventListener('loadedmetadata', () => { player.currentTime = Math.min(at, player.duration); }, { once: true });
  }
  for (const b of document.querySelectorAll('.play[aria-pressed=true]')) b.setAttribute('aria-pressed', 'false');
  button?.setAttribute('aria-pressed', 'true');
  player.play().catch((e) => say(`Cannot play: ${e.message || e}`, { error: true }));
}

export function playButton(key, load, label = 'Play', group = '') {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = 'btn small play';
  b.textContent = label;
  b.dataset.testid = 'play';
  b.setAttribute('aria-pressed', 'false');
  b.addEventListener('click', () => toggle(key, load, b, group));
  return b;
}

/** Loads a WAV of the runs folder. */
export const runAudio = (path) => () => invoke('audio_bytes', { path });

/** A box with the engine's picture (waveform) of a WAV of the runs folder. */
export function audioPicture(path) {
  const picture = document.createElement('div');
  picture.className = 'audio-picture';
  picture.dataset.testid = 'audio-picture';
  invoke('audio_picture', { path })
    .then((svg) => setSvg(picture, svg))
    .catch((e) => { picture.textContent = errorText(e); });
  return picture;
}

/** A `song` or `pair` event's stage in words (null for `written`). */
export function stageText(p) {
  switch (p.stage) {
    case 'waiting': return p.live ? 'Waiting for the run’s next step boundary…' : 'Loading the model and adapter…';
    case 'planning': return `The 5 Hz LM is writing the ${p.phase}: ${p.tokens} tokens`;
    case 'planned': return `Planned: ${p.codes} audio codes`;
    case 'unplanned': return `No 5 Hz LM plan: ${p.reason}`;
    case 'sampling': return `Sampling step ${p.step} of ${p.steps}`;
    case 'decoding': return 'Decoding…';
    case 'failed': return `Failed: ${p.message}`;
    default: return null;
  }
}

/** How far a song is, 0 to 1, for its progress bar (null: leave it). */
export function stageProgress(p) {
  if (p.stage === 'sampling') return p.steps ? (0.9 * p.step) / p.steps : 0;
  return p.stage === 'decoding' ? 0.9 : null;
}

export function setupPlayer(options) {
  say = options.say;
  $('player').addEventListener('ended', () => {
    for (const b of document.querySelectorAll('.play[aria-pressed=true]')) b.setAttribute('aria-pressed', 'false');
  });
}
