//! `generate` and `decode`: text (and an adapter) to a WAV file, latents to a WAV file.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use ostinato_engine::atomic::check_writable;
use ostinato_engine::cancel::Cancel;
use ostinato_engine::generate::planned::{load_planner, plan_song};
use ostinato_engine::generate::wav::write_wav;
use ostinato_engine::generate::{decode_latents, read_latents, write_latents};
use ostinato_engine::generate::{GenerateEvent, GenerateSpec, Generator};
use ostinato_engine::load::source::ModelSource;

/// A progress bar over the sampling steps, then a spinner while decoding; or the
/// events as JSON lines on stdout.
struct Progress {
    json: bool,
    bar: ProgressBar,
}

impl Progress {
    fn new(json: bool) -> Self {
        let bar = if json { ProgressBar::hidden() } else { ProgressBar::new(0) };
        Self { json, bar }
    }

    fn show(&self, event: GenerateEvent) {
        if self.json {
            println!("{}", serde_json::to_string(&event).expect("events serialise"));
            return;
        }
        match event {
            GenerateEvent::Unplanned { reason } => println!("no 5 Hz LM plan: {reason}"),
            GenerateEvent::Planning { phase, tokens } => {
                self.bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("valid template"));
                self.bar.set_message(format!("5 Hz LM planning the {phase}: {tokens} tokens"));
                self.bar.tick();
            }
            GenerateEvent::Planned { caption, bpm, keyscale, timesignature, language, codes } => {
                let or_na = |v: Option<String>| v.unwrap_or_else(|| "N/A".into());
                let line = format!(
                    "5 Hz LM plan: {codes} audio codes; bpm {}, key {}, time signature {}, language {}\n  caption: {caption}",
                    or_na(bpm.map(|b| b.to_string())),
                    or_na(keyscale),
                    or_na(timesignature),
                    or_na(language),
                );
                self.bar.suspend(|| println!("{line}"));
            }
            GenerateEvent::Started { frames, steps, .. } => {
                self.bar.set_length(steps as u64);
                self.bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"));
                self.bar.set_message(format!("sampling {frames} latent frames"));
            }
            GenerateEvent::Step { step, .. } => self.bar.set_position(step as u64),
            GenerateEvent::Decoding { frames } => {
                self.bar.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("valid template"));
                self.bar.set_message(format!("decoding {frames} latent frames to audio"));
                self.bar.enable_steady_tick(Duration::from_millis(200));
            }
            GenerateEvent::Written { path, seconds, sample_rate } => {
                self.bar.finish_and_clear();
                println!("wrote {} ({seconds:.1} s, {sample_rate} Hz stereo, 32-bit float)", path.display());
            }
        }
    }
}

pub fn generate(
    spec: &GenerateSpec,
    source: &ModelSource,
    out: &Path,
    latents_out: Option<&Path>,
    json: bool,
) -> anyhow::Result<()> {
    spec.validate()?;
    check_writable(out)?;
    if let Some(p) = latents_out {
        check_writable(p)?;
    }
    let planner = load_planner(spec).context("cannot load the 5 Hz LM")?;
    let generator = Generator::load(source).context("cannot load the model")?;
    let progress = Progress::new(json);
    let mut show = |e| progress.show(e);
    let spec = plan_song(spec, planner.as_ref(), &Cancel::never(), &mut show)?;
    drop(planner);
    let latents = generator.latents(&spec, &mut show)?;
    let audio = generator.decode(&latents, &mut show)?;
    write_wav(out, &audio)?;
    if let Some(p) = latents_out {
        write_latents(p, &latents)?;
    }
    show(GenerateEvent::Written {
        path: out.to_path_buf(),
        seconds: audio.duration_seconds(),
        sample_rate: audio.sample_rate,
    });
    Ok(())
}

pub fn decode(latents: &Path, source: &ModelSource, out: &Path) -> anyhow::Result<()> {
    check_writable(out)?;
    let decoder = source.latent_decoder(&candle_core::Device::Cpu).context("cannot load the model's decoder")?;
    let z = read_latents(latents, decoder.latent_channels())?;
    let audio = decode_latents(decoder.as_ref(), &z)?;
    write_wav(out, &audio)?;
    println!(
        "wrote {} ({:.1} s, {} Hz stereo, 32-bit float)",
        out.display(),
        audio.duration_seconds(),
        audio.sample_rate
    );
    Ok(())
}
