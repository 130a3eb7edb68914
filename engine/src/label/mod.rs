//! What a song is trained with, beyond its audio: tempo, key and meter read from the
//! signal (`analysis`), and each field's value with where it comes from.

pub mod analysis;

use serde::Serialize;

use crate::codec::SongMeta;
use analysis::{Analysis, Reading};

/// Where a field's value comes from, in order of precedence: what the user wrote
/// beside the song wins over what the audio suggests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Sidecar,
    Analysed,
}

/// One metadata field of a song: the value it takes and from where (None: unknown, N/A
/// to ACE-Step), and what the analysis read, shown beside a sidecar's value rather
/// than replacing it.
#[derive(Debug, Clone, PartialEq)]
pub struct Label<T> {
    pub value: Option<T>,
    pub source: Option<Source>,
    pub analysed: Reading<T>,
}

impl<T: Clone> Label<T> {
    fn pick(sidecar: Option<T>, analysed: Reading<T>) -> Self {
        let (value, source) = match (sidecar, &analysed) {
            (Some(given), _) => (Some(given), Some(Source::Sidecar)),
            (None, Ok(read)) => (Some(read.value.clone()), Some(Source::Analysed)),
            (None, Err(_)) => (None, None),
        };
        Label { value, source, analysed }
    }
}

/// A song's tempo, key and time signature (ACE-Step's `bpm`, `keyscale`,
/// `timesignature`) and its length.
#[derive(Debug, Clone, PartialEq)]
pub struct SongLabels {
    pub bpm: Label<u32>,
    pub keyscale: Label<String>,
    /// As ACE-Step writes it: the numerator, "4".
    pub timesignature: Label<String>,
    /// Seconds in the whole file.
    pub duration: f64,
}

impl SongLabels {
    /// The sidecars' values (`meta`) field by field, the analysis's where they give none.
    pub fn resolve(meta: &SongMeta, analysis: Analysis) -> Self {
        let timesignature =
            analysis.timesignature.map(|e| analysis::Estimate { value: e.value.to_string(), confidence: e.confidence });
        SongLabels {
            bpm: Label::pick(meta.bpm, analysis.bpm),
            keyscale: Label::pick(meta.keyscale.clone(), analysis.keyscale),
            timesignature: Label::pick(meta.timesignature.clone(), timesignature),
            duration: analysis.duration,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::analysis::Estimate;
    use super::*;

    #[test]
    fn a_sidecars_value_is_kept_and_the_analysis_shown_beside_it() {
        let meta = SongMeta { bpm: Some(90), timesignature: Some("3".into()), ..SongMeta::default() };
        let analysis = Analysis {
            duration: 30.0,
            bpm: Ok(Estimate { value: 120, confidence: 0.9 }),
            keyscale: Ok(Estimate { value: "A minor".into(), confidence: 0.8 }),
            timesignature: Err("too few beats".into()),
        };
        let labels = SongLabels::resolve(&meta, analysis);
        assert_eq!((labels.bpm.value, labels.bpm.source), (Some(90), Some(Source::Sidecar)));
        assert_eq!(labels.bpm.analysed.as_ref().unwrap().value, 120);
        assert_eq!(
            (labels.keyscale.value.as_deref(), labels.keyscale.source),
            (Some("A minor"), Some(Source::Analysed))
        );
        assert_eq!(
            (labels.timesignature.value.as_deref(), labels.timesignature.source),
            (Some("3"), Some(Source::Sidecar))
        );
        let unknown = SongLabels::resolve(
            &SongMeta::default(),
            Analysis { duration: 1.0, bpm: Err("x".into()), keyscale: Err("x".into()), timesignature: Err("x".into()) },
        );
        assert_eq!((unknown.bpm.value, unknown.bpm.source), (None, None));
    }
}
