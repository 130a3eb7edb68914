// Ostinato's web view. It never computes training numbers: it shows what the backend
// says (get_state on load) and then follows its events:
//   run-state     the run's view after every change: the engine's RunState (status,
//                 preparation, latest step, ...) and what the user asked (pause, stop)
//   engine-event  every engine event ({type: "step" | "paused" | ...}), for the activity list
//   charts        fresh SVG charts from the engine's chart module (>= 2 Hz while running)

import { invoke, listen, onDragDrop, errorText, available } from './api.js';
import * as fmt from './format.js';
import { setSvg } from './svg.js';
import { followPointer } from './readout.js';
import { setupModels, refreshModels } from './models.js';
import { showShortcuts, followMenu } from './native.js';
import { setupListen, showRun, onPreview } from './listen.js';
import { setupEditor, showDataset as showEditor, markFileProblem, updateRow, offerEstimates } from './editor.js';
import { setupCaptions } from './captions.js';
import { setupPrompts, showPrompts, readPrompts } from './prompts.js';

const $ = (id) => document.getElementById(id);

const ui = {
  settings: null,      // as last saved by the backend
  run: null,           // RunView (the latest run-state)
  dataset: null,       // DatasetView
  stepAt: 0,           // performance.now() when the last step arrived
  preparing: false,    // the dataset line shows the run's preparation
  runs: [],
  saveChain: Promise.resolve(),
};

// The charts the backend draws (keys of its Charts), in the order they are shown.
const CHARTS = ['loss', 'noise_levels', 'throughput', 'memory'];

const STATUS_TEXT = {
  idle: 'Idle', running: 'Running', pausing: 'Pausing…', paused: 'Paused',
  stopping: 'Stopping…', stopped: 'Stopped', finished: 'Finished', failed: 'Failed',
};

// ---- messages ---------------------------------------------------------------------

let messageTimer = 0;
function say(text, { error = false, sticky = false } = {}) {
  const el = $('message');
  el.textContent = text;
  el.classList.toggle('error', error);
  el.title = text;
  clearTimeout(messageTimer);
  if (!sticky) messageTimer = setTimeout(() => { el.textContent = ''; }, error ? 12000 : 5000);
}

function activity(text, cls = '') {
  const list = $('activity');
  list.querySelector('.empty')?.remove();
  const li = document.createElement('li');
  if (cls) li.className = cls;
  const t = document.createElement('time');
  t.textContent = fmt.clock();
  const span = document.createElement('span');
  span.textContent = text;
  li.append(t, span);
  list.prepend(li);
  while (list.children.length > 50) list.lastChild.remove();
}

// ---- settings ---------------------------------------------------------------------

/** The form's controls: each names a run.toml path of the next run's config
 * (`data-setting`, kept in `settings.run`) or one of the app's own settings
 * (`data-app-setting`). */
function settingInputs() {
  return [...document.querySelectorAll('[data-setting], [data-app-setting]')];
}

/** The control's key: its run.toml path, or the app setting's name. */
function settingKey(el) {
  return el.dataset.setting ?? el.dataset.appSetting;
}

function settingValue(s, el) {
  if (el.dataset.appSetting) return s[el.dataset.appSetting];
  return el.dataset.setting.split('.').reduce((o, part) => o?.[part], s.run);
}

function setSetting(s, el, value) {
  if (el.dataset.appSetting) { s[el.dataset.appSetting] = value; return; }
  const parts = el.dataset.setting.split('.');
  const parent = parts.slice(0, -1).reduce((o, part) => (o[part] ??= {}), s.run);
  parent[parts.at(-1)] = value;
}

/** Fills each choice with the engine's names (or [name, what it means] pairs). */
function fillChoices(choices = {}) {
  for (const el of document.querySelectorAll('[data-choices]')) {
    if (el.options.length) continue;
    for (const choice of choices[el.dataset.choices] || []) {
      const [name, label] = Array.isArray(choice) ? choice : [choice, choice.replace(/_/g, ' ')];
      el.add(new Option(label, name));
    }
  }
}

/** The modules the engine's target group `name` names. */
function groupModules(name) {
  return (ui.choices?.target_groups || []).find(([group]) => group === name)?.[1] || [];
}

/** Whether `targets` train every module of group `name`, matched by suffix as PEFT
 * matches target names (`q_proj` trains `self_attn.q_proj`). */
function coversGroup(targets, name) {
  const modules = groupModules(name);
  return modules.length > 0 && modules.every((m) => (targets || []).some((t) => m === t || m.endsWith(`.${t}`)));
}

/** The ticked target groups as the adapter's targets, unless they are what is shown
 * (a list of other module names, from run.toml, stays as it is). */
function readTargets(s) {
  const boxes = [...document.querySelectorAll('[data-kind="targets"]')];
  const targets = s.run.lora.target_modules;
  if (boxes.every((b) => b.checked === coversGroup(targets, b.dataset.group))) return;
  s.run.lora.target_modules = boxes.filter((b) => b.checked).flatMap((b) => groupModules(b.dataset.group));
}

function showSettings(s) {
  for (const el of settingInputs()) {
    const v = settingValue(s, el);
    // An optional switch (unset) shows its engine default.
    if (el.dataset.kind === 'bool') el.checked = Boolean(v ?? el.dataset.default === 'true');
    else if (el.dataset.kind === 'targets') el.checked = coversGroup(v, el.dataset.group);
    // A table without `kind` is the first choice (AdamW's table has none).
    else if (el.dataset.kind === 'choice') el.value = v?.kind ?? el.options[0]?.value;
    else if (el.dataset.kind === 'enum') el.value = v ?? el.options[0].value;
    else if (document.activeElement !== el) el.value = v ?? '';
  }
  showPrompts(s.run.preview_prompts);
  // Settings of one adapter kind only (LoKr's factor) show while it is chosen.
  for (const el of document.querySelectorAll('[data-only-adapter]')) el.hidden = (s.run.lora.kind ?? 'lora') !== el.dataset.onlyAdapter;
  const folder = s.run.model && s.run.model.kind === 'folder';
  $('model-demo').checked = !folder;
  $('model-folder').checked = folder;
  $('model-path').value = folder ? s.run.model.path : '';
  const dataset = s.run.data?.folder;
  if (dataset && document.activeElement !== $('dataset-path')) $('dataset-path').value = dataset;
  updateStatusBar();
}

/** Reads the form; returns [settings, localErrors]. */
function readSettings() {
  const s = structuredClone(ui.settings);
  const errors = {};
  for (const el of settingInputs()) {
    const key = settingKey(el);
    const kind = el.dataset.kind;
    const raw = el.value.trim();
    // Optional settings (opt*): empty is null, the engine's default or off.
    if (kind === 'targets') continue; // read together, below
    if (kind === 'bool') setSetting(s, el, el.checked);
    // A new choice is its kind alone: the engine fills in that choice's defaults.
    else if (kind === 'choice') {
      const current = settingValue(s, el);
      if ((current?.kind ?? el.options[0]?.value) !== el.value) setSetting(s, el, { kind: el.value });
    } else if (kind === 'enum') setSetting(s, el, el.value);
    else if (kind.startsWith('opt') && raw === '') setSetting(s, el, null);
    // A setting run.toml omits at its default (LoKr's factor): empty sends none.
    else if (kind === 'signedint' && raw === '') setSetting(s, el, undefined);
    else if (kind === 'opttext') setSetting(s, el, raw);
    else {
      const v = Number(raw);
      if (raw === '' || !Number.isFinite(v)) errors[key] = 'enter a number';
      else if (kind.endsWith('int') && (!Number.isInteger(v) || (v < 0 && kind !== 'signedint'))) errors[key] = 'enter a whole number';
      else setSetting(s, el, v);
    }
  }
  readTargets(s);
  s.run.preview_prompts = readPrompts(errors);
  // No tag, no trigger (its position alone means nothing).
  if (!s.run.data.trigger?.tag) s.run.data.trigger = null;
  if ($('model-folder').checked) s.run.model = { kind: 'folder', path: $('model-path').value };
  else s.run.model = { kind: 'demo' };
  return [s, errors];
}

function markErrors(fields = {}) {
  for (const el of document.querySelectorAll('[data-error-for]')) {
    const key = el.dataset.errorFor;
    // A list's field takes its items' errors too (`preview_prompts[0].more_adapters[1].path`).
    el.textContent = fields[key] || Object.entries(fields).find(([f]) => f.startsWith(`${key}[`))?.[1] || '';
    document.querySelector(`[data-setting="${key}"], [data-app-setting="${key}"]`)?.setAttribute('aria-invalid', fields[key] ? 'true' : 'false');
  }
  const modelErr = fields.model;
  if (modelErr) say(modelErr, { error: true });
}

/** The model the saved settings train (2B or XL, turbo, base or SFT) and the engine's
 *  predicted peak for them (fitted when they ask), before Start. */
async function showMemoryPlan() {
  const el = $('memory-plan');
  try {
    const plan = await invoke('memory_plan');
    const changes = plan.changes.length ? ` · fitted: ${plan.changes.join(', ')}` : '';
    const model = plan.model ? `${plan.model} model · ` : '';
    const said = plan.fits ? `${plan.summary}${changes}` : plan.problem;
    el.textContent = `${model}${said}`.replace(/^./, (c) => c.toUpperCase());
    el.classList.toggle('error', !plan.fits);
    el.dataset.fits = String(plan.fits);
  } catch (e) {
    el.textContent = `Predicted memory unknown: ${errorText(e)}`;
    el.classList.add('error');
    delete el.dataset.fits;
  }
}

function setSaveStatus(text, error = false) {
  const el = $('settings-status');
  el.textContent = text;
  el.classList.toggle('error', error);
  el.dataset.state = error ? 'error' : text === 'Saved' ? 'saved' : 'saving';
}

/** Saves the form (serialized: one save at a time, in order). */
function saveSettings() {
  const [s, localErrors] = readSettings();
  if (Object.keys(localErrors).length) {
    markErrors(localErrors);
    setSaveStatus('Fix the marked fields', true);
    return ui.saveChain;
  }
  setSaveStatus('Saving…');
  ui.saveChain = ui.saveChain.then(async () => {
    try {
      ui.settings = await invoke('save_settings', { settings: s });
      // The engine may have set more than was changed (a new optimizer's lr and schedule).
      showSettings(ui.settings);
      markErrors({});
      setSaveStatus('Saved');
      updateStatusBar();
      showMemoryPlan();
    } catch (e) {
      markErrors(e.fields || {});
      setSaveStatus(e.fields ? 'Fix the marked fields' : 'Not saved', true);
      if (!e.fields) say(errorText(e), { error: true });
    }
  });
  return ui.saveChain;
}

let saveTimer = 0;
function saveSoon() {
  clearTimeout(saveTimer);
  setSaveStatus('Editing…');
  saveTimer = setTimeout(saveSettings, 350);
}

// ---- dataset ----------------------------------------------------------------------

async function scanDataset(path) {
  path = (path || '').trim();
  if (!path) return;
  $('dataset-path').value = path;
  const summary = $('dataset-summary');
  summary.classList.remove('error');
  summary.textContent = 'Scanning…';
  try {
    ui.dataset = await invoke('scan_dataset', { path });
    showDataset(ui.dataset);
  } catch (e) {
    summary.textContent = errorText(e);
    summary.classList.add('error');
    summary.dataset.kind = e.kind || 'error';
  }
  // The folder is remembered even when the scan failed.
  try { ui.settings = (await invoke('get_state')).settings; } catch { /* keep */ }
}

function showDataset(d) {
  const summary = $('dataset-summary');
  summary.classList.remove('error');
  if (!d) return;
  summary.replaceChildren();
  const b = (t) => { const x = document.createElement('b'); x.textContent = t; return x; };
  summary.append(b(String(d.usable)), ` usable song${d.usable === 1 ? '' : 's'} · `, b(fmt.duration(d.total_duration_s)));
  if (d.bad) summary.append(' · ', b(String(d.bad)), ' with problems');
  $('files-count').textContent = String(d.files.length);
  showEditor(d);
}

// ---- runs -------------------------------------------------------------------------

/** The status in the window's words: the engine's, or what the user asked and it has not yet done. */
function shownStatus(run) {
  if (!run) return 'idle';
  if (run.requested === 'stop') return 'stopping';
  if (run.requested === 'pause' && run.status === 'running') return 'pausing';
  return run.status;
}

/** Shows a run view. Views arrive in the order the backend made them: the last one is the state. */
function setRun(run) {
  if (!run) return;
  const prev = ui.run;
  ui.run = run;
  if (run.last_step && run.last_step.elapsed_s !== prev?.last_step?.elapsed_s) ui.stepAt = performance.now();
  showRunStatus();
  showStep(run.last_step);
  showPreparation();
  updateStatusBar();
  if (prev?.active && !run.active) refreshRuns();
  // A new run is the one the Listen tab shows.
  if (run.run_dir && run.run_dir !== prev?.run_dir) showRun(run.run_dir, run.run_dir.split('/').pop());
  if (run.status === 'failed' && run.reason && prev?.status !== 'failed') say(`Run failed: ${run.reason}`, { error: true, sticky: true });
}

function showRunStatus() {
  const status = shownStatus(ui.run);
  const active = Boolean(ui.run?.active);
  const pill = $('run-status');
  pill.dataset.status = status;
  pill.textContent = STATUS_TEXT[status] || status;
  document.body.dataset.runStatus = status;
  $('btn-start').disabled = active;
  $('btn-pause').disabled = status !== 'running';
  $('btn-resume').disabled = !(status === 'paused' || status === 'pausing');
  $('btn-stop').disabled = !active || status === 'stopping';
  $('btn-pause').hidden = status === 'paused';
  $('btn-resume').hidden = status !== 'paused';
  $('settings-fields').disabled = active;
  $('settings-hint').textContent = active
    ? 'Settings apply to the next run.'
    : "Defaults follow ACE-Step's LoRA recipe.";
}

/** The dataset line follows the run: its preparation while that goes on, then the folder again. */
function showPreparation() {
  const p = ui.run?.active ? ui.run.preparing : null;
  const bar = $('dataset-progress');
  bar.hidden = !p;
  if (p) {
    bar.value = p.fraction;
    const name = String(p.file).split(/[\\/]/).pop();
    const encoded = p.seconds ? ` (${name}: ${Math.round(p.seconds[0])} of ${Math.round(p.seconds[1])} s encoded)` : '';
    $('dataset-summary').textContent = `Preparing ${p.done} / ${p.total}${encoded}…`;
    ui.preparing = true;
  } else if (ui.preparing) {
    ui.preparing = false;
    const used = ui.run?.started?.dataset;
    if (ui.dataset) showDataset(ui.dataset);
    else $('dataset-summary').textContent = used ? `${used.usable} songs prepared` : '';
  }
}

function showStep(ev) {
  const set = (id, text) => { $(id).textContent = text; };
  if (!ev) {
    for (const id of ['stat-step', 'stat-epoch', 'stat-loss', 'stat-throughput', 'stat-memory', 'stat-lr']) set(id, '—');
    return;
  }
  set('stat-step', String(ev.step));
  set('stat-epoch', ev.epoch != null ? String(ev.epoch + 1) : '—');
  set('stat-loss', fmt.num(ev.loss));
  set('stat-throughput', fmt.rate(ev.samples_per_sec));
  set('stat-memory', `${fmt.bytes(ev.memory_now_bytes)}`);
  $('stat-memory').title = `peak ${fmt.bytes(ev.memory_peak_bytes)}`;
  set('stat-lr', fmt.num(ev.lr, 3));
}

function updateStatusBar() {
  const started = ui.run?.started;
  const step = ui.run?.last_step;
  const s = ui.settings?.run || {};
  // The device's name; why it was chosen ("cpu (no GPU backend built)") on hover.
  $('sb-device').textContent = `Device ${started ? started.device.split(' (')[0] : '—'}`;
  $('sb-device').title = started ? started.device : 'Device';
  $('sb-precision').textContent = `Precision ${started?.precision ?? s.precision ?? '—'}`;
  const mem = started?.memory ?? { gradient_checkpointing: s.gradient_checkpointing, latent_cache: s.latent_cache };
  const onOff = (v) => (v ? 'on' : 'off');
  $('sb-memory').textContent = `Checkpointing ${onOff(mem.gradient_checkpointing)} · Latent cache ${onOff(mem.latent_cache)}`;
  $('sb-step').textContent = step ? `Step ${step.step} · Epoch ${step.epoch + 1}` : 'Step — · Epoch —';
  tick();
}

/** Elapsed and ETA move between step events (2 Hz), from the last step's numbers. */
function tick() {
  const step = ui.run?.last_step;
  const running = ui.run?.status === 'running';
  const since = running && ui.stepAt ? (performance.now() - ui.stepAt) / 1000 : 0;
  $('sb-elapsed').textContent = `Elapsed ${step ? fmt.duration(step.elapsed_s + since) : '—'}`;
  const eta = step?.eta_s;
  $('sb-eta').textContent = `ETA ${eta != null && ui.run?.active ? fmt.duration(Math.max(0, eta - since)) : '—'}`;
}

/** An engine event in the activity list (the run's state comes with run-state). */
function onEngineEvent(ev) {
  if (!ev || !ev.type) return;
  switch (ev.type) {
    case 'run_started':
      // (An optimizer table without `kind` is AdamW's, as run.toml writes it.)
      activity(`Run started on ${ev.device} (${ev.precision}), ${ev.adapter}, ${ev.config?.optimizer?.kind ?? 'adamw'}, ${(ev.config?.lr_schedule?.kind ?? '').replace(/_/g, ' ')} schedule`);
      break;
    case 'dataset_issue':
      // A warning is about a song that is still used: it stays marked usable.
      if (ev.kind === 'warning') {
        activity(`Warning: ${ev.file}: ${ev.reason}`);
      } else {
        markFileProblem(ev.file, ev.reason);
        activity(`Skipped ${ev.file}: ${ev.reason}`, 'bad');
      }
      break;
    case 'dataset_file':
      if (ev.note) activity(`${ev.file}: ${ev.note}`);
      break;
    case 'step_skipped':
      activity(`Step ${ev.step} skipped: ${ev.reason} (${ev.consecutive} in a row)`, 'bad');
      break;
    case 'epoch_end':
      activity(`Epoch ${ev.epoch + 1} done${ev.mean_loss != null ? `, mean loss ${fmt.num(ev.mean_loss)}` : ''}`);
      break;
    case 'checkpoint_saved': activity(`Checkpoint saved at step ${ev.step}`); break;
    case 'preview':
      activity(`Preview of step ${ev.step} ready (Listen)`);
      onPreview(ev, ui.run?.run_dir);
      break;
    case 'paused': activity(`Paused at step ${ev.step}`); break;
    case 'resumed': activity(`Resumed at step ${ev.step}`); break;
    case 'warning': activity(ev.message, 'bad'); say(ev.message); break;
    case 'finished': activity(`Finished after ${ev.steps} steps`); say('Training finished. The adapter is in History.'); break;
    case 'stopped': activity(`Stopped at step ${ev.step}; it can be resumed from History`); break;
    case 'failed': activity(`Failed: ${ev.reason}`, 'bad'); break;
    default: break;
  }
}

function showCharts(charts, prefix = 'chart') {
  if (!charts) return;
  for (const key of CHARTS) {
    const el = $(`${prefix}-${key.replace('_', '-')}`);
    if (el && charts[key]) {
      setSvg(el, charts[key]);
      el.readout = charts.readouts?.[key];
      el.dataset.updated = String(Date.now());
    }
  }
}

/** A run command. Its reply is not shown: the run-state events that follow it are. */
async function command(name, args) {
  try {
    return await invoke(name, args);
  } catch (e) {
    say(errorText(e), { error: true });
    return null;
  }
}

async function start() {
  if ($('btn-start').disabled) return;
  clearTimeout(saveTimer);
  await saveSettings();
  if ($('settings-status').dataset.state === 'error') {
    say('Fix the marked settings before starting.', { error: true });
    return;
  }
  const view = await command('start_run');
  if (view) {
    $('activity').replaceChildren();
    activity('Starting…');
  }
}
const pause = () => { if (!$('btn-pause').disabled) command('pause_run'); };
const resume = () => { if (!$('btn-resume').disabled) command('resume_run'); };
const stop = () => { if (!$('btn-stop').disabled) command('stop_run'); };

// ---- history ----------------------------------------------------------------------

async function refreshRuns() {
  try {
    ui.runs = await invoke('list_runs');
  } catch (e) {
    say(errorText(e), { error: true });
    return;
  }
  $('runs-count').textContent = ui.runs.length ? String(ui.runs.length) : '';
  const body = $('runs-body');
  body.replaceChildren();
  if (!ui.runs.length) {
    body.innerHTML = '<tr class="empty-row"><td colspan="6">No runs yet.</td></tr>';
    return;
  }
  for (const r of ui.runs) {
    const tr = document.createElement('tr');
    tr.dataset.run = r.name;
    const td = (text, cls) => { const c = document.createElement('td'); if (cls) c.className = cls; c.textContent = text; return c; };
    const status = document.createElement('td');
    // The run this app is training now shows as "active" (the engine sees it "running" or "paused").
    const shown = r.active ? 'active' : r.status;
    const badge = document.createElement('span');
    badge.className = `badge ${shown}`;
    badge.textContent = shown;
    status.append(badge);
    const actions = document.createElement('td');
    const box = document.createElement('div');
    box.className = 'actions';
    const btn = (label, testid, fn, enabled = true) => {
      const b = document.createElement('button');
      b.className = 'btn small';
      b.textContent = label;
      b.dataset.testid = testid;
      b.disabled = !enabled;
      b.addEventListener('click', fn);
      box.append(b);
    };
    btn('Charts', 'run-charts', () => historyCharts(r));
    btn('Listen', 'run-listen', () => { showRun(r.dir, r.name); selectTab('listen'); });
    btn('Resume', 'run-resume', () => command('resume_past_run', { dir: r.dir }), r.resumable && !ui.run?.active);
    btn('Adapter', 'export-adapter', () => exportRun(r, 'adapter'), !r.active);
    btn('ComfyUI', 'export-comfyui', () => exportRun(r, 'comfyui'), !r.active);
    btn('Merged', 'export-merged', () => exportRun(r, 'merged'), !r.active);
    actions.append(box);
    tr.append(td(r.name, 'name'), status, td(r.steps ? String(r.steps) : '—', 'num'),
      td(fmt.num(r.last_loss), 'num'), td(fmt.when(r.updated_unix)), actions);
    body.append(tr);
  }
}

async function historyCharts(r) {
  const box = $('history-charts');
  box.hidden = false;
  box.replaceChildren();
  for (const key of CHARTS) {
    const fig = document.createElement('figure');
    fig.className = 'chart-card';
    const cap = document.createElement('figcaption');
    cap.textContent = `${r.name} · ${key.replace('_', ' ')}`;
    const div = document.createElement('div');
    div.className = 'chart';
    div.id = `history-${key.replace('_', '-')}`;
    div.dataset.testid = `history-chart-${key.replace('_', '-')}`;
    div.innerHTML = '<p class="empty">Drawing…</p>';
    fig.append(cap, div);
    box.append(fig);
    followPointer(div);
  }
  try {
    showCharts(await invoke('run_charts', { dir: r.dir }), 'history');
  } catch (e) {
    for (const el of box.querySelectorAll('.chart')) el.innerHTML = '';
    box.querySelector('.chart').textContent = errorText(e);
  }
}

async function exportRun(r, format) {
  try {
    const to = await invoke('choose_folder', { title: `Export ${r.name} (${format}) to…` });
    if (!to) return;
    const path = await invoke('export_run', { dir: r.dir, format, to });
    say(`Exported to ${path}`);
  } catch (e) {
    say(errorText(e), { error: true });
  }
}

// ---- wiring -----------------------------------------------------------------------

function selectTab(name) {
  for (const tab of document.querySelectorAll('[role=tab]')) {
    const on = tab.dataset.tab === name;
    tab.setAttribute('aria-selected', String(on));
    tab.tabIndex = on ? 0 : -1;
    $(`panel-${tab.dataset.tab}`).hidden = !on;
  }
  if (name === 'history') refreshRuns();
}

function isTyping(target) {
  return target instanceof HTMLElement && (target.matches('input, select, textarea, [contenteditable]'));
}

/** Settings from the menu: the panel in view, its first field focused. */
function openSettings() {
  const panel = $('panel-settings');
  panel.scrollIntoView({ block: 'start' });
  panel.querySelector('input:not(:disabled), select:not(:disabled)')?.focus();
  document.body.dataset.menuOpened = 'settings';
}

function bindUi() {
  setupEditor({ say });
  for (const chart of document.querySelectorAll('#panel-charts .chart')) followPointer(chart);
  $('btn-start').addEventListener('click', start);
  $('btn-pause').addEventListener('click', pause);
  $('btn-resume').addEventListener('click', resume);
  $('btn-stop').addEventListener('click', stop);

  // Start, Stop and the others with a modifier are the native menu's accelerators.
  document.addEventListener('keydown', (e) => {
    const mod = e.ctrlKey || e.metaKey;
    if (e.key === ' ' && !mod && !isTyping(e.target) && !(e.target instanceof HTMLButtonElement)) {
      e.preventDefault();
      const status = shownStatus(ui.run);
      if (status === 'running') pause(); else if (status === 'paused') resume();
    }
  });

  for (const tab of document.querySelectorAll('[role=tab]')) {
    tab.addEventListener('click', () => selectTab(tab.dataset.tab));
  }

  for (const el of settingInputs()) {
    if (['bool', 'enum', 'choice', 'targets'].includes(el.dataset.kind)) el.addEventListener('change', saveSettings);
    else {
      el.addEventListener('input', saveSoon);
      el.addEventListener('change', () => { clearTimeout(saveTimer); saveSettings(); });
    }
  }
  setupPrompts(saveSettings);
  $('btn-reset-settings').addEventListener('click', async () => {
    try {
      ui.settings = await invoke('reset_settings');
      showSettings(ui.settings);
      markErrors({});
      setSaveStatus('Saved');
    } catch (e) { say(errorText(e), { error: true }); }
  });

  $('model-demo').addEventListener('change', saveSettings);
  $('model-folder').addEventListener('change', async () => {
    if (!$('model-path').value) await chooseModel(); else saveSettings();
  });
  $('btn-choose-model').addEventListener('click', chooseModel);

  $('btn-choose-dataset').addEventListener('click', chooseDataset);
  $('dataset-form').addEventListener('submit', (e) => { e.preventDefault(); scanDataset($('dataset-path').value); });
  $('btn-refresh-runs').addEventListener('click', refreshRuns);
}

async function chooseDataset() {
  try {
    const path = await invoke('choose_folder', { title: 'Choose a folder of songs', start: $('dataset-path').value || null });
    if (path) scanDataset(path);
  } catch (e) { say(errorText(e), { error: true }); }
}

async function chooseModel() {
  try {
    const path = await invoke('choose_folder', { title: 'Choose an ACE-Step model folder', start: $('model-path').value || null });
    if (path) {
      $('model-path').value = path;
      $('model-folder').checked = true;
    } else if (!$('model-path').value) {
      $('model-demo').checked = true;
    }
    await saveSettings();
  } catch (e) { say(errorText(e), { error: true }); }
}

/** A model from the picker (or a finished download) becomes the model choice. */
async function useModel(path) {
  $('model-path').value = path;
  $('model-folder').checked = true;
  await saveSettings();
}

async function setupDragDrop() {
  const zone = $('dropzone');
  await onDragDrop((p) => {
    if (p.type === 'enter' || p.type === 'over') zone.classList.add('dragging');
    else if (p.type === 'leave') zone.classList.remove('dragging');
    else if (p.type === 'drop') {
      zone.classList.remove('dragging');
      if (p.paths && p.paths.length) {
        if (p.paths.length > 1) say('Several items dropped: using the first one.');
        scanDataset(p.paths[0]);
      }
    }
  });
}

async function init() {
  bindUi();
  if (!available) {
    say('Open this page in the Ostinato app.', { error: true, sticky: true });
    return;
  }
  // Listen first, then ask for the state: nothing sent in between is lost.
  await Promise.all([
    listen('engine-event', onEngineEvent),
    listen('run-state', setRun),
    listen('charts', (c) => showCharts(c)),
    setupDragDrop(),
    setupModels({ pick: useModel, error: (m) => say(m, { error: true }) }),
    followMenu({
      settings: openSettings,
      open_dataset: chooseDataset,
      open_model: chooseModel,
      start,
      error: (p) => say(p.message, { error: true }),
    }),
    showShortcuts().catch((e) => say(errorText(e), { error: true })),
    setupListen({ say }),
    setupCaptions({ updateRow, offerEstimates, say }),
  ]);
  const dark = window.matchMedia('(prefers-color-scheme: dark)');
  await invoke('set_appearance', { dark: dark.matches }).catch(() => {});
  dark.addEventListener('change', async (e) => {
    await invoke('set_appearance', { dark: e.matches }).catch(() => {});
    if (ui.run?.last_step) invoke('run_charts').then((c) => showCharts(c)).catch(() => {});
  });

  const s = await invoke('get_state');
  ui.settings = s.settings;
  ui.choices = s.choices;
  fillChoices(s.choices);
  $('sure-level').textContent = `${Math.round(100 * s.choices.sure)}%`;
  showSettings(s.settings);
  if (s.notice) { $('notice').textContent = s.notice; $('notice').hidden = false; }
  $('runs-dir').textContent = `Runs are kept in ${s.runs_dir}`;
  if (s.dataset) showDataset(s.dataset);
  setRun(s.run);
  showCharts(s.charts);
  for (const ev of s.run.recent_events || []) if (ev.type !== 'step') onEngineEvent(ev);
  setSaveStatus('');
  showMemoryPlan();
  refreshRuns();
  refreshModels();
  setInterval(tick, 500);
  document.body.dataset.ready = 'true';
}

init().catch((e) => say(`Could not start: ${errorText(e)}`, { error: true, sticky: true }));
