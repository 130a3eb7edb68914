//! What `ostinato bench --preset` names: a DiT training step's shapes, a VAE's, the
//! text side's, a song's labelling or the 5 Hz LM's.

use super::{label, lm, plan, text, vae, Preset};

/// A DiT training-step preset, a VAE preset or the text side's: what `ostinato bench
/// --preset` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnyPreset {
    Dit(Preset),
    Vae(vae::VaePreset),
    /// [`text::TEXT_ENCODE`]
    Text,
    /// [`label::LABEL_240S`]
    Label,
    /// The 5 Hz LM labelling a song ([`lm::run_lm`]).
    Lm(lm::LmPreset),
    /// [`plan::PLAN_PRESET`]: the 5 Hz LM planning a 30 s song.
    Plan,
}

impl std::str::FromStr for AnyPreset {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if let Some(p) = vae::VaePreset::ALL.into_iter().find(|p| p.name() == s) {
            return Ok(AnyPreset::Vae(p));
        }
        if s == text::TEXT_ENCODE {
            return Ok(AnyPreset::Text);
        }
        if s == label::LABEL_240S {
            return Ok(AnyPreset::Label);
        }
        if s == plan::PLAN_PRESET {
            return Ok(AnyPreset::Plan);
        }
        if let Some(p) = lm::LmPreset::ALL.into_iter().find(|p| p.name() == s) {
            return Ok(AnyPreset::Lm(p));
        }
        s.parse::<Preset>().map(AnyPreset::Dit).map_err(|e| {
            let vae: Vec<_> = vae::VaePreset::ALL.iter().map(|p| p.name()).collect();
            let lms: Vec<_> = lm::LmPreset::ALL.iter().map(|p| p.name()).collect();
            format!(
                "{e}, a VAE preset: {}, {}, {} or an LM preset: {}, {}",
                vae.join(", "),
                text::TEXT_ENCODE,
                label::LABEL_240S,
                lms.join(", "),
                plan::PLAN_PRESET
            )
        })
    }
}
