//! A tiny 5 Hz LM folder in the real layout with seeded random weights: config.json
//! (Qwen3ForCausalLM, tied embeddings), model.safetensors, a byte-level tokenizer with
//! Qwen's special tokens, `<think>`/`</think>` and every `<|audio_code_N|>` of the real
//! vocabulary, a ChatML chat template and a genres vocabulary. What tests (and anyone
//! trying the labelling flow) run without a download; its words are noise.
//!
//! The weights are shaped so that its output finishes: one hidden dimension is held
//! constant (every embedding has it, no layer writes it), and the (untied) LM head's
//! column for it gives each token a fixed bias: letters and spaces likely, line ends and
//! colons now and then (so captions end and field names close), end tokens, think tags
//! and audio codes never. The genres vocabulary ends the genres; the lyrics run to the
//! token budget.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use super::labeller::GENRES_VOCAB;
use crate::tensor_io::{save_tensors, RandomTensors, TensorSource};
use crate::{Error, Result};

/// Audio-code tokens the real vocabulary holds (codes past the codebook's 64000 too).
pub const AUDIO_CODE_TOKENS: u32 = 65535;

/// Qwen's chat format: `<|im_start|>role\ncontent<|im_end|>\n` per message, then the
/// assistant's turn opened when asked.
const CHAT_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// The model's sizes: small enough to decode thousands of tokens in a test.
const HIDDEN: usize = 16;
const LAYERS: usize = 1;
const HEADS: usize = 2;
const KV_HEADS: usize = 1;
const HEAD_DIM: usize = 8;
const INTERMEDIATE: usize = 32;

/// Writes the folder at `dir` (created); the same `seed` gives the same files.
pub fn write_tiny_lm(dir: &Path, seed: u64) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tokenizer = tokenizer()?;
    let json = dir.join("tokenizer.json");
    tokenizer.save(&json, false).map_err(|e| Error::BadFile { path: json.clone(), reason: e.to_string() })?;
    let vocab = tokenizer.get_vocab_size(true);
    write_json(
        &dir.join("tokenizer_config.json"),
        &serde_json::json!({
            "tokenizer_class": "Qwen2Tokenizer",
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "padding_side": "left",
            "model_max_length": 32768,
            "chat_template": CHAT_TEMPLATE,
        }),
    )?;
    write_json(
        &dir.join("config.json"),
        &serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": vocab,
            "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1_000_000.0,
            "max_position_embeddings": 40960,
            "tie_word_embeddings": false,
            "torch_dtype": "float32",
        }),
    )?;
    let genres = dir.join(GENRES_VOCAB);
    crate::atomic::write_atomically(&genres, GENRES.join("\n").as_bytes())?;
    let random = RandomTensors { seed, device: Device::Cpu };
    let mut tensors = HashMap::new();
    for i in 0..LAYERS {
        let p = |k: &str| format!("model.layers.{i}.{k}");
        for (name, shape) in [
            ("self_attn.q_proj.weight", [HEADS * HEAD_DIM, HIDDEN]),
            ("self_attn.k_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]),
            ("self_attn.v_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]),
            ("mlp.gate_proj.weight", [INTERMEDIATE, HIDDEN]),
            ("mlp.up_proj.weight", [INTERMEDIATE, HIDDEN]),
        ] {
            tensors.insert(p(name), random.get(&p(name), &shape)?);
        }
        for (name, size) in [
            ("self_attn.q_norm.weight", HEAD_DIM),
            ("self_attn.k_norm.weight", HEAD_DIM),
            ("input_layernorm.weight", HIDDEN),
            ("post_attention_layernorm.weight", HIDDEN),
        ] {
            tensors.insert(p(name), random.get(&p(name), &[size])?);
        }
        // The layers leave the constant dimension alone.
        for (name, inner) in [("self_attn.o_proj.weight", HEADS * HEAD_DIM), ("mlp.down_proj.weight", INTERMEDIATE)] {
            let mut w = random.get(&p(name), &[HIDDEN, inner])?.to_vec2::<f32>()?;
            w[0].fill(0.0);
            tensors.insert(p(name), Tensor::new(w, &Device::Cpu)?);
        }
    }
    let mut embed = random.get("model.embed_tokens.weight", &[vocab, HIDDEN])?.to_vec2::<f32>()?;
    let mut head = random.get("lm_head.weight", &[vocab, HIDDEN])?.to_vec2::<f32>()?;
    for (id, (e, h)) in embed.iter_mut().zip(&mut head).enumerate() {
        e[0] = CONSTANT;
        h[0] = bias(&tokenizer, id as u32);
    }
    tensors.insert("model.embed_tokens.weight".into(), Tensor::new(embed, &Device::Cpu)?);
    tensors.insert("lm_head.weight".into(), Tensor::new(head, &Device::Cpu)?);
    tensors.insert("model.norm.weight".into(), Tensor::ones(HIDDEN, candle_core::DType::F32, &Device::Cpu)?);
    save_tensors(&tensors, &dir.join("model.safetensors"))
}

/// The constant dimension's value in every embedding.
const CONSTANT: f32 = 4.0;

/// The genres its vocabulary lets the LM write.
const GENRES: [&str; 6] = ["ambient", "electronic", "folk", "jazz", "pop", "rock"];

/// A token's fixed bias (times the constant dimension after the final norm).
fn bias(tokenizer: &Tokenizer, id: u32) -> f32 {
    let text = tokenizer.decode(&[id], false).unwrap_or_default();
    match text.as_str() {
        "\n" | ":" => 0.3,
        " " => 0.8,
        t if t.len() == 1 && t.chars().all(|c| c.is_ascii_lowercase()) => 1.0,
        t if t.len() == 1 && t.chars().all(|c| c.is_ascii_graphic()) => 0.0,
        _ => -4.0,
    }
}

/// Byte-level BPE over the 256 byte symbols (no merges), then the added tokens.
fn tokenizer() -> Result<Tokenizer> {
    let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    alphabet.sort_unstable();
    let vocab: tokenizers::models::bpe::Vocab =
        alphabet.iter().enumerate().map(|(i, c)| (c.to_string(), i as u32)).collect();
    let bad = |e: tokenizers::Error| Error::Encoder(format!("tiny LM tokenizer: {e}"));
    let bpe = BPE::builder().vocab_and_merges(vocab, Vec::new()).build().map_err(bad)?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    let special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(|t| AddedToken::from(t, true));
    tok.add_special_tokens(special).map_err(bad)?;
    let mut added = vec![AddedToken::from("<think>", false), AddedToken::from("</think>", false)];
    added.extend((0..AUDIO_CODE_TOKENS).map(|n| AddedToken::from(format!("<|audio_code_{n}|>"), false)));
    tok.add_tokens(added).map_err(bad)?;
    Ok(tok)
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("JSON serialises");
    crate::atomic::write_atomically(path, text.as_bytes())
}
