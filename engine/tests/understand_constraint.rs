//! The constrained decoding of the 5 Hz LM's metadata block against upstream's
//! MetadataConstrainedLogitsProcessor (fixtures in tests/fixtures/lm_tiny, made by
//! scripts/make_lm_constraint_fixture.py and scripts/make_lm_fixtures.py).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Device;
use ostinato_engine::label::understand::constrained::{
    read_genres_vocab, MetadataConstraint, MetadataTables, State, TreeField,
};
use ostinato_engine::label::understand::decode::Rows;
use serde_json::Value;
use tokenizers::Tokenizer;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lm_tiny")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(fixture_dir().join("acestep-5Hz-lm-tiny/tokenizer.json")).unwrap()
}

fn cases() -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("constraint_cases.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn tables(tok: &Tokenizer, max_duration: u32, genres: bool) -> MetadataTables {
    let vocab = genres.then(|| read_genres_vocab(&fixture_dir().join("genres_vocab.txt")).unwrap());
    MetadataTables::new(tok, max_duration, vocab.as_deref()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Upstream's FSMState name of a state.
fn upstream_name(state: State) -> &'static str {
    use State::*;
    match state {
        ThinkTag => "THINK_TAG",
        NewlineAfterThink => "NEWLINE_AFTER_THINK",
        BpmName => "BPM_NAME",
        BpmValue => "BPM_VALUE",
        CaptionName => "CAPTION_NAME",
        CaptionValue => "CAPTION_VALUE",
        DurationName => "DURATION_NAME",
        DurationValue => "DURATION_VALUE",
        GenresName => "GENRES_NAME",
        GenresValue => "GENRES_VALUE",
        KeyscaleName => "KEYSCALE_NAME",
        KeyscaleValue => "KEYSCALE_VALUE",
        LanguageName => "LANGUAGE_NAME",
        LanguageValue => "LANGUAGE_VALUE",
        TimesigName => "TIMESIG_NAME",
        TimesigValue => "TIMESIG_VALUE",
        ThinkEndTag => "THINK_END_TAG",
        Completed => "COMPLETED",
        Codes => "CODES_GENERATION",
    }
}

/// The fixture's made-up logits (see the script): a hash of (seed, step, id) to a
/// multiple of 2^-20 in [-8, 8), maybe floored to a coarser step, then the run's biases
/// and the step's, added in f32.
struct Formula {
    seed: u64,
    /// Where > 0, scores are floored to multiples of it (ties everywhere).
    quantum: f32,
    bias: Vec<(usize, f32)>,
    step_bias: Vec<(usize, usize, f32)>,
}

const K_SEED: u64 = 0x9E37_79B9_7F4A_7C15;
const K_STEP: u64 = 0xBF58_476D_1CE4_E5B9;
const K_TOKEN: u64 = 0x94D0_49BB_1331_11EB;

impl Formula {
    fn of(run: &Value) -> Self {
        let f = |v: &Value| v.as_f64().unwrap() as f32;
        let u = |v: &Value| v.as_u64().unwrap() as usize;
        let rows =
            |key: &str| run[key].as_array().unwrap().iter().map(|r| r.as_array().unwrap().clone()).collect::<Vec<_>>();
        Self {
            seed: run["seed"].as_u64().unwrap(),
            quantum: f(&run["quantum"]),
            bias: rows("bias").iter().map(|r| (u(&r[0]), f(&r[1]))).collect(),
            step_bias: rows("step_bias").iter().map(|r| (u(&r[0]), u(&r[1]), f(&r[2]))).collect(),
        }
    }

    fn scores(&self, step: usize, vocab: usize) -> Vec<f32> {
        let key = self.seed.wrapping_mul(K_SEED) ^ (step as u64).wrapping_mul(K_STEP);
        let mut scores: Vec<f32> = (0..vocab as u64)
            .map(|id| {
                let mut x = id.wrapping_mul(K_TOKEN) ^ key;
                x ^= x >> 30;
                x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
                x ^= x >> 27;
                x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
                x ^= x >> 31;
                let s = ((x >> 40) as i64 - (1 << 23)) as f32 / (1u32 << 20) as f32;
                if self.quantum > 0.0 {
                    (s / self.quantum).floor() * self.quantum
                } else {
                    s
                }
            })
            .collect();
        for &(token, bias) in &self.bias {
            scores[token] += bias;
        }
        for &(_, token, bias) in self.step_bias.iter().filter(|(at, _, _)| *at == step) {
            scores[token] += bias;
        }
        scores
    }
}

/// torch.argmax: the first index of the largest score.
fn argmax(scores: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &s) in scores.iter().enumerate() {
        if s > scores[best] {
            best = i;
        }
    }
    best as u32
}

fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

#[test]
fn decode_of_each_token_matches_transformers() {
    let tok = tokenizer();
    let cases = cases();
    let size = cases["vocab_size"].as_u64().unwrap() as u32;
    assert_eq!(tok.get_vocab_size(true) as u32, size, "len(tokenizer)");
    let start = std::time::Instant::now();
    let built = tables(&tok, 180, true);
    println!("tables over {size} tokens (genres trie included) built in {:.2?}", start.elapsed());
    assert_eq!(built.vocab_size() as u32, size);
    let block = cases["decode_hash_block"].as_u64().unwrap() as u32;
    let expected = cases["decode_hashes"].as_array().unwrap();
    let mut differing = Vec::new();
    for (b, want) in expected.iter().enumerate() {
        let start = b as u32 * block;
        let h = (start..(start + block).min(size)).fold(0xCBF2_9CE4_8422_2325, |h, id| {
            let text = tok.decode(&[id], false).unwrap();
            fnv1a(&[text.as_bytes(), &[0xff]].concat(), h)
        });
        if format!("{h:016x}") != want.as_str().unwrap() {
            differing.push(start);
        }
    }
    println!("decode([id]) over {size} ids: {} of {} blocks differ", differing.len(), expected.len());
    assert!(differing.is_empty(), "blocks starting at {differing:?} decode differently from transformers");
}

#[test]
fn value_trees_match_upstream() {
    let tok = tokenizer();
    let cases = cases();
    let tables = tables(&tok, cases["trees_max_duration"].as_u64().unwrap() as u32, false);
    let fields = [
        ("bpm", TreeField::Bpm),
        ("duration", TreeField::Duration),
        ("keyscale", TreeField::Keyscale),
        ("language", TreeField::Language),
        ("timesignature", TreeField::Timesignature),
    ];
    for (name, field) in fields {
        let entries = cases["trees"][name].as_array().unwrap();
        let tree = tables.tree(field);
        println!("{name}: {} prefixes (upstream {})", tree.len(), entries.len());
        assert_eq!(tree.len(), entries.len(), "{name}: prefix count");
        for entry in entries {
            let (prefix, next) = (ids(&entry[0]), ids(&entry[1]));
            assert_eq!(tree.next_tokens(&prefix), Some(next.as_slice()), "{name}: after {prefix:?}");
        }
    }
}

#[test]
fn greedy_runs_over_formula_logits_choose_upstreams_tokens() {
    let tok = tokenizer();
    let cases = cases();
    let mut built: HashMap<(u32, bool), MetadataTables> = HashMap::new();
    let mut failures = Vec::new();
    for run in cases["runs"].as_array().unwrap() {
        let name = run["name"].as_str().unwrap();
        let key = (run["max_duration"].as_u64().unwrap() as u32, run["genres"].as_bool().unwrap());
        let tables = built.entry(key).or_insert_with(|| self::tables(&tok, key.0, key.1));
        let formula = Formula::of(run);
        let (want, states) = (ids(&run["ids"]), run["states"].as_array().unwrap());
        let mut constraint = MetadataConstraint::new(tables);
        let mut matched = 0;
        for (step, &expected) in want.iter().enumerate() {
            let state = upstream_name(constraint.state());
            let mut scores = formula.scores(step, tables.vocab_size());
            // The rows the constraint says it reads are all it reads: the others
            // left out (-inf, as the LM leaves them), it masks alike.
            let mut only_rows = scores.clone();
            leave_out(&mut only_rows, &constraint.rows());
            let mut twin = constraint.clone();
            twin.process(&mut only_rows);
            constraint.process(&mut scores);
            assert!(
                only_rows == scores && twin.state() == constraint.state(),
                "{name} step {step} in {state}: the step reads scores outside {:?}",
                constraint.rows()
            );
            let got = argmax(&scores);
            if got != expected || state != states[step].as_str().unwrap() {
                failures.push(format!(
                    "{name} step {step}: chose {got} in {state}, upstream {expected} in {}",
                    states[step].as_str().unwrap()
                ));
                break;
            }
            matched += 1;
            constraint.update(got);
        }
        println!("{name}: {matched}/{} steps match upstream (ids and states)", want.len());
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Sets every score outside `rows` to -inf.
fn leave_out(scores: &mut [f32], rows: &Rows) {
    match rows {
        Rows::All => {}
        Rows::AllBut(masked) => {
            masked.iter().for_each(|r| scores[r.start as usize..r.end as usize].fill(f32::NEG_INFINITY))
        }
        Rows::Only(ids) => {
            let kept: Vec<(u32, f32)> = ids.iter().map(|&id| (id, scores[id as usize])).collect();
            scores.fill(f32::NEG_INFINITY);
            kept.into_iter().for_each(|(id, s)| scores[id as usize] = s);
        }
        Rows::Runs(kept) => {
            let mut out = vec![f32::NEG_INFINITY; scores.len()];
            kept.iter().for_each(|r| {
                out[r.start as usize..r.end as usize].copy_from_slice(&scores[r.start as usize..r.end as usize])
            });
            scores.copy_from_slice(&out);
        }
    }
}

/// Upstream's greedy understand runs on the tiny LM: no per-step logits are recorded,
/// so each step's scores are zeros with the recorded token raised by 1 (the LM's
/// argmax was that token): the processor must leave it allowed and on top, its own
/// logit-based decisions (language, caption end, free genres end) agreeing.
#[test]
fn upstream_greedy_lm_runs_pass_the_constraint() {
    let tok = tokenizer();
    let dir = fixture_dir();
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let max_duration = expected["max_duration"].as_u64().unwrap() as u32;
    let tensors = candle_core::safetensors::load(dir.join("expected.safetensors"), &Device::Cpu).unwrap();
    for (key, genres) in [("greedy_ids", false), ("greedy_ids_genres", true)] {
        let tables = tables(&tok, max_duration, genres);
        let run: Vec<u32> = tensors[key].to_vec1::<i64>().unwrap().into_iter().map(|t| t as u32).collect();
        let mut constraint = MetadataConstraint::new(&tables);
        let mut visited = vec![constraint.state()];
        for (step, &token) in run.iter().enumerate() {
            let mut scores = vec![0.0f32; tables.vocab_size()];
            scores[token as usize] = 1.0;
            constraint.process(&mut scores);
            assert!(
                scores[token as usize].is_finite() && argmax(&scores) == token,
                "{key} step {step}: token {token} ({:?}) not allowed in {:?}",
                tables.text(token),
                constraint.state()
            );
            constraint.update(token);
            if visited.last() != Some(&constraint.state()) {
                visited.push(constraint.state());
            }
        }
        println!("{key}: {} tokens allowed; states {visited:?}", run.len());
        assert!(constraint.is_free_text(), "{key}: the run ends past </think>");
    }
}
