//! Previews during training: a short song from the run's own loaded DiT and the
//! adapter in training (strength 0 before step 1: the base model), written to
//! `<run>/previews/`. They run at step boundaries, outside the step timing, and draw
//! only on their own fixed seed, so training is the same with or without them.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::config::RunConfig;
use super::songs::{make_song, write_song, Trained, Voice};
use crate::cancel::Cancel;
use crate::data::PreparedDataset;
use crate::events::Event;
use crate::generate::plan::{PlanSettings, Planner};
use crate::generate::planned::load_planner;
use crate::generate::GenerateSpec;
use crate::Result;

/// What a run keeps to make its previews: when, and what (the decoder is the run's
/// `Voice`, which serves requested songs too).
pub(super) struct Previews {
    every: u64,
    spec: GenerateSpec,
    /// The 5 Hz LM that plans each preview (`preview_lm`), loaded at the run's start.
    planner: Option<Planner>,
}

impl Previews {
    /// None when the config asks for no previews; an error when it asks for them
    /// planned and no 5 Hz LM loads.
    pub fn new(config: &RunConfig, data: &PreparedDataset) -> Result<Option<Self>> {
        let Some(every) = config.preview_every_steps else { return Ok(None) };
        let caption = config.preview_caption.clone().unwrap_or_else(|| first_caption(data));
        let spec = GenerateSpec {
            caption,
            duration_seconds: config.preview_seconds(),
            seed: config.preview_seed(),
            lm: config.preview_lm.then(PlanSettings::default),
            ..GenerateSpec::default()
        };
        let planner = load_planner(&spec)?;
        Ok(Some(Self { every, spec, planner }))
    }

    /// The preview file of `step`, relative to the run directory; None when none is due.
    pub fn due(&self, step: u64) -> Option<PathBuf> {
        let name = match step {
            0 => "base.wav".to_string(),
            s if s.is_multiple_of(self.every) => format!("step-{s:06}.wav"),
            _ => return None,
        };
        Some(Path::new("previews").join(name))
    }

    /// Makes the preview of `step` into `run_dir/rel`; `Error::Cancelled` when a stop
    /// lands between two sampling steps.
    pub fn make(
        &self,
        run_dir: &Path,
        rel: &Path,
        step: u64,
        voice: &mut Voice,
        parts: &Trained,
        cancel: &Cancel,
    ) -> Result<Event> {
        let started = Instant::now();
        let song = voice.song(parts)?;
        // Strength 0 is the base model exactly: the preview before any update.
        let spec = GenerateSpec { adapter_scale: if step == 0 { 0.0 } else { 1.0 }, ..self.spec.clone() };
        let audio = make_song(&song, parts.adapter, &spec, self.planner.as_ref(), cancel, &mut |_| {})?;
        write_song(&run_dir.join(rel), &audio)?;
        Ok(Event::Preview {
            step,
            path: rel.to_path_buf(),
            caption: spec.caption,
            seed: spec.seed,
            seconds: spec.duration_seconds,
            took_s: started.elapsed().as_secs_f64(),
        })
    }
}

/// The caption of the first usable song that has one (empty when none has).
fn first_caption(data: &PreparedDataset) -> String {
    data.items.iter().map(|item| item.meta.caption.trim()).find(|c| !c.is_empty()).unwrap_or_default().to_string()
}
