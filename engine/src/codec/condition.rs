//! Conditioning: a song's caption, metas and lyrics become the DiT's cross-attention
//! input, plus its context latents. The real ACE-Step condition encoder (Qwen3 text
//! states + lyric/timbre encoders) implements the same trait; `HashConditioner` is
//! the weight-free one of the built-in demo model.
//!
//! ACE-Step conditions a training sample and a song to generate differently (its
//! preprocessing vs its handler's text2music path): hence two methods.

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use super::encode::{silence_latent, LatentEncoder};
use crate::Result;

/// What a song is about, as ACE-Step's prompt needs it. Read from sidecars.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SongMeta {
    pub caption: String,
    /// The lyrics, or "[Instrumental]" when there are none.
    pub lyrics: String,
    pub bpm: Option<u32>,
    pub keyscale: Option<String>,
    pub timesignature: Option<String>,
    pub language: Option<String>,
    pub genre: Option<String>,
    /// Length of the whole decoded file (before any cut), as ACE-Step's metas use it.
    pub duration_seconds: f64,
}

pub const INSTRUMENTAL: &str = "[Instrumental]";

impl SongMeta {
    pub fn has_caption(&self) -> bool {
        !self.caption.trim().is_empty()
    }

    /// Lyrics to sing: neither empty nor ACE-Step's instrumental marker.
    pub fn has_lyrics(&self) -> bool {
        let lyrics = self.lyrics.trim();
        !lyrics.is_empty() && lyrics != INSTRUMENTAL
    }
}

impl Default for SongMeta {
    fn default() -> Self {
        Self {
            caption: String::new(),
            lyrics: INSTRUMENTAL.to_string(),
            bpm: None,
            keyscale: None,
            timesignature: None,
            language: None,
            genre: None,
            duration_seconds: 0.0,
        }
    }
}

/// What the DiT is conditioned on for one sample.
#[derive(Debug, Clone)]
pub struct Conditioning {
    /// (L, D)
    pub encoder_hidden_states: Tensor,
    /// (L,) f32, 1 = valid row
    pub encoder_attention_mask: Tensor,
    /// (T, 2 * latent channels): silence latent ++ ones
    pub context_latents: Tensor,
}

pub trait Conditioner: Send + Sync {
    /// Stable id including every setting; it enters the cache key.
    fn id(&self) -> String;
    /// A training sample's condition (ACE-Step's preprocessing).
    fn condition(&self, meta: &SongMeta, num_frames: usize) -> Result<Conditioning>;
    /// The condition of a song to generate (ACE-Step's text2music inference, its
    /// instruction `task`'s).
    fn generation_condition(&self, meta: &SongMeta, task: Task, num_frames: usize) -> Result<Conditioning>;
}

/// What ACE-Step's DiT is asked to do, as its prompt's instruction says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// A song from its caption, metadata and lyrics over the silence latent.
    Text2Music,
    /// A song over 25 Hz hints (a 5 Hz plan's or a source song's): upstream's handler
    /// turns text2music given audio codes into this.
    Cover,
}

impl Task {
    /// ACE-Step's `TASK_INSTRUCTIONS`.
    pub fn instruction(self) -> &'static str {
        match self {
            Task::Text2Music => "Fill the audio semantic mask based on the given conditions:",
            Task::Cover => "Generate audio semantic tokens based on the given conditions:",
        }
    }
}
/// ACE-Step's vocal language when none is given (its `GenerationParams` and UI default).
pub const UNKNOWN_LANGUAGE: &str = "unknown";

/// ACE-Step's text prompt for a song (text2music, as its training prompts are).
pub fn text_prompt(meta: &SongMeta) -> String {
    task_prompt(meta, Task::Text2Music)
}

/// ACE-Step's text prompt for a song with `task`'s instruction.
pub fn task_prompt(meta: &SongMeta, task: Task) -> String {
    let na = |v: Option<String>| v.unwrap_or_else(|| "N/A".into());
    let metas = format!(
        "- bpm: {}\n- timesignature: {}\n- keyscale: {}\n- duration: {} seconds\n",
        na(meta.bpm.map(|b| b.to_string())),
        na(meta.timesignature.clone()),
        na(meta.keyscale.clone()),
        meta.duration_seconds.floor() as u64,
    );
    let instruction = task.instruction();
    format!("# Instruction\n{instruction}\n\n# Caption\n{}\n\n# Metas\n{metas}<|endoftext|>\n", meta.caption)
}

/// The lyrics as ACE-Step's generation gives them to the text encoder (its handler's
/// `_format_lyrics`); training's preprocessing takes the bare lyrics instead.
pub fn lyrics_prompt(meta: &SongMeta) -> String {
    let language = meta.language.as_deref().unwrap_or(UNKNOWN_LANGUAGE);
    format!("# Languages\n{language}\n\n# Lyric\n{}<|endoftext|>", meta.lyrics)
}

/// ACE-Step's context latents: the silence latent's first T rows (repeated when it
/// is shorter) next to a ones mask of the same width. (T, 2C)
pub fn context_latents(silence: &Tensor, num_frames: usize) -> Result<Tensor> {
    let n = silence.dim(0)?;
    let rows: Vec<u32> = (0..num_frames).map(|i| (i % n.max(1)) as u32).collect();
    let rows = Tensor::from_vec(rows, num_frames, silence.device())?;
    let s = silence.index_select(&rows, 0)?;
    Ok(Tensor::cat(&[&s, &s.ones_like()?], 1)?)
}

/// The context latents of a song over `hints [H, C]`, from its text2music ones
/// `silence_context [T, 2C]` ([`context_latents`]): as upstream's handler given audio
/// codes, the hints are the source latents, cropped to T frames or completed with the
/// silence latent's first rows, next to the same ones chunk mask. (T, 2C)
pub fn hinted_context_latents(hints: &Tensor, silence_context: &Tensor) -> Result<Tensor> {
    let (frames, width) = silence_context.dims2()?;
    let (have, c) = hints.dims2()?;
    if width != 2 * c {
        return Err(crate::Error::BadRequest(format!(
            "hints of {c} channels do not fit context latents of {width} (2 x the latent channels)"
        )));
    }
    let hints = hints.to_dtype(silence_context.dtype())?.to_device(silence_context.device())?;
    let src = match have.checked_sub(frames) {
        Some(_) => hints.narrow(0, 0, frames)?,
        None => Tensor::cat(&[&hints, &silence_context.narrow(0, 0, frames - have)?.narrow(1, 0, c)?], 0)?,
    };
    Ok(Tensor::cat(&[&src, &silence_context.narrow(1, c, c)?], 1)?)
}

/// Lower-cased words and single punctuation marks.
fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c.is_alphanumeric() {
            word.extend(c.to_lowercase());
            continue;
        }
        if !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// Hashed token embeddings: each (namespace, token) seeds its own N(0, 1) vector of
/// `hidden_size`. Rows are packed as ACE-Step packs them: valid lyric rows, one
/// timbre row, valid text rows, then padded lyric rows, then padded text rows
/// (zeros, mask 0). Context latents come from the encoder's silence latent.
pub struct HashConditioner {
    hidden_size: usize,
    text_tokens: usize,
    lyric_tokens: usize,
    silence: Tensor,
}

impl HashConditioner {
    /// `silence` is the latent encoder's silence latent (N, C), e.g. from
    /// `encode::silence_latent`. Token lengths default to ACE-Step's 256 / 512.
    pub fn new(hidden_size: usize, silence: Tensor) -> Self {
        Self { hidden_size, text_tokens: 256, lyric_tokens: 512, silence }
    }

    /// For a weight-free encoder whose silence latent is the same every frame (the
    /// demo's): one second of its silence, repeated to any length.
    pub fn for_encoder(hidden_size: usize, encoder: &dyn LatentEncoder) -> Result<Self> {
        let frames = encoder.frames_per_second().ceil() as usize;
        Ok(Self::new(hidden_size, silence_latent(encoder, frames)?))
    }

    /// Shorter sequences make a small demo model faster.
    pub fn with_max_tokens(mut self, text: usize, lyrics: usize) -> Self {
        self.text_tokens = text;
        self.lyric_tokens = lyrics;
        self
    }

    fn embedding(&self, namespace: &str, token: &str) -> Vec<f32> {
        let mut h = blake3::Hasher::new();
        h.update(namespace.as_bytes()).update(&[0]).update(token.as_bytes());
        let seed: [u8; 32] = *h.finalize().as_bytes();
        let mut rng = rand_chacha::ChaCha8Rng::from_seed(seed);
        (0..self.hidden_size)
            .map(|_| <StandardNormal as Distribution<f32>>::sample(&StandardNormal, &mut rng))
            .collect()
    }
}

impl Conditioner for HashConditioner {
    fn id(&self) -> String {
        let silence_hash = self
            .silence
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map(|v| {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                blake3::hash(&bytes).to_hex()[..16].to_string()
            })
            .unwrap_or_default();
        format!(
            "hash-cond-v1:d{}:text{}:lyrics{}:silence{:?}-{silence_hash}",
            self.hidden_size,
            self.text_tokens,
            self.lyric_tokens,
            self.silence.dims()
        )
    }

    fn condition(&self, meta: &SongMeta, num_frames: usize) -> Result<Conditioning> {
        let mut text = tokens(&text_prompt(meta));
        text.truncate(self.text_tokens);
        let mut lyrics = tokens(&meta.lyrics);
        lyrics.truncate(self.lyric_tokens);

        let d = self.hidden_size;
        let rows = self.lyric_tokens + 1 + self.text_tokens;
        let mut states = Vec::with_capacity(rows * d);
        for t in &lyrics {
            states.extend(self.embedding("lyrics", t));
        }
        states.extend(self.embedding("timbre", ""));
        for t in &text {
            states.extend(self.embedding("text", t));
        }
        let valid = states.len() / d;
        states.resize(rows * d, 0.0);
        let mask: Vec<f32> = (0..rows).map(|i| if i < valid { 1.0 } else { 0.0 }).collect();

        Ok(Conditioning {
            encoder_hidden_states: Tensor::from_vec(states, (rows, d), &Device::Cpu)?,
            encoder_attention_mask: Tensor::from_vec(mask, rows, &Device::Cpu)?,
            context_latents: context_latents(&self.silence.to_dtype(DType::F32)?, num_frames)?,
        })
    }

    /// The demo model generates from the embeddings it was trained on: it has no
    /// ACE-Step inference path to follow.
    fn generation_condition(&self, meta: &SongMeta, _task: Task, num_frames: usize) -> Result<Conditioning> {
        self.condition(meta, num_frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> SongMeta {
        SongMeta {
            caption: "warm lo-fi piano".into(),
            bpm: Some(84),
            keyscale: Some("F major".into()),
            duration_seconds: 95.7,
            ..SongMeta::default()
        }
    }

    #[test]
    fn prompt_follows_ace_step() {
        assert_eq!(
            text_prompt(&meta()),
            "# Instruction\nFill the audio semantic mask based on the given conditions:\n\n\
             # Caption\nwarm lo-fi piano\n\n# Metas\n- bpm: 84\n- timesignature: N/A\n\
             - keyscale: F major\n- duration: 95 seconds\n<|endoftext|>\n"
        );
    }

    #[test]
    fn lyrics_prompt_follows_acestep_generation() {
        let mut m = meta();
        m.lyrics = "[Verse]\nla la".into();
        assert_eq!(lyrics_prompt(&m), "# Languages\nunknown\n\n# Lyric\n[Verse]\nla la<|endoftext|>");
        m.language = Some("en".into());
        assert_eq!(lyrics_prompt(&m), "# Languages\nen\n\n# Lyric\n[Verse]\nla la<|endoftext|>");
    }

    #[test]
    fn tokenizer() {
        assert_eq!(tokens("Hello, World! lo-fi"), ["hello", ",", "world", "!", "lo", "-", "fi"]);
    }

    #[test]
    fn packing_mask_and_context() {
        let silence = Tensor::arange(0f32, 6.0, &Device::Cpu).unwrap().reshape((3, 2)).unwrap();
        let c = HashConditioner::new(8, silence).with_max_tokens(64, 16);
        let mut m = meta();
        m.lyrics = "la la la".into();
        let out = c.condition(&m, 5).unwrap();
        assert_eq!(out.encoder_hidden_states.dims(), [16 + 1 + 64, 8]);
        let mask: Vec<f32> = out.encoder_attention_mask.to_vec1().unwrap();
        let text = tokens(&text_prompt(&m)).len().min(64);
        let valid = 3 + 1 + text;
        assert!(mask[..valid].iter().all(|&x| x == 1.0));
        assert!(mask[valid..].iter().all(|&x| x == 0.0));
        let states: Vec<Vec<f32>> = out.encoder_hidden_states.to_vec2().unwrap();
        assert_eq!(states[0], states[1], "same lyric token, same row");
        assert!(states[valid..].iter().all(|r| r.iter().all(|&x| x == 0.0)));
        assert!(states[..valid].iter().all(|r| r.iter().any(|&x| x != 0.0)));
        // Context: silence rows 0,1,2,0,1 then ones.
        let ctx: Vec<Vec<f32>> = out.context_latents.to_vec2().unwrap();
        assert_eq!(ctx, [[0., 1., 1., 1.], [2., 3., 1., 1.], [4., 5., 1., 1.], [0., 1., 1., 1.], [2., 3., 1., 1.]]);
    }

    #[test]
    fn deterministic_and_caption_sensitive() {
        let silence = Tensor::zeros((4, 64), DType::F32, &Device::Cpu).unwrap();
        let c = HashConditioner::new(32, silence);
        let a = c.condition(&meta(), 10).unwrap().encoder_hidden_states;
        let b = c.condition(&meta(), 10).unwrap().encoder_hidden_states;
        let mut other = meta();
        other.caption = "aggressive metal".into();
        let d = c.condition(&other, 10).unwrap().encoder_hidden_states;
        let diff =
            |x: &Tensor, y: &Tensor| (x - y).unwrap().abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(diff(&a, &b), 0.0);
        assert!(diff(&a, &d) > 0.0);
        assert_eq!(a.dims(), [512 + 1 + 256, 32]);
        assert_eq!(c.condition(&meta(), 10).unwrap().context_latents.dims(), [10, 128]);
    }
}
