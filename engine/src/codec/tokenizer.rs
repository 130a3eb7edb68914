//! The text encoder's tokenizer as transformers calls it for ACE-Step:
//! `truncation=True, max_length=N` with `padding="max_length"` (training's
//! preprocessing) or `padding="longest"` (generation, one text: no padding), the
//! padding and truncation sides read from `tokenizer_config.json` (Qwen3-Embedding
//! pads on the left). The `tokenizers` crate does the work, so special tokens,
//! truncation and padding follow the same code as Python's fast tokenizer.

use std::path::Path;

use serde_json::Value;
use tokenizers::models::ModelWrapper;
use tokenizers::{
    PaddingDirection, PaddingParams, PaddingStrategy, Tokenizer, TruncationDirection, TruncationParams,
    TruncationStrategy,
};

use crate::{Error, Result};

/// Token ids and their mask (true = a real token): `max_len` long when padded, else
/// at most that.
#[derive(Debug, Clone, PartialEq)]
pub struct Tokens {
    pub ids: Vec<u32>,
    pub mask: Vec<bool>,
}

/// How a text shorter than the limit is filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// Padded to the limit (`padding="max_length"`).
    ToLimit,
    /// As long as its tokens (`padding="longest"` on one text).
    None,
}

/// Reads a `tokenizer.json` with its BPE word cache off. tokenizers 0.23 keeps that
/// cache in thread-locals keyed by the tokenizer, which outlive it: every tokenizer
/// loaded would leave the words it encoded on each thread that encoded them, for as
/// long as the thread lives (the LM's constraint tables alone left ~180 KB per LM
/// loaded). Each of our texts is encoded once, so the cache saves nothing.
pub fn read_tokenizer(path: &Path) -> Result<Tokenizer> {
    let mut tok = Tokenizer::from_file(path)
        .map_err(|e| Error::BadFile { path: path.to_path_buf(), reason: format!("cannot load the tokenizer: {e}") })?;
    if let ModelWrapper::BPE(bpe) = tok.get_model() {
        let mut uncached = bpe.clone();
        uncached.resize_cache(0);
        tok.with_model(uncached);
    }
    Ok(tok)
}

pub struct TextTokenizer {
    tok: Tokenizer,
    max_len: usize,
}

fn side(config: &Value, key: &str) -> &'static str {
    match config.get(key).and_then(Value::as_str) {
        Some("left") => "left",
        _ => "right", // transformers' default for both sides
    }
}

impl TextTokenizer {
    /// Reads `dir/tokenizer.json` and `dir/tokenizer_config.json`; texts are cut to
    /// `max_len` tokens and padded as `padding` says.
    pub fn from_dir(dir: &Path, max_len: usize, padding: Padding) -> Result<Self> {
        let json = dir.join("tokenizer.json");
        let cfg_path = dir.join("tokenizer_config.json");
        let bad = |path: &Path, reason: String| Error::BadFile { path: path.to_path_buf(), reason };
        let mut tok = read_tokenizer(&json)?;
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
        let config: Value =
            serde_json::from_str(&text).map_err(|cause| Error::Json { path: cfg_path.clone(), cause })?;
        let pad_token = match config.get("pad_token") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).unwrap_or_default().to_string(),
            _ => String::new(),
        };
        let pad_id = tok
            .token_to_id(&pad_token)
            .ok_or_else(|| bad(&cfg_path, format!("pad_token {pad_token:?} is not in tokenizer.json")))?;
        let direction = if side(&config, "truncation_side") == "left" {
            TruncationDirection::Left
        } else {
            TruncationDirection::Right
        };
        tok.with_truncation(Some(TruncationParams {
            max_length: max_len,
            strategy: TruncationStrategy::LongestFirst,
            stride: 0,
            direction,
        }))
        .map_err(|e| bad(&json, e.to_string()))?;
        tok.with_padding((padding == Padding::ToLimit).then(|| PaddingParams {
            strategy: PaddingStrategy::Fixed(max_len),
            direction: if side(&config, "padding_side") == "left" {
                PaddingDirection::Left
            } else {
                PaddingDirection::Right
            },
            pad_to_multiple_of: None,
            pad_id,
            pad_type_id: 0,
            pad_token,
        }));
        Ok(Self { tok, max_len })
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    pub fn encode(&self, text: &str) -> Result<Tokens> {
        let enc = self.tok.encode(text, true).map_err(|e| Error::Encoder(format!("tokenizer: {e}")))?;
        Ok(Tokens { ids: enc.get_ids().to_vec(), mask: enc.get_attention_mask().iter().map(|&m| m != 0).collect() })
    }
}
