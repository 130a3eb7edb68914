//! A tiny 5 Hz LM folder in the real layout with seeded random weights: config.json
//! (Qwen3ForCausalLM, tied embeddings), model.safetensors, a byte-level tokenizer with
//! Qwen's special tokens, `<think>`/`</think>` and every `<|audio_code_N|>` of the real
//! vocabulary, and a ChatML chat template. What tests (and anyone trying the labelling
//! flow) run without a download; its words are noise.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Device;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

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
            "tie_word_embeddings": true,
            "torch_dtype": "float32",
        }),
    )?;
    let random = RandomTensors { seed, device: Device::Cpu };
    let mut tensors = HashMap::new();
    let mut put = |name: String, shape: &[usize]| -> Result<()> {
        tensors.insert(name.clone(), random.get(&name, shape)?);
        Ok(())
    };
    put("model.embed_tokens.weight".into(), &[vocab, HIDDEN])?;
    put("model.norm.weight".into(), &[HIDDEN])?;
    for i in 0..LAYERS {
        let p = |k: &str| format!("model.layers.{i}.{k}");
        put(p("self_attn.q_proj.weight"), &[HEADS * HEAD_DIM, HIDDEN])?;
        put(p("self_attn.k_proj.weight"), &[KV_HEADS * HEAD_DIM, HIDDEN])?;
        put(p("self_attn.v_proj.weight"), &[KV_HEADS * HEAD_DIM, HIDDEN])?;
        put(p("self_attn.o_proj.weight"), &[HIDDEN, HEADS * HEAD_DIM])?;
        put(p("self_attn.q_norm.weight"), &[HEAD_DIM])?;
        put(p("self_attn.k_norm.weight"), &[HEAD_DIM])?;
        put(p("mlp.gate_proj.weight"), &[INTERMEDIATE, HIDDEN])?;
        put(p("mlp.up_proj.weight"), &[INTERMEDIATE, HIDDEN])?;
        put(p("mlp.down_proj.weight"), &[HIDDEN, INTERMEDIATE])?;
        put(p("input_layernorm.weight"), &[HIDDEN])?;
        put(p("post_attention_layernorm.weight"), &[HIDDEN])?;
    }
    save_tensors(&tensors, &dir.join("model.safetensors"))
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
