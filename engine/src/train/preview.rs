//! Previews during training: short songs from the run's own loaded DiT and the adapter
//! in training (strength 0 before step 1: the base model), one for each of the run's
//! preview prompts, written to `<run>/previews/`. They run at step boundaries, outside
//! the step timing, and draw only on their own fixed seeds, so training is the same
//! with or without them.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::config::RunConfig;
use super::prompts::PreviewPrompt;
use super::songs::{make_song, write_song, Trained, Voice};
use crate::cancel::Cancel;
use crate::data::PreparedDataset;
use crate::events::Event;
use crate::generate::plan::{PlanSettings, Planner};
use crate::generate::planned::{load_planner, plan_lm};
use crate::generate::GenerateSpec;
use crate::{Error, Result};

/// What a run keeps to make its previews: when, and what (the decoder is the run's
/// `Voice`, which serves requested songs too).
pub(super) struct Previews {
    every: u64,
    /// Whether the base model is previewed before step 1.
    at_step_0: bool,
    /// One song per prompt, in the prompts' order.
    specs: Vec<GenerateSpec>,
    /// The 5 Hz LM that plans each preview (`preview_lm`), loaded at the run's start.
    planner: Option<Planner>,
}

/// One preview to make: the prompt's index and the file, relative to the run directory.
pub(super) type Due = (usize, PathBuf);

impl Previews {
    /// None when the config asks for no previews; an error naming the prompt's field
    /// when one cannot be made (the config's check catches all but the first song's
    /// caption, known only now), or when they are asked planned and no 5 Hz LM loads.
    pub fn new(config: &RunConfig, data: &PreparedDataset) -> Result<Option<Self>> {
        let Some(every) = config.preview_every_steps else { return Ok(None) };
        let first = first_caption(data);
        let defaults = config.prompt_defaults(&first);
        let one = [PreviewPrompt::default()];
        let prompts = if config.preview_prompts.is_empty() { &one[..] } else { &config.preview_prompts };
        let lm = config.preview_lm.then(PlanSettings::default);
        let specs: Vec<GenerateSpec> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let spec = p
                    .spec(&defaults)
                    .map_err(|(field, why)| Error::setting(&format!("preview_prompts[{i}].{field}"), why))?;
                Ok(GenerateSpec { lm: lm.clone(), ..spec })
            })
            .collect::<Result<_>>()?;
        let planner = load_planner(&specs[0])?;
        Ok(Some(Self { every, at_step_0: config.preview_at_step_0.unwrap_or(true), specs, planner }))
    }

    /// How many prompts are previewed.
    pub fn prompts(&self) -> usize {
        self.specs.len()
    }

    /// The previews due at `step`, each with its file relative to the run directory:
    /// `previews/step-000100.wav` for the first prompt, `step-000100-prompt2.wav` for
    /// the second, `base.wav` before step 1.
    pub fn due(&self, step: u64) -> Vec<Due> {
        let name = match step {
            0 if self.at_step_0 => "base".to_string(),
            s if s > 0 && s.is_multiple_of(self.every) => format!("step-{s:06}"),
            _ => return Vec::new(),
        };
        let file = |i: usize| match i {
            0 => format!("{name}.wav"),
            i => format!("{name}-prompt{}.wav", i + 1),
        };
        (0..self.specs.len()).map(|i| (i, Path::new("previews").join(file(i)))).collect()
    }

    /// Makes prompt `prompt`'s preview of `step` into `run_dir/rel`; `Error::Cancelled`
    /// when a stop lands between two sampling steps.
    pub fn make(
        &self,
        run_dir: &Path,
        (prompt, rel): &Due,
        step: u64,
        voice: &mut Voice,
        parts: &Trained,
        cancel: &Cancel,
    ) -> Result<Event> {
        let started = Instant::now();
        let song = voice.song(parts)?;
        // Before any update, the base model exactly: no adapter, none mixed in.
        let prompt_spec = self.specs[*prompt].clone();
        let spec = match step {
            0 => GenerateSpec { adapter_scale: 0.0, more_adapters: Vec::new(), ..prompt_spec },
            _ => GenerateSpec { adapter_scale: 1.0, ..prompt_spec },
        };
        let audio = make_song(&song, parts.adapter, &spec, self.planner.as_ref(), cancel, &mut |_| {})?;
        write_song(&run_dir.join(rel), &audio)?;
        Ok(Event::Preview {
            step,
            prompt: *prompt,
            path: rel.to_path_buf(),
            caption: spec.caption,
            seed: spec.seed,
            seconds: spec.duration_seconds,
            took_s: started.elapsed().as_secs_f64(),
        })
    }
}

/// A run that plans its previews finds its 5 Hz LM before it starts (not after its
/// dataset is prepared): an error saying how to get one when none is found.
pub(super) fn check_preview_lm(config: &RunConfig) -> Result<()> {
    match config.preview_lm && config.preview_every_steps.is_some() {
        true => plan_lm(&PlanSettings::default()).map(|_| ()).map_err(|e| match e {
            Error::Setting { reason, .. } => Error::setting("preview_lm", reason),
            e => e,
        }),
        false => Ok(()),
    }
}

/// The caption of the first usable song that has one (empty when none has).
fn first_caption(data: &PreparedDataset) -> String {
    data.items.iter().map(|item| item.meta.caption.trim()).find(|c| !c.is_empty()).unwrap_or_default().to_string()
}
