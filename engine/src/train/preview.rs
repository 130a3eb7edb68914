//! Previews during training: a short song from the run's own loaded DiT and the
//! adapter in training (strength 0 before step 1: the base model), written to
//! `<run>/previews/`. They run at step boundaries, outside the step timing, and draw
//! only on their own fixed seed, so training is the same with or without them.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{Device, Tensor};

use super::config::RunConfig;
use crate::cancel::Cancel;
use crate::codec::Conditioner;
use crate::codec::LatentDecoder;
use crate::data::PreparedDataset;
use crate::events::Event;
use crate::generate::wav::write_wav;
use crate::generate::{GenerateSpec, SongModel};
use crate::lora::LoraAdapter;
use crate::model::DitModel;
use crate::{Error, Result};

/// What a run keeps to make its previews: the decoder (loaded once) and the settings.
pub(super) struct Previews {
    every: u64,
    spec: GenerateSpec,
    decoder: Box<dyn LatentDecoder>,
    turbo: bool,
    /// `[1, 1, E]`: the model's `null_condition_emb` (guidance on base/SFT models).
    null_condition: std::result::Result<Tensor, String>,
}

/// The borrowed training parts a preview samples with.
pub(super) struct Trained<'a> {
    pub model: &'a DitModel,
    pub adapter: &'a LoraAdapter,
    pub conditioner: &'a dyn Conditioner,
}

impl Previews {
    /// None when the config asks for no previews.
    pub fn new(
        config: &RunConfig,
        data: &PreparedDataset,
        device: &Device,
        turbo: bool,
        null_condition: std::result::Result<Tensor, String>,
    ) -> Result<Option<Self>> {
        let Some(every) = config.preview_every_steps else { return Ok(None) };
        let caption = config.preview_caption.clone().unwrap_or_else(|| first_caption(data));
        let spec = GenerateSpec {
            caption,
            duration_seconds: config.preview_seconds(),
            seed: config.preview_seed(),
            ..GenerateSpec::default()
        };
        let decoder = config.model.latent_decoder(device)?;
        Ok(Some(Self { every, spec, decoder, turbo, null_condition }))
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
    pub fn make(&self, run_dir: &Path, rel: &Path, step: u64, parts: &Trained, cancel: &Cancel) -> Result<Event> {
        let started = Instant::now();
        let song = SongModel {
            dit: parts.model,
            conditioner: parts.conditioner,
            decoder: self.decoder.as_ref(),
            turbo: self.turbo,
            null_condition: &self.null_condition,
        };
        // Strength 0 is the base model exactly: the preview before any update.
        let spec = GenerateSpec { adapter_scale: if step == 0 { 0.0 } else { 1.0 }, ..self.spec.clone() };
        let latents = song.latents(&spec, Some(parts.adapter), cancel, &mut |_| {})?;
        let audio = song.decode(&latents, &mut |_| {})?;
        let path = run_dir.join(rel);
        let dir = run_dir.join("previews");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        write_wav(&path, &audio)?;
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
