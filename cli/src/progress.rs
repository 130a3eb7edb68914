//! What the terminal shows of a run: a progress bar and a closing summary, or the
//! engine's events as JSON lines (stdout, nothing else there).

use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use ostinato_engine::events::{to_json_line, Event};
use ostinato_engine::metrics::LossSmoother;

pub struct Progress {
    json: bool,
    bar: ProgressBar,
    smoother: LossSmoother,
    adapter: Option<PathBuf>,
    steps: u64,
    elapsed_s: f64,
    final_loss: Option<f64>,
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl Progress {
    pub fn new(json: bool) -> Self {
        let bar = if json { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
        bar.enable_steady_tick(Duration::from_millis(200));
        Self {
            json,
            bar,
            smoother: LossSmoother::new(0.9),
            adapter: None,
            steps: 0,
            elapsed_s: 0.0,
            final_loss: None,
        }
    }

    pub fn show(&mut self, event: &Event) {
        if self.json {
            println!("{}", to_json_line(event));
        }
        match event {
            Event::DatasetProgress { done, total, file } => self.bar.set_message(format!(
                "preparing dataset {done}/{total}: {}",
                file.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
            )),
            Event::DatasetIssue { file, reason } => self.note(format!("skipped {}: {reason}", file.display())),
            Event::RunStarted { device, precision, memory, dataset, total_steps, trainable_params, .. } => {
                self.note(format!(
                    "training on {device}, {precision}; {} songs ({:.0} s, {} cached, {} encoded, {} skipped); \
                     {trainable_params} trainable parameters; gradient checkpointing {}, latent cache {}",
                    dataset.usable,
                    dataset.total_seconds,
                    dataset.cache_hits,
                    dataset.cache_misses,
                    dataset.skipped,
                    on_off(memory.gradient_checkpointing),
                    on_off(memory.latent_cache),
                ));
                self.bar.set_length(*total_steps);
                self.bar.set_style(
                    ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"),
                );
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
            Event::StepSkipped { step, reason, consecutive, .. } => {
                self.note(format!("step {step} skipped: {reason} ({consecutive} in a row)"))
            }
            Event::Warning { message } => self.note(format!("warning: {message}")),
            Event::Paused { step } => self.note(format!("paused at step {step}")),
            Event::Stopped { step, adapter_path } => {
                self.steps = *step;
                self.adapter = adapter_path.clone();
                if adapter_path.is_none() {
                    self.note("stopped before the first step: no adapter written; the run can be resumed".into());
                }
            }
            Event::Finished { adapter_path, steps, .. } => {
                self.steps = *steps;
                self.adapter = Some(adapter_path.clone());
            }
            // Said once, by the error the command ends with.
            Event::Failed { .. } => {}
            _ => {}
        }
    }

    /// A line above the bar (stderr), or nothing in JSON mode.
    fn note(&self, line: String) {
        if !self.json {
            self.bar.println(line);
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
        if self.json {
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

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}
