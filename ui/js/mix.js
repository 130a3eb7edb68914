// Generate's mix: other adapters (any run's kept ones, as the engine lists them), each at
// its own strength, and a strength per part of each layer (self-attention,
// cross-attention, MLP). The engine checks them; its errors land on the field they name
// (`more_adapters[1].scale`, `parts`), in whichever form asked.

import { invoke, errorText } from './api.js';

const $ = (id) => document.getElementById(id);

let adapters = []; // AdapterChoiceView: {run, run_dir, kind, step, path}, newest runs first
let say = () => {};

/** "calm-run · step 40", "calm-run · final". */
export function adapterLabel(a) {
  return `${a.run} · ${a.kind === 'step' ? `step ${a.step}` : a.kind}`;
}

/** Every adapter the runs keep, as last fetched. */
export const keptAdapters = () => adapters;

/** Fetches the adapters the runs keep and refreshes the mix's pickers (a pick kept). */
export async function refreshAdapters() {
  adapters = await invoke('adapter_choices');
  for (const select of document.querySelectorAll('#gen-mix select')) fillPicker(select, select.value);
}

function fillPicker(select, value) {
  select.replaceChildren(...adapters.map((a) => new Option(adapterLabel(a), a.path)));
  if (adapters.some((a) => a.path === value)) select.value = value;
}

function mixRow(path) {
  const li = document.createElement('li');
  li.className = 'mix-row';
  li.dataset.testid = 'mix-row';
  const select = document.createElement('select');
  select.dataset.testid = 'mix-adapter';
  select.setAttribute('aria-label', 'Adapter to mix in');
  fillPicker(select, path);
  const scale = document.createElement('input');
  Object.assign(scale, { type: 'number', min: '0', max: '4', step: '0.05', value: '1' });
  scale.dataset.testid = 'mix-strength';
  scale.setAttribute('aria-label', 'Its strength');
  const error = document.createElement('small');
  error.className = 'field-error';
  const remove = document.createElement('button');
  remove.type = 'button';
  remove.className = 'btn small ghost';
  remove.textContent = 'Remove';
  remove.addEventListener('click', () => { li.remove(); renumber(); });
  li.append(select, scale, remove, error);
  return li;
}

/** Error targets follow each row's place. */
function renumber() {
  [...$('gen-mix').children].forEach((li, i) => { li.querySelector('.field-error').dataset.errorFor = `more_adapters[${i}].scale`; });
}

/** The adapters mixed in, in order: `[{path, scale}]`. */
export function mixChoices() {
  return [...$('gen-mix').children].map((li) => ({
    path: li.querySelector('select').value,
    scale: Number(li.querySelector('input').value),
  }));
}

/** The strength of each part of each layer, on every adapter. */
export function partStrengths() {
  return { self: Number($('gen-part-self').value), cross: Number($('gen-part-cross').value), mlp: Number($('gen-part-mlp').value) };
}

/** Shows a refused request's field errors beside their fields in `form` (none: clears
 * them) and returns the whole error in words. */
export function markFields(form, e) {
  const fields = e?.fields || {};
  for (const el of form.querySelectorAll('[data-error-for]')) el.textContent = fields[el.dataset.errorFor] || '';
  const named = Object.entries(fields).map(([field, why]) => `${field}: ${why}`);
  return named.length ? named.join('; ') : errorText(e);
}

export function setupMix(options) {
  say = options.say;
  $('btn-add-mix').addEventListener('click', () => {
    if (!adapters.length) {
      say('No run keeps an adapter yet: train one to a checkpoint first.', { error: true });
      return;
    }
    $('gen-mix').append(mixRow(adapters[0].path));
    renumber();
  });
}
