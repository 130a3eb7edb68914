//! The understand mode's text side against upstream's own outputs (fixtures made by
//! scripts/make_lm_fixtures.py under PyTorch): the prompt's text and ids, the parser on
//! every case, the decoding loop's stopping and text on upstream's greedy runs, and the
//! LM folders that must be refused.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde_json::{json, Value};

use ostinato_engine::cancel::Cancel;
use ostinato_engine::label::understand::decode::{LogitsProcessor, NextLogits, Rows, Stop};
use ostinato_engine::label::understand::parse::{parse_understanding, IntOrText, Understood};
use ostinato_engine::label::understand::prompt::UnderstandPrompt;
use ostinato_engine::label::understand::sample::{Sampler, Sampling};
use ostinato_engine::{Error, Result};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lm_tiny")
}

fn lm_dir() -> PathBuf {
    fixtures().join("acestep-5Hz-lm-tiny")
}

fn expected_json() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("expected.json")).unwrap()).unwrap()
}

fn expected_ids(name: &str) -> Vec<u32> {
    let tensors: HashMap<String, Tensor> =
        candle_core::safetensors::load(fixtures().join("expected.safetensors"), &Device::Cpu).unwrap();
    tensors[name].to_vec1::<i64>().unwrap().into_iter().map(|id| u32::try_from(id).unwrap()).collect()
}

#[test]
fn prompt_text_and_ids_match_upstream() {
    let prompt = UnderstandPrompt::new(&lm_dir()).unwrap();
    let expected = expected_json();
    let codes = expected_ids("codes");
    assert_eq!(prompt.render(&codes).unwrap(), expected["prompt"].as_str().unwrap());
    assert_eq!(prompt.tokens(&codes).unwrap(), expected_ids("prompt_ids"));
    let token = |name: &str| prompt.tokenizer().token_to_id(name).unwrap();
    assert_eq!((prompt.eos(), prompt.pad()), (token("<|im_end|>"), token("<|endoftext|>")));
}

/// Upstream's metadata dict (bpm/duration int or string, the rest strings).
fn as_upstream_dict(fields: &Understood) -> Value {
    let number = |n: &IntOrText| match n {
        IntOrText::Int(i) => json!(i),
        IntOrText::Text(t) => json!(t),
    };
    let mut dict = serde_json::Map::new();
    let mut put = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            dict.insert(key.to_string(), value);
        }
    };
    put("bpm", fields.bpm.as_ref().map(number));
    put("caption", fields.caption.clone().map(Value::from));
    put("duration", fields.duration.as_ref().map(number));
    put("genres", fields.genres.clone().map(Value::from));
    put("keyscale", fields.keyscale.clone().map(Value::from));
    put("language", fields.language.clone().map(Value::from));
    put("timesignature", fields.timesignature.clone().map(Value::from));
    put("lyrics", fields.lyrics.clone().map(Value::from));
    Value::Object(dict)
}

#[test]
fn every_parser_case_reads_as_upstream_reads_it() {
    let expected = expected_json();
    let cases = expected["parser_cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let text = case["text"].as_str().unwrap();
        let fields = parse_understanding(text);
        let mut metadata = case["metadata"].clone();
        let lyrics = case["lyrics"].as_str().unwrap();
        if !lyrics.is_empty() {
            metadata["lyrics"] = json!(lyrics);
        }
        assert_eq!(as_upstream_dict(&fields), metadata, "case {name}: {text:?}");
        assert_eq!(fields.think_closed, text.contains("</think>"), "case {name}");
    }
}

/// Replays upstream's generated ids: each step's scores make the next one the best.
struct Replay {
    ids: Vec<u32>,
    vocab: usize,
    fed: usize,
}

impl Replay {
    fn scores(&self) -> Vec<f32> {
        let mut scores = vec![0.0; self.vocab];
        if let Some(&next) = self.ids.get(self.fed) {
            scores[next as usize] = 1.0;
        }
        scores
    }
}

impl NextLogits for Replay {
    fn prefill(&mut self, _prompt: &[u32], _rows: &Rows) -> Result<Vec<f32>> {
        Ok(self.scores())
    }
    fn step(&mut self, _token: u32, _rows: &Rows) -> Result<Vec<f32>> {
        self.fed += 1;
        Ok(self.scores())
    }
}

struct Unconstrained;

impl LogitsProcessor for Unconstrained {
    fn process(&mut self, _scores: &mut [f32]) {}
    fn update(&mut self, _token: u32) {}
}

#[test]
fn upstream_greedy_runs_stop_and_read_as_upstream() {
    let prompt = UnderstandPrompt::new(&lm_dir()).unwrap();
    let expected = expected_json();
    let budget = expected["max_new_tokens"].as_u64().unwrap() as usize;
    let vocab = prompt.tokenizer().get_vocab_size(true);
    for (ids_name, run, stop) in
        [("greedy_ids", "greedy", Stop::EndToken), ("greedy_ids_genres", "greedy_genres", Stop::Budget)]
    {
        let ids = expected_ids(ids_name);
        let mut model = Replay { ids: ids.clone(), vocab, fed: 0 };
        let mut sampler = Sampler::new(Sampling { temperature: 0.0, ..Sampling::default() }, 0).unwrap();
        let out = prompt
            .decoder(budget)
            .run(&mut model, &mut Unconstrained, &mut sampler, &expected_ids("prompt_ids"), &Cancel::never(), |_| {})
            .unwrap();
        assert_eq!(out.ids, ids, "{run}");
        assert_eq!(out.stop, stop, "{run}");
        assert_eq!(out.text, expected[run]["text"].as_str().unwrap(), "{run}");
        assert_eq!(out.closed_think(), expected[run]["closed_think"].as_bool().unwrap(), "{run}");
        let fields = parse_understanding(&out.text);
        assert_eq!(as_upstream_dict(&fields), expected[run]["metadata"], "{run}");
    }
}

/// A copy of the fixture LM folder (less its weights) with `change` applied to the JSON
/// file `name`.
fn altered_lm(name: &str, change: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for file in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(lm_dir().join(file), dir.path().join(file)).unwrap();
    }
    let path = dir.path().join(name);
    let mut value: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    change(&mut value);
    std::fs::write(&path, serde_json::to_string(&value).unwrap()).unwrap();
    dir
}

fn refusal(dir: &Path) -> String {
    let err = UnderstandPrompt::new(dir).err().expect("the folder is refused");
    err.to_string()
}

#[test]
fn a_folder_without_a_chat_template_is_refused() {
    let dir = altered_lm("tokenizer_config.json", |config| {
        config.as_object_mut().unwrap().remove("chat_template");
    });
    let message = refusal(dir.path());
    assert!(message.contains("tokenizer_config.json") && message.contains("no chat template"), "{message}");
}

#[test]
fn a_template_that_fails_names_its_file() {
    let dir = altered_lm("tokenizer_config.json", |config| {
        config["chat_template"] = json!("{{ raise_exception('System role not supported') }}");
    });
    let err = UnderstandPrompt::new(dir.path()).unwrap().render(&[1, 2]).unwrap_err().to_string();
    assert!(err.contains("tokenizer_config.json") && err.contains("System role not supported"), "{err}");
    let dir = altered_lm("tokenizer_config.json", |config| config["chat_template"] = json!("{% for m in messages %}"));
    let message = refusal(dir.path());
    assert!(message.contains("tokenizer_config.json") && message.contains("not valid Jinja"), "{message}");
}

#[test]
fn a_folder_with_another_vocabulary_is_refused() {
    let dir = altered_lm("tokenizer.json", |tokenizer| {
        let added = tokenizer["added_tokens"].as_array_mut().unwrap();
        added.retain(|t| t["content"] != "<|audio_code_1234|>" && t["content"] != "<|audio_code_5000|>");
    });
    let message = refusal(dir.path());
    assert!(message.contains(&dir.path().display().to_string()), "{message}");
    assert!(message.contains("<|audio_code_1234|>") && !message.contains("5000"), "the first missing: {message}");
}

#[test]
fn a_vocab_size_smaller_than_the_tokenizer_is_refused() {
    let dir = altered_lm("config.json", |config| config["vocab_size"] = json!(65_000));
    let message = refusal(dir.path());
    assert!(
        message.contains("config.json") && message.contains("vocab_size") && message.contains("65994"),
        "{message}"
    );
}

#[test]
fn an_eos_token_outside_the_vocabulary_is_refused() {
    let dir = altered_lm("tokenizer_config.json", |config| config["eos_token"] = json!({"content": "</s>"}));
    let message = refusal(dir.path());
    assert!(message.contains("eos_token") && message.contains("</s>"), "{message}");
}

#[test]
fn codes_past_the_codebook_are_refused() {
    let prompt = UnderstandPrompt::new(&lm_dir()).unwrap();
    let err = prompt.tokens(&[5, 64_000]).unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err}");
}
