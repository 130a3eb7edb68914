//! What the terminal shows of a run: a progress bar with notes above it on a terminal,
//! plain timestamped lines where stderr is a log file or a service's journal, only the
//! result with `--quiet`, or the engine's events as JSON lines (stdout, nothing else).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use ostinato_engine::events::{to_json_line, DatasetSummary, Event, IssueKind};
use ostinato_engine::metrics::LossSmoother;
use ostinato_engine::train::fit;

/// In `Lines` mode a step gets a line at most this often (epochs, checkpoints and
/// everything else always get theirs).
const STEP_LINE_EVERY: Duration = Duration::from_secs(10);

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
    adapter: Option<PathBuf>,
    steps: u64,
    total_steps: Option<u64>,
    elapsed_s: f64,
    final_loss: Option<f64>,
    last_step_line: Option<Instant>,
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
    let part = seconds.map_or(0.0, |(d, t)| if t > 0.0 { (d / t).clamp(0.0, 1.0) } else { 1.0 });
    let fraction = if total == 0 { 1.0 } else { ((done as f64 + part) / total as f64).min(1.0) };
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
            adapter: None,
            steps: 0,
            total_steps: None,
            elapsed_s: 0.0,
            final_loss: None,
            last_step_line: None,
        }
    }

    pub fn show(&mut self, event: &Event) {
        if self.mode == Mode::Json {
            println!("{}", to_json_line(event));
            return;
        }
        self.track(event);
        if let Some(line) = note(event) {
            self.note(line);
        }
        if self.mode == Mode::Lines {
            if let Some(line) = self.log_line(event) {
                self.note(line);
            }
        }
    }

    /// Keeps the bar and the closing summary up to date.
    fn track(&mut self, event: &Event) {
        match event {
            Event::DatasetProgress { done, total, file, seconds_done, seconds_total } => {
                let (line, fraction) =
                    dataset_progress(*done, *total, &file_name(file), seconds_done.zip(*seconds_total));
                self.bar.set_length(1000);
                self.bar.set_style(ProgressStyle::with_template("{bar:30} {msg}").expect("valid template"));
                self.bar.set_position((fraction * 1000.0) as u64);
                self.bar.set_message(line)
            }
            Event::RunStarted { total_steps, .. } => {
                self.total_steps = Some(*total_steps);
                self.bar.set_length(*total_steps);
                self.bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"));
            }
            Event::Step { step, epoch, loss, samples_per_sec, memory_now_bytes, elapsed_s, eta_s, .. } => {
                let smooth = self.smoother.push(*loss);
                self.steps = *step;
                self.elapsed_s = *elapsed_s;
                self.final_loss = Some(*loss);
                self.bar.set_position(*step);
                let eta = eta_s.map(|s| format!("  ETA {s:.0} s")).unwrap_or_default();
                self.bar.set_message(format!(
                    "epoch {}  loss {smooth:.4}  {samples_per_sec:.2} it/s  {}{eta}",
                    epoch + 1,
                    mib(*memory_now_bytes)
                ));
            }
            Event::Stopped { step, adapter_path } => {
                self.steps = *step;
                self.adapter = adapter_path.clone();
            }
            Event::Finished { adapter_path, steps, .. } => {
                self.steps = *steps;
                self.adapter = Some(adapter_path.clone());
            }
            _ => {}
        }
    }

    /// What a log shows besides the notes: what the bar shows live on a terminal.
    fn log_line(&mut self, event: &Event) -> Option<String> {
        match event {
            Event::DatasetProgress { done, total, file, seconds_done, seconds_total } => {
                Some(dataset_progress(*done, *total, &file.display().to_string(), seconds_done.zip(*seconds_total)).0)
            }
            Event::Step { step, epoch, loss, samples_per_sec, memory_now_bytes, eta_s, .. } => {
                let last = self.total_steps == Some(*step);
                let due = self.last_step_line.is_none_or(|t| t.elapsed() >= STEP_LINE_EVERY);
                if !(due || last) {
                    return None;
                }
                self.last_step_line = Some(Instant::now());
                let of = self.total_steps.map(|t| format!("/{t}")).unwrap_or_default();
                let eta = eta_s.map(|s| format!(", ETA {s:.0} s")).unwrap_or_default();
                Some(format!(
                    "step {step}{of} (epoch {}): loss {loss:.4}, {samples_per_sec:.2} it/s, {}{eta}",
                    epoch + 1,
                    mib(*memory_now_bytes)
                ))
            }
            Event::EpochEnd { epoch, step, mean_loss } => {
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
        if let Some(adapter) = &self.adapter {
            let loss = self.final_loss.map(|l| format!(", final loss {l:.4}")).unwrap_or_default();
            println!(
                "adapter: {}\n{} steps in {:.1} s{loss}",
                adapter.join("adapter_model.safetensors").display(),
                self.steps,
                self.elapsed_s
            );
        }
    }
}

/// What a user is told of an event on any stream but JSON.
fn note(event: &Event) -> Option<String> {
    Some(match event {
        Event::DatasetIssue { file, reason, kind } => issue_line(file, reason, *kind),
        Event::DatasetFile { file, note, seconds_in_file, .. } => cut_line(file, note.as_deref(), *seconds_in_file)?,
        Event::RunStarted { device, precision, memory, dataset, trainable_params, cfg_dropout, .. } => format!(
            "training on {device}, {precision}; {} songs ({} used, {} cached, {} encoded, {} skipped); \
             {trainable_params} trainable parameters; gradient checkpointing {}, latent cache {}, CFG dropout {cfg_dropout}{}",
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

    #[test]
    fn dataset_progress_counts_the_encoded_part_of_the_current_file() {
        let (line, fraction) = dataset_progress(1, 4, "b.wav", Some((60.0, 240.0)));
        assert_eq!(line, "preparing dataset 1/4: b.wav, 60 of 240 s encoded");
        assert!((fraction - 1.25 / 4.0).abs() < 1e-12);
        let (line, fraction) = dataset_progress(2, 4, "c.wav", None);
        assert_eq!((line.as_str(), fraction), ("preparing dataset 2/4: c.wav", 0.5));
        assert_eq!(dataset_progress(0, 0, "x", None).1, 1.0);
    }
}
