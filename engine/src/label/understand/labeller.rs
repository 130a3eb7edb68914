//! Labelling songs with ACE-Step's 5 Hz LM, as upstream's dataset labeller does: the LM
//! loaded once for a batch of songs (and freed with the labeller), each song's codes,
//! the understand prompt, decoding under the metadata constraint, and the fields read
//! from what the LM wrote, each checked as a label value.

use std::path::Path;

use candle_core::Device;
use serde::Serialize;

use super::codes::song_codes;
use super::constrained::{read_genres_vocab, MetadataConstraint, MetadataTables};
use super::decode::{Decoded, MAX_NEW_TOKENS};
use super::parse::{parse_understanding, IntOrText};
use super::prompt::UnderstandPrompt;
use super::sample::{Sampler, Sampling};
use super::steps::LmSteps;
use crate::cancel::Cancel;
use crate::codec::causal_lm::CausalLm;
use crate::data::{Field, Labels};
use crate::device::Precision;
use crate::load::source::{ModelSource, SongTokenizer};
use crate::{Error, Result};

/// A genres vocabulary beside the LM's weights constrains the genres as upstream's
/// `genres_vocab.txt` does; without one (upstream ships none) they are free text.
pub const GENRES_VOCAB: &str = "genres_vocab.txt";

/// The longest duration the constraint lets the LM write: upstream's top GPU tier
/// (labelling generates no audio, so no memory tier applies).
pub const MAX_DURATION: u32 = 600;

/// How the LM is loaded and writes. The defaults are upstream's dataset labeller's.
#[derive(Debug, Clone, PartialEq)]
pub struct UnderstandSettings {
    pub sampling: Sampling,
    /// Each song's draw starts from this seed, so a song reads the same in any batch.
    pub seed: u64,
    pub max_new_tokens: usize,
    /// Seconds: the duration field's upper bound.
    pub max_duration: u32,
    pub precision: Precision,
}

impl Default for UnderstandSettings {
    fn default() -> Self {
        Self {
            sampling: Sampling::default(),
            seed: 0,
            max_new_tokens: MAX_NEW_TOKENS,
            max_duration: MAX_DURATION,
            precision: Precision::default(),
        }
    }
}

/// Where a song's labelling is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "stage", rename_all = "snake_case")]
pub enum Progress {
    /// The song's audio through the latent encoder: seconds encoded of its length.
    Listening { seconds: f64, of: f64 },
    /// The LM's tokens so far, of at most `budget`.
    Writing { tokens: usize, budget: usize },
}

/// What the LM wrote of one song.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Labelled {
    /// Its values as labels: caption, lyrics, language, genre, and its guesses at
    /// tempo, key and meter.
    pub labels: Labels,
    /// Values that are no label value (a tempo out of range, an unknown language):
    /// the field, what the LM wrote, and why it is left out.
    pub refused: Vec<(Field, String, String)>,
    /// The song's length as the LM wrote it (no label: the audio says it).
    pub duration: Option<String>,
    /// 5 Hz codes the LM heard.
    pub codes: usize,
    /// Tokens it wrote.
    pub tokens: usize,
    /// What it wrote, whole.
    pub text: String,
}

/// ACE-Step's LM and what turns songs into its codes, held while a batch is labelled.
pub struct LmLabeller {
    settings: UnderstandSettings,
    songs: SongTokenizer,
    lm: CausalLm,
    prompt: UnderstandPrompt,
    tables: MetadataTables,
}

impl LmLabeller {
    /// The LM at `lm_dir`, and `model`'s VAE and audio tokenizer for the songs' codes.
    pub fn load(lm_dir: &Path, model: &ModelSource, device: &Device, settings: UnderstandSettings) -> Result<Self> {
        settings.sampling.validate()?;
        if settings.max_new_tokens == 0 {
            return Err(Error::setting("max_new_tokens", "0 leaves the LM no token to write"));
        }
        let prompt = UnderstandPrompt::new(lm_dir)?;
        let genres_file = lm_dir.join(GENRES_VOCAB);
        let genres = match genres_file.is_file() {
            true => Some(read_genres_vocab(&genres_file)?),
            false => None,
        };
        let tables = MetadataTables::new(prompt.tokenizer(), settings.max_duration, genres.as_deref())?;
        let lm = CausalLm::load(lm_dir, device, settings.precision)?;
        let songs = model.song_tokenizer(device)?;
        Ok(Self { settings, songs, lm, prompt, tables })
    }

    pub fn settings(&self) -> &UnderstandSettings {
        &self.settings
    }

    /// What the LM writes of the song at `song`. An output that never closes its think
    /// block is an error: its fields may be cut short and it has no lyrics.
    pub fn understand(&self, song: &Path, cancel: &Cancel, progress: &mut dyn FnMut(Progress)) -> Result<Labelled> {
        let codes =
            song_codes(song, &self.songs, cancel, &mut |seconds, of| progress(Progress::Listening { seconds, of }))?;
        let budget = self.settings.max_new_tokens;
        let decoded = self.write(&codes, cancel, &mut |tokens| progress(Progress::Writing { tokens, budget }))?;
        if let Some(reason) = decoded.unfinished() {
            return Err(Error::Understand { path: song.to_path_buf(), reason: format!("{reason}: no labels kept") });
        }
        Ok(read(decoded, codes.len()))
    }

    /// The LM's output for a song's codes: the understand prompt decoded under the
    /// metadata constraint. `progress` hears the tokens written so far.
    pub fn write(&self, codes: &[u32], cancel: &Cancel, progress: &mut dyn FnMut(usize)) -> Result<Decoded> {
        let prompt = self.prompt.tokens(codes)?;
        let budget = self.settings.max_new_tokens;
        let mut model = LmSteps::new(&self.lm, budget);
        let mut sampler = Sampler::new(self.settings.sampling, self.settings.seed)?;
        let mut constraint = MetadataConstraint::new(&self.tables);
        self.prompt.decoder(budget).run(&mut model, &mut constraint, &mut sampler, &prompt, cancel, progress)
    }
}

/// The fields of a finished output as label values, each checked.
fn read(decoded: Decoded, codes: usize) -> Labelled {
    let read = parse_understanding(&decoded.text);
    let written = [
        (Field::Caption, read.caption),
        (Field::Lyrics, read.lyrics),
        (Field::Language, read.language),
        (Field::Genre, read.genres),
        (Field::Bpm, read.bpm.map(int_or_text)),
        (Field::Keyscale, read.keyscale),
        (Field::Timesignature, read.timesignature),
    ];
    let mut labelled = Labelled {
        labels: Labels::default(),
        refused: Vec::new(),
        duration: read.duration.map(int_or_text),
        codes,
        tokens: decoded.ids.len(),
        text: decoded.text,
    };
    for (field, value) in written {
        let Some(value) = value else { continue };
        match field.parse(&value) {
            Ok(parsed) => labelled.labels.put(field, parsed),
            Err(why) => labelled.refused.push((field, value, why)),
        }
    }
    labelled
}

fn int_or_text(value: IntOrText) -> String {
    match value {
        IntOrText::Int(n) => n.to_string(),
        IntOrText::Text(t) => t,
    }
}
