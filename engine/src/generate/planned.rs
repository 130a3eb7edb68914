//! A song's spec planned by the 5 Hz LM before the DiT runs, as text2music fills its
//! request from the LM (`_update_metadata_from_lm` and `use_cot_caption`): the LM's
//! caption replaces the user's; its tempo, key and time signature fill the ones the
//! user left empty. The language stays the user's, as upstream's reads a
//! `vocal_language` key its parser never writes.

use std::path::PathBuf;

use candle_core::Device;

use super::plan::{Plan, PlanProgress, PlanRequest, PlanSettings, Planner};
use super::song::{GenerateEvent, GenerateSpec};
use crate::cancel::Cancel;
use crate::device::Precision;
use crate::load::catalog::LmVariant;
use crate::load::discover::{find_lms, preferred_lm};
use crate::load::lm::LmFolder;
use crate::load::places::ModelPlaces;
use crate::{Error, Result};

/// The LM a plan uses: `settings.lm`, else the one found where models are looked for
/// (as labelling finds it), else an error saying how to get one.
pub fn plan_lm(settings: &PlanSettings) -> Result<PathBuf> {
    if let Some(dir) = &settings.lm {
        return Ok(dir.clone());
    }
    let found = find_lms(&ModelPlaces::from_env()?);
    if let Some(lm) = preferred_lm(&found) {
        return Ok(lm.path.clone());
    }
    let default = LmVariant::DEFAULT;
    let mut why = format!(
        "no complete 5 Hz LM found to plan the song: `ostinato models download {}` fetches ACE-Step's ({}), or name its folder",
        default.name(),
        default.approx_size()
    );
    for lm in &found {
        why.push_str(&format!("\n  {}: {}", lm.path.display(), lm.problems.join("; ")));
    }
    Err(Error::setting("lm", why))
}

/// `spec`'s LM loaded (None when it asks for no plan).
pub fn load_planner(spec: &GenerateSpec) -> Result<Option<Planner>> {
    let Some(settings) = &spec.lm else { return Ok(None) };
    let dir = plan_lm(settings)?;
    LmFolder::open(&dir)?;
    Planner::load(&dir, settings.clone(), &Device::Cpu, Precision::default()).map(Some)
}

/// `spec` ready for the DiT: planned by `planner` where it asks for a plan (the
/// `Planned` event says what the LM wrote), else as it is (the `Unplanned` event says
/// why).
pub fn plan_song(
    spec: &GenerateSpec,
    planner: Option<&Planner>,
    cancel: &Cancel,
    on_event: &mut dyn FnMut(GenerateEvent),
) -> Result<GenerateSpec> {
    let (Some(_), Some(planner)) = (&spec.lm, planner) else {
        if spec.lm.is_some() {
            return Err(Error::BadRequest("the song asks for a 5 Hz LM plan but no LM was loaded".into()));
        }
        on_event(GenerateEvent::Unplanned { reason: "no 5 Hz LM asked for (the DiT hears the caption alone)".into() });
        return Ok(spec.clone());
    };
    spec.validate()?;
    let request = PlanRequest {
        caption: spec.caption.clone(),
        lyrics: spec.lyrics.clone(),
        duration_seconds: spec.duration_seconds,
        bpm: spec.bpm,
        keyscale: spec.keyscale.clone(),
        timesignature: spec.timesignature.clone(),
        seed: spec.seed,
    };
    let plan = planner.plan(&request, cancel, &mut |p| {
        let (phase, tokens) = match p {
            PlanProgress::Metadata { tokens } => ("metadata", tokens),
            PlanProgress::Codes { tokens, .. } => ("codes", tokens),
        };
        on_event(GenerateEvent::Planning { phase: phase.into(), tokens });
    })?;
    let planned = filled(spec, &plan)?;
    on_event(GenerateEvent::Planned {
        caption: planned.caption.clone(),
        bpm: planned.bpm,
        keyscale: planned.keyscale.clone(),
        timesignature: planned.timesignature.clone(),
        language: plan.language.clone(),
        codes: plan.codes.len(),
    });
    Ok(planned)
}

/// The spec with the plan's metadata where upstream takes it; the plan itself done.
fn filled(spec: &GenerateSpec, plan: &Plan) -> Result<GenerateSpec> {
    let bpm = match (spec.bpm, &plan.bpm) {
        (Some(b), _) => Some(b),
        (None, Some(text)) => Some(
            text.parse()
                .map_err(|_| Error::BadRequest(format!("the 5 Hz LM's tempo {text:?} is not a whole number")))?,
        ),
        (None, None) => None,
    };
    let planned = GenerateSpec {
        caption: plan.caption.clone().unwrap_or_else(|| spec.caption.clone()),
        bpm,
        keyscale: spec.keyscale.clone().or_else(|| plan.keyscale.clone()),
        timesignature: spec.timesignature.clone().or_else(|| plan.timesignature.clone()),
        // The LM's codes become the DiT's 25 Hz hints (the checkpoint's detokenizer).
        audio_codes: plan.codes.clone(),
        lm: None,
        ..spec.clone()
    };
    planned.validate()?;
    Ok(planned)
}
