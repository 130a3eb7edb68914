//! What the terminal shows of a run: a progress bar with notes above it on a terminal,
//! plain timestamped lines where stderr is a log file or a service's journal, only the
//! result with `--quiet`, or the engine's events as JSON lines (stdout, nothing else).

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use ostinato_engine::events::{to_json_line, DatasetSummary, Event, IssueKind};
use ostinato_engine::lora::LoraAdapter;
use ostinato_engine::metrics::LossSmoother;
use ostinato_engine::run_state::{preparation_fraction, RunState};
use ostinato_engine::train::fit;

/// In `Lines` mode, what comes fast gets a line at most this often: a step, an
/// epoch's end, the seconds encoded of a file. A log reader wants the run's pace, not
/// one line per second of audio or per epoch of a tiny dataset. Each file's start,
/// the last epoch and step, checkpoints and everything else always get theirs.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Lets a kind of line through at most once per `LOG_EVERY`.
#[derive(Debug, Default)]
struct Throttle {
    last: Option<Instant>,
}

impl Throttle {
    /// Whether a line is due at `now` (always when `force`); if so, counts it as shown.
    fn due(&mut self, now: Instant, force: bool) -> bool {
        let due = force || self.last.is_none_or(|t| now.duration_since(t) >= LOG_EVERY);
        if due {
            self.last = Some(now);
        }
        due
    }
}

/// How a run's progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every event as a JSON line on stdout.
    Json,
    /// A live bar on stderr, notes above it.
    Bar,
    /// Plain timestamped lines on stderr.
    Lines,
    /// Only the result.
    Quiet,
}

impl Mode {
    /// `--json` and `--quiet` as asked; otherwise a bar where stderr is a terminal and
    /// lines where it is not (a bar there would print nothing at all).
    pub fn choose(json: bool, quiet: bool) -> Self {
        if json {
            Mode::Json
        } else if quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            Mode::Bar
        } else {
            Mode::Lines
        }
    }
}

pub struct Progress {
    mode: Mode,
    bar: ProgressBar,
    smoother: LossSmoother,
    /// The run as its events so far tell it: the bar and the result are drawn from it.
    state: RunState,
    step_lines: Throttle,
    epoch_lines: Throttle,
    /// Lines of the seconds encoded of the current file (a file's start resets it).
    encoding_lines: Throttle,
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A dataset issue as a line: a skipped file, or a warning about a used one.
pub fn issue_line(file: &Path, reason: &str, kind: IssueKind) -> String {
    match kind {
        IssueKind::Skipped => format!("skipped {}: {reason}", file.display()),
        IssueKind::Warning => format!("warning: {}: {reason}", file.display()),
    }
}

/// A used song that is cut or cropped, as a line; None for one used whole.
pub fn cut_line(file: &Path, note: Option<&str>, seconds_in_file: f64) -> Option<String> {
    note.map(|note| format!("{}: {note} (the file has {seconds_in_file:.0} s)", file.display()))
}

/// "250 s", or "240 s of 505 s" when cuts leave some of the files out.
fn seconds_text(dataset: &DatasetSummary) -> String {
    match dataset.seconds_in_files {
        Some(whole) if whole - dataset.total_seconds >= 0.5 => {
            format!("{:.0} s of {whole:.0} s", dataset.total_seconds)
        }
        _ => format!("{:.0} s", dataset.total_seconds),
    }
}

pub fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The dataset line (`preparing dataset 1/3: a.wav, 120 of 240 s encoded`) and the
/// fraction of preparation done: files done plus the encoded part of the current one.
pub fn dataset_progress(done: u64, total: u64, file: &str, seconds: Option<(f64, f64)>) -> (String, f64) {
    let fraction = preparation_fraction(done, total, seconds);
    let encoded = seconds.map(|(d, t)| format!(", {d:.0} of {t:.0} s encoded")).unwrap_or_default();
    (format!("preparing dataset {done}/{total}: {file}{encoded}"), fraction)
}

/// A line printed before the run's events begin (no bar yet): as `Progress` prints its
/// notes, plain on a terminal, timestamped in a log, nothing when quiet or JSON.
pub fn preamble(mode: Mode, line: &str) {
    match mode {
        Mode::Bar => eprintln!("{line}"),
        Mode::Lines => eprintln!("{} {line}", timestamp()),
        Mode::Json | Mode::Quiet => {}
    }
}

impl Progress {
    pub fn new(mode: Mode) -> Self {
        let bar = if mode == Mode::Bar { ProgressBar::new_spinner() } else { ProgressBar::hidden() };
        bar.enable_steady_tick(Duration::from_millis(200));
        Self {
            mode,
            bar,
            smoother: LossSmoother::new(0.9),
            state: RunState::default(),
            step_lines: Throttle::default(),
            epoch_lines: Throttle::default(),
            encoding_lines: Throttle::default(),
        }
    }

    pub fn show(&mut self, event: &Event) {
        self.show_at(event, Instant::now());
    }

    /// Shows `event`, arrived at `now`.
    fn show_at(&mut self, event: &Event, now: Instant) {
        if self.mode == Mode::Json {
            println!("{}", to_json_line(event));
            return;
        }
        self.track(event);
        if let Some(line) = note(event) {
            self.note(line);
        }
        if self.mode == Mode::Lines {
            if let Some(line) = self.log_line(event, now) {
                self.note(line);
            }
        }
    }

    /// Folds the event into the run's state and redraws the bar from it.
    fn track(&mut self, event: &Event) {
        self.state.apply(event);
        match event {
            Event::DatasetProgress { .. } => {
                let Some(p) = &self.state.preparing else { return };
                let (line, _) = dataset_progress(p.done, p.total, &file_name(&p.file), p.seconds);
                self.bar.set_length(1000);
                self.bar.set_style(ProgressStyle::with_template("{bar:30} {msg}").expect("valid template"));
                self.bar.set_position((p.fraction * 1000.0) as u64);
                self.bar.set_message(line)
            }
            Event::RunStarted { total_steps, .. } => {
                self.bar.set_length(*total_steps);
                self.bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"));
            }
            Event::Step { loss, .. } => {
                let smooth = self.smoother.push(*loss);
                let Some(s) = &self.state.last_step else { return };
                self.bar.set_position(s.step);
                let eta = s.eta_s.map(|s| format!("  ETA {s:.0} s")).unwrap_or_default();
                self.bar.set_message(format!(
                    "epoch {}  loss {smooth:.4}  {:.2} it/s  {}{eta}",
                    s.epoch + 1,
                    s.samples_per_sec,
                    mib(s.memory_now_bytes)
                ));
            }
            _ => {}
        }
    }

    /// What a log shows besides the notes: what the bar shows live on a terminal, as
    /// often as a log reader wants it (see `LOG_EVERY`).
    fn log_line(&mut self, event: &Event, now: Instant) -> Option<String> {
        match event {
            Event::DatasetProgress { done, total, file, seconds_done, seconds_total } => {
                let seconds = seconds_done.zip(*seconds_total);
                // A file's start (or the end of them all) always; its tiles now and then.
                let due = self.encoding_lines.due(now, seconds.is_none());
                due.then(|| dataset_progress(*done, *total, &file.display().to_string(), seconds).0)
            }
            Event::Step { step, epoch, loss, samples_per_sec, memory_now_bytes, eta_s, .. } => {
                let last = self.state.total_steps() == Some(*step);
                if !self.step_lines.due(now, last) {
                    return None;
                }
                let of = self.state.total_steps().map(|t| format!("/{t}")).unwrap_or_default();
                let eta = eta_s.map(|s| format!(", ETA {s:.0} s")).unwrap_or_default();
                Some(format!(
                    "step {step}{of} (epoch {}): loss {loss:.4}, {samples_per_sec:.2} it/s, {}{eta}",
                    epoch + 1,
                    mib(*memory_now_bytes)
                ))
            }
            Event::EpochEnd { epoch, step, mean_loss } => {
                let last = self.state.total_steps() == Some(*step);
                if !self.epoch_lines.due(now, last) {
                    return None;
                }
                let loss = mean_loss.map(|l| format!(", mean loss {l:.4}")).unwrap_or_default();
                Some(format!("epoch {} ended at step {step}{loss}", epoch + 1))
            }
            Event::CheckpointSaved { step, path } => Some(format!("checkpoint at step {step}: {}", path.display())),
            Event::Finished { steps, adapter_path, .. } => {
                Some(format!("finished after {steps} steps: {}", adapter_path.display()))
            }
            Event::Stopped { step, adapter_path: Some(adapter) } => {
                Some(format!("stopped at step {step} (resumable): {}", adapter.display()))
            }
            _ => None,
        }
    }

    /// A line above the bar on a terminal, a timestamped line in a log; nothing when quiet.
    fn note(&self, line: String) {
        match self.mode {
            Mode::Bar => self.bar.println(line),
            Mode::Lines => eprintln!("{} {line}", timestamp()),
            Mode::Json | Mode::Quiet => {}
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
        if self.mode == Mode::Json {
            return;
        }
        if let Some(result) = self.result() {
            println!("{result}");
        }
    }

    /// The closing summary, once the run wrote an adapter: where, how many steps in how
    /// long, the final loss.
    fn result(&self) -> Option<String> {
        let adapter = self.state.adapter.as_ref()?;
        let loss = self.state.last_loss().map(|l| format!(", final loss {l:.4}")).unwrap_or_default();
        let elapsed = self.state.last_step.as_ref().map_or(0.0, |s| s.elapsed_s);
        Some(format!(
            "adapter: {}\n{} steps in {elapsed:.1} s{loss}",
            LoraAdapter::weights_file(adapter).display(),
            self.state.steps,
        ))
    }
}

/// What a user is told of an event on any stream but JSON.
fn note(event: &Event) -> Option<String> {
    Some(match event {
        Event::DatasetIssue { file, reason, kind } => issue_line(file, reason, *kind),
        Event::DatasetFile { file, note, seconds_in_file, .. } => cut_line(file, note.as_deref(), *seconds_in_file)?,
        Event::RunStarted { device, precision, adapter, memory, dataset, trainable_params, cfg_dropout, .. } => format!(
            "training on {device}, {precision}; {} songs ({} used, {} cached, {} encoded, {} skipped); \
             {adapter}, {trainable_params} trainable parameters; gradient checkpointing {}, latent cache {}, CFG dropout {cfg_dropout}{}",
            dataset.usable,
            seconds_text(dataset),
            dataset.cache_hits,
            dataset.cache_misses,
            dataset.skipped,
            on_off(memory.gradient_checkpointing),
            on_off(memory.latent_cache),
            memory.predicted_peak_bytes.map(|p| format!("; {}", fit::summary(p, memory.machine.as_ref()))).unwrap_or_default(),
        ),
        Event::StepSkipped { step, reason, consecutive, .. } => {
            format!("step {step} skipped: {reason} ({consecutive} in a row)")
        }
        Event::Warning { message } => format!("warning: {message}"),
        Event::Preview { step, path, took_s, .. } => {
            let of = if *step == 0 { "the base model".to_string() } else { format!("step {step}") };
            format!("preview of {of}: {} in the run folder (took {took_s:.1} s)", path.display())
        }
        Event::Paused { step } => format!("paused at step {step}"),
        Event::Resumed { step } => format!("resumed at step {step}"),
        Event::Validation { step, loss, best } => {
            format!("validation at step {step}: loss {loss:.4}{}", if *best { " (best so far: best/adapter)" } else { "" })
        }
        Event::Finished { reason: Some(reason), .. } => format!("finished early: {reason}"),
        Event::Stopped { adapter_path: None, .. } => {
            "stopped before the first step: no adapter written; the run can be resumed".into()
        }
        // A failure is the command's error, printed once by `main`.
        _ => return None,
    })
}

/// UTC, to the second, as logs write it (RFC 3339): `2026-12-02T03:50:12Z`.
fn timestamp() -> String {
    let now = time::OffsetDateTime::now_utc();
    let now = now.replace_nanosecond(0).unwrap_or(now);
    now.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ostinato_engine::events::MemoryFeatures;
    use std::path::PathBuf;

    #[test]
    fn dataset_progress_counts_the_encoded_part_of_the_current_file() {
        let (line, fraction) = dataset_progress(1, 4, "b.wav", Some((60.0, 240.0)));
        assert_eq!(line, "preparing dataset 1/4: b.wav, 60 of 240 s encoded");
        assert!((fraction - 1.25 / 4.0).abs() < 1e-12);
        let (line, fraction) = dataset_progress(2, 4, "c.wav", None);
        assert_eq!((line.as_str(), fraction), ("preparing dataset 2/4: c.wav", 0.5));
        assert_eq!(dataset_progress(0, 0, "x", None).1, 1.0);
    }

    /// A log gets each file's start and, of what comes fast, a line per `LOG_EVERY`:
    /// the demo's 240 s song encoded tile by tile in 3 s is one line (it was 242), its
    /// 448 epochs in 105 s eleven lines and the last (it was 448).
    #[test]
    fn a_log_gets_each_file_and_a_line_per_interval_of_what_comes_fast() {
        let mut progress = Progress::new(Mode::Lines);
        let start = Instant::now();
        let mut lines = Vec::new();
        let show = |progress: &mut Progress, lines: &mut Vec<String>, e: Event, at_s: f64| {
            progress.state.apply(&e);
            lines.extend(progress.log_line(&e, start + Duration::from_secs_f64(at_s)));
        };
        let tile = |file: &str, done: u64, s: f64| Event::DatasetProgress {
            done,
            total: 2,
            file: file.into(),
            seconds_done: Some(s),
            seconds_total: Some(240.0),
        };
        let begin = |file: &str, done: u64| Event::DatasetProgress {
            done,
            total: 2,
            file: file.into(),
            seconds_done: None,
            seconds_total: None,
        };
        show(&mut progress, &mut lines, begin("a.wav", 0), 0.0);
        for s in 1..=242 {
            show(&mut progress, &mut lines, tile("a.wav", 0, s as f64), s as f64 / 80.0);
        }
        assert_eq!(lines, ["preparing dataset 0/2: a.wav"]);
        // A slow file: a line of its seconds every ten seconds.
        show(&mut progress, &mut lines, begin("b.wav", 1), 4.0);
        for s in 1..=60 {
            show(&mut progress, &mut lines, tile("b.wav", 1, s as f64), 4.0 + s as f64);
        }
        assert_eq!(lines.len(), 1 + 1 + 6, "{lines:#?}");
        assert_eq!(lines[2], "preparing dataset 1/2: b.wav, 10 of 240 s encoded");

        lines.clear();
        let total = 448;
        show(&mut progress, &mut lines, run_started(total), 70.0);
        for epoch in 0..total {
            let at = 70.0 + 105.0 * (epoch + 1) as f64 / total as f64;
            show(&mut progress, &mut lines, Event::EpochEnd { epoch, step: epoch + 1, mean_loss: None }, at);
        }
        assert_eq!(lines.len(), 11 + 1, "{lines:#?}");
        assert_eq!(lines.last().unwrap(), "epoch 448 ended at step 448");
    }

    fn run_started(total_steps: u64) -> Event {
        Event::RunStarted {
            config: serde_json::json!({}),
            device: "cpu".into(),
            precision: "f32".into(),
            memory: MemoryFeatures {
                gradient_checkpointing: false,
                block_input_grad_path: false,
                latent_cache: false,
                predicted_peak_bytes: None,
                machine: None,
            },
            adapter: "LoRA r 64 alpha 128".into(),
            trainable_params: 1,
            total_params: 1,
            cfg_dropout: 0.0,
            timestep_levels: None,
            dataset: DatasetSummary {
                files: 1,
                usable: 1,
                skipped: 0,
                cache_hits: 0,
                cache_misses: 1,
                total_seconds: 240.0,
                seconds_in_files: None,
            },
            total_steps,
        }
    }

    fn step(step: u64, loss: f64, elapsed_s: f64) -> Event {
        Event::Step {
            step,
            epoch: 0,
            loss,
            lr: 1e-4,
            grad_norm: 1.0,
            samples_per_sec: 2.0,
            memory_now_bytes: 1 << 20,
            memory_peak_bytes: 1 << 20,
            elapsed_s,
            eta_s: None,
            samples: Vec::new(),
        }
    }

    /// The bar and the result follow the engine's `RunState`: a resumed run's redone
    /// steps, the adapter of its end.
    #[test]
    fn the_result_is_what_the_run_state_tells() {
        let events = [
            Event::DatasetProgress { done: 1, total: 2, file: "a.wav".into(), seconds_done: None, seconds_total: None },
            step(1, 0.9, 1.0),
            step(2, 0.8, 2.0),
            // Resumed from step 1: step 2 again, then stopped.
            step(2, 0.5, 1.5),
            Event::Stopped { step: 2, adapter_path: Some(PathBuf::from("runs/r/final/adapter")) },
        ];
        let mut progress = Progress::new(Mode::Quiet);
        assert_eq!(progress.result(), None);
        for e in &events[..1] {
            progress.show(e);
        }
        assert_eq!(progress.state.preparing.as_ref().map(|p| p.fraction), Some(0.5));
        for e in &events[1..] {
            progress.show(e);
        }
        assert_eq!(progress.state, RunState::replay(&events));
        let adapter = Path::new("runs/r/final/adapter/adapter_model.safetensors");
        assert_eq!(
            progress.result().unwrap(),
            format!("adapter: {}\n2 steps in 1.5 s, final loss 0.5000", adapter.display())
        );
        // Stopped before any update: no adapter, no result.
        let mut untrained = Progress::new(Mode::Quiet);
        untrained.show(&Event::Stopped { step: 0, adapter_path: None });
        assert_eq!(untrained.result(), None);
    }
}
