//! What a live run makes to be heard, at its step boundaries: the preview when one is
//! due, and the songs asked of it, both with the DiT and adapter as they are there.

use std::path::{Path, PathBuf};

use super::config::RunConfig;
use super::preview::Previews;
use super::sink::Sink;
use super::songs::{self, SongRequest, Trained, Voice};
use super::step::Trainer;
use crate::cancel::Cancel;
use crate::codec::Conditioner;
use crate::data::PreparedDataset;
use crate::events::Event;
use crate::{Error, Result};

pub(super) struct Listening {
    run_dir: PathBuf,
    previews: Option<Previews>,
    /// The decoder and what sampling needs beside the DiT: previews and requested songs.
    voice: Voice,
    /// The step whose preview was last tried: one try per step, however it ended.
    previewed_step: Option<u64>,
    /// Set by a stop: ends a song between its sampling steps.
    cancel: Cancel,
}

impl Listening {
    /// Previews as `config` asks, of a run training on `data`; the decoder is loaded
    /// now when they are on, so a run fails at setup, not at its first preview.
    pub fn new(
        config: &RunConfig,
        run_dir: &Path,
        data: &PreparedDataset,
        mut voice: Voice,
        cancel: &Cancel,
    ) -> Result<Self> {
        let previews = Previews::new(config, data)?;
        if previews.is_some() {
            voice.load_decoder()?;
        }
        Ok(Self { run_dir: run_dir.to_path_buf(), previews, voice, previewed_step: None, cancel: cancel.clone() })
    }

    /// Makes the previews due at `step` (one per prompt) unless they were tried already
    /// or are there (made before a stop and resume). A stop ends them unwritten; a
    /// failure is a warning: a preview is never worth the run.
    pub fn preview_if_due(&mut self, step: u64, trainer: &Trainer, conditioner: &dyn Conditioner, sink: &mut Sink) {
        let Some(previews) = &self.previews else { return };
        if self.previewed_step.replace(step) == Some(step) {
            return;
        }
        let parts = trained(trainer, conditioner);
        for due in previews.due(step).into_iter().filter(|(_, rel)| !self.run_dir.join(rel).exists()) {
            match previews.make(&self.run_dir, &due, step, &mut self.voice, &parts, &self.cancel) {
                Ok(event) => sink.emit(event),
                Err(Error::Cancelled) => return,
                Err(e) => {
                    let which =
                        if previews.prompts() > 1 { format!(" of prompt {}", due.0 + 1) } else { String::new() };
                    sink.emit(Event::Warning { message: format!("the preview{which} at step {step} failed: {e}") })
                }
            }
        }
    }

    /// Makes the songs asked of the run.
    pub fn serve(&mut self, requests: Vec<SongRequest>, trainer: &Trainer, conditioner: &dyn Conditioner) {
        let parts = trained(trainer, conditioner);
        for request in requests {
            songs::serve(request, &mut self.voice, &parts, &self.cancel);
        }
    }
}

fn trained<'a>(trainer: &'a Trainer, conditioner: &'a dyn Conditioner) -> Trained<'a> {
    Trained { model: &trainer.model, adapter: &trainer.adapter, conditioner }
}
