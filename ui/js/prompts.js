// The run's own preview prompts in the settings: one row per prompt, its fields named as
// run.toml's [[preview_prompts]] names them. The engine checks them; its errors land on
// the field they name (`preview_prompts[1].bpm`).

const $ = (id) => document.getElementById(id);

// [field, label, kind, placeholder]: text stays text, numbers are sent as numbers.
const FIELDS = [
  ['caption', 'Caption', 'text', 'the preview caption'],
  ['lyrics', 'Lyrics', 'text', 'instrumental'],
  ['bpm', 'BPM', 'int', 'N/A'],
  ['keyscale', 'Key', 'text', 'N/A'],
  ['timesignature', 'Time sig.', 'text', 'N/A'],
  ['seconds', 'Seconds', 'float', 'default'],
  ['seed', 'Seed', 'int', 'run\'s'],
  ['steps', 'Steps', 'int', 'model\'s'],
  ['guidance', 'Guidance', 'float', 'model\'s'],
  ['more_adapters', 'Mix in', 'mix', 'adapter folder@strength, …'],
];

/** Adapters mixed in, as the field shows them: `folder@strength, folder@strength`. */
const mixText = (mixed) => (mixed || []).map((m) => `${m.path}@${m.scale}`).join(', ');

/** The field's text as adapters (a folder without `@` at strength 1); null if a strength is no number. */
function mixOf(text) {
  const mixed = text.split(',').map((t) => t.trim()).filter(Boolean).map((t) => {
    const at = t.lastIndexOf('@');
    return at < 0 ? { path: t, scale: 1 } : { path: t.slice(0, at).trim(), scale: Number(t.slice(at + 1)) };
  });
  return mixed.every((m) => Number.isFinite(m.scale)) ? mixed : null;
}

let onChange = () => {};

function promptRow(prompt, i) {
  const li = document.createElement('li');
  li.className = 'prompt-row';
  li.dataset.testid = 'preview-prompt';
  for (const [field, label, kind, placeholder] of FIELDS) {
    const wrap = document.createElement('label');
    wrap.className = `prompt-field prompt-${field}`;
    wrap.textContent = label;
    const input = document.createElement('input');
    input.type = 'text';
    input.spellcheck = false;
    input.placeholder = placeholder;
    if (kind === 'int' || kind === 'float') input.inputMode = 'decimal';
    input.dataset.promptField = field;
    input.dataset.kind = kind;
    input.dataset.testid = `prompt-${field}`;
    input.value = kind === 'mix' ? mixText(prompt[field]) : prompt[field] ?? '';
    input.addEventListener('change', onChange);
    const error = document.createElement('small');
    error.className = 'field-error';
    error.dataset.errorFor = `preview_prompts[${i}].${field}`;
    wrap.append(input, error);
    li.append(wrap);
  }
  const remove = document.createElement('button');
  remove.type = 'button';
  remove.className = 'btn small ghost';
  remove.textContent = 'Remove';
  remove.dataset.testid = 'remove-prompt';
  remove.addEventListener('click', () => { li.remove(); renumber(); onChange(); });
  li.append(remove);
  return li;
}

/** Error targets follow a row's place after one above it is removed. */
function renumber() {
  [...$('preview-prompts').children].forEach((li, i) => {
    for (const el of li.querySelectorAll('[data-error-for]')) el.dataset.errorFor = el.dataset.errorFor.replace(/\[\d+\]/, `[${i}]`);
  });
}

/** Shows the saved prompts, unless one is being typed in. */
export function showPrompts(prompts = []) {
  const list = $('preview-prompts');
  if (list.contains(document.activeElement)) return;
  list.replaceChildren(...prompts.map(promptRow));
}

/** The rows as run.toml's prompts; a number that is not one goes to `errors`. */
export function readPrompts(errors) {
  return [...$('preview-prompts').children].map((li, i) => {
    const prompt = {};
    for (const input of li.querySelectorAll('[data-prompt-field]')) {
      const raw = input.value.trim();
      if (raw === '') continue;
      const field = input.dataset.promptField;
      if (input.dataset.kind === 'text') { prompt[field] = raw; continue; }
      if (input.dataset.kind === 'mix') {
        const mixed = mixOf(raw);
        if (mixed) prompt[field] = mixed;
        else errors[`preview_prompts[${i}].${field}`] = 'enter folder@strength, separated by commas';
        continue;
      }
      const v = Number(raw);
      if (!Number.isFinite(v) || (input.dataset.kind === 'int' && !(Number.isInteger(v) && v >= 0))) {
        errors[`preview_prompts[${i}].${field}`] = input.dataset.kind === 'int' ? 'enter a whole number' : 'enter a number';
      } else prompt[field] = v;
    }
    return prompt;
  });
}

/** `changed`: saves the settings. */
export function setupPrompts(changed) {
  onChange = changed;
  $('btn-add-prompt').addEventListener('click', () => {
    const list = $('preview-prompts');
    list.append(promptRow({}, list.children.length));
    list.lastChild.querySelector('input').focus();
  });
}
