//! The 5 Hz LM against upstream's own run of the tiny fixture LM (transformers, f32 CPU):
//! the prompt's last logits, then a few teacher-forced steps through the KV cache; the
//! LM head limited to kept rows; what a broken LM folder is told.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use ostinato_engine::codec::CausalLm;
use ostinato_engine::device::Precision;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lm_tiny")
}

fn lm_dir() -> PathBuf {
    fixture().join("acestep-5Hz-lm-tiny")
}

struct Expected {
    prompt_ids: Vec<u32>,
    prompt_logits: Vec<f32>,
    step_ids: Vec<u32>,
    step_logits: Vec<Vec<f32>>,
}

fn expected() -> Expected {
    let t = candle_core::safetensors::load(fixture().join("expected.safetensors"), &Device::Cpu).unwrap();
    let ids = |k: &str| -> Vec<u32> { t[k].to_dtype(DType::U32).unwrap().to_vec1().unwrap() };
    Expected {
        prompt_ids: ids("prompt_ids"),
        prompt_logits: t["prompt_logits"].to_vec1().unwrap(),
        step_ids: ids("step_ids"),
        step_logits: t["step_logits"].to_vec2().unwrap(),
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0
}

/// Max |error| of the prompt's logits and of each step's, against upstream's.
fn errors(lm: &CausalLm, e: &Expected, reserve: Option<usize>) -> (Vec<f32>, Vec<usize>) {
    let mut cache = lm.new_cache().unwrap();
    if let Some(total) = reserve {
        cache.reserve(total).unwrap();
    }
    let hidden = lm.prefill(&e.prompt_ids, &mut cache).unwrap();
    let logits = lm.logits(&hidden, None).unwrap();
    let (mut errs, mut picks) = (vec![max_abs_diff(&logits, &e.prompt_logits)], vec![argmax(&logits)]);
    for (id, want) in e.step_ids.iter().zip(&e.step_logits) {
        let logits = lm.logits(&lm.step(*id, &mut cache).unwrap(), None).unwrap();
        errs.push(max_abs_diff(&logits, want));
        picks.push(argmax(&logits));
    }
    assert_eq!(cache.len(), e.prompt_ids.len() + e.step_ids.len());
    (errs, picks)
}

#[test]
fn f32_prompt_and_cached_steps_match_upstream() {
    let e = expected();
    let lm = CausalLm::load(&lm_dir(), &Device::Cpu, Precision::F32).unwrap();
    assert!(lm.config().tie_word_embeddings);
    let scale = e.prompt_logits.iter().fold(0f32, |m, v| m.max(v.abs()));
    // Growing the cache as it goes (the prompt, then doubling) or reserved up front.
    for reserve in [None, Some(e.prompt_ids.len() + e.step_ids.len())] {
        let (errs, _) = errors(&lm, &e, reserve);
        println!("f32, cache reserve {reserve:?}: max |logit error| prompt {:.2e}, steps {:?} (logits up to {scale:.1}; tolerance 1e-4)", errs[0], &errs[1..]);
        assert!(errs.iter().all(|&err| err < 1e-4), "{errs:?}");
    }
}

#[test]
fn bf16_held_weights_stay_close_and_pick_the_same_tokens() {
    let e = expected();
    let lm = CausalLm::load(&lm_dir(), &Device::Cpu, Precision::Auto).unwrap();
    let (errs, picks) = errors(&lm, &e, None);
    let want: Vec<usize> = std::iter::once(&e.prompt_logits).chain(&e.step_logits).map(|l| argmax(l)).collect();
    // Every weight rounded to bf16 (8 significant bits, 2^-9 relative) moves the logits
    // by a few of those steps of their size, here about 1%.
    let scale = e.prompt_logits.iter().fold(0f32, |m, v| m.max(v.abs()));
    let tolerance = 0.02 * scale;
    println!("bf16-held weights: max |logit error| {errs:?} (logits up to {scale:.1}, tolerance 2% of that = {tolerance:.2}); argmax {picks:?}, upstream {want:?}");
    assert!(errs.iter().all(|&err| err < tolerance), "{errs:?}");
    assert_eq!(picks, want);
}

#[test]
fn kept_rows_equal_the_full_logits_there_and_the_rest_are_masked() {
    let e = expected();
    for precision in [Precision::F32, Precision::Auto] {
        let lm = CausalLm::load(&lm_dir(), &Device::Cpu, precision).unwrap();
        let mut cache = lm.new_cache().unwrap();
        let hidden = lm.prefill(&e.prompt_ids, &mut cache).unwrap();
        let full = lm.logits(&hidden, None).unwrap();
        let v = full.len() as u32;
        // Unordered on purpose; one range empty, one the vocabulary's last row.
        let keep = [200..300, 5..9, 40..40, v - 1..v];
        let part = lm.logits(&hidden, Some(&keep)).unwrap();
        let mut kept = 0;
        for (i, (p, f)) in part.iter().zip(&full).enumerate() {
            match keep.iter().any(|r| r.contains(&(i as u32))) {
                true => {
                    assert_eq!(p, f, "{precision}: token {i}");
                    kept += 1;
                }
                false => assert_eq!(*p, f32::NEG_INFINITY, "{precision}: token {i}"),
            }
        }
        assert_eq!(kept, 105);
        let past = lm.logits(&hidden, Some(std::slice::from_ref(&(0..v + 1)))).unwrap_err().to_string();
        assert!(past.contains("vocabulary"), "{past}");
    }
}

#[test]
fn token_ids_outside_the_vocabulary_are_refused() {
    let lm = CausalLm::load(&lm_dir(), &Device::Cpu, Precision::F32).unwrap();
    let v = lm.config().vocab_size as u32;
    let mut cache = lm.new_cache().unwrap();
    let err = lm.prefill(&[1, v], &mut cache).unwrap_err().to_string();
    assert!(err.contains(&v.to_string()) && err.contains("vocabulary"), "{err}");
    assert!(lm.prefill(&[], &mut cache).is_err());
    assert!(cache.is_empty());
}

/// A copy of the fixture LM's folder whose weights `edit` changed.
fn broken_copy(edit: impl FnOnce(&mut HashMap<String, Tensor>)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(lm_dir().join("config.json"), dir.path().join("config.json")).unwrap();
    let mut weights = candle_core::safetensors::load(lm_dir().join("model.safetensors"), &Device::Cpu).unwrap();
    edit(&mut weights);
    candle_core::safetensors::save(&weights, dir.path().join("model.safetensors")).unwrap();
    dir
}

fn load_error(dir: &Path) -> String {
    match CausalLm::load(dir, &Device::Cpu, Precision::F32) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn broken_folders_are_named_with_what_is_wrong() {
    let empty = tempfile::tempdir().unwrap();
    let err = load_error(empty.path());
    println!("no config: {err}");
    assert!(err.contains("config.json"), "{err}");

    let no_weights = tempfile::tempdir().unwrap();
    std::fs::copy(lm_dir().join("config.json"), no_weights.path().join("config.json")).unwrap();
    let err = load_error(no_weights.path());
    println!("no weights: {err}");
    assert!(err.contains("model.safetensors"), "{err}");

    let key = "model.layers.1.mlp.down_proj.weight";
    let missing = broken_copy(|w| {
        w.remove(key);
    });
    let err = load_error(missing.path());
    println!("missing tensor: {err}");
    assert!(err.contains(key) && err.contains("missing"), "{err}");

    let reshaped = broken_copy(|w| {
        let t = w[key].clone();
        w.insert(key.to_string(), t.t().unwrap().contiguous().unwrap());
    });
    let err = load_error(reshaped.path());
    println!("wrong shape: {err}");
    assert!(err.contains(key) && err.contains("[64, 32]"), "{err}");

    // Untied: the head must be there.
    let untied = broken_copy(|_| {});
    let config = untied.path().join("config.json");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
    std::fs::write(&config, text).unwrap();
    let err = load_error(untied.path());
    println!("untied without a head: {err}");
    assert!(err.contains("lm_head.weight"), "{err}");
}

#[test]
fn a_long_prompt_at_once_equals_it_in_pieces_and_token_by_token() {
    let lm = CausalLm::load(&lm_dir(), &Device::Cpu, Precision::F32).unwrap();
    // Longer than a query block (256 rows), so prefill attends block by block.
    let ids: Vec<u32> = (0..600u32).map(|i| (i * 7919) % 6000).collect();
    let last = |runs: &[&[u32]]| {
        let mut cache = lm.new_cache().unwrap();
        let mut hidden = None;
        for run in runs {
            hidden = Some(lm.prefill(run, &mut cache).unwrap());
        }
        lm.logits(&hidden.unwrap(), None).unwrap()
    };
    let whole = last(&[&ids]);
    let pieces = last(&[&ids[..300], &ids[300..301], &ids[301..]]);
    let singles: Vec<&[u32]> = ids.chunks(1).collect();
    let one_by_one = last(&singles);
    let (e_pieces, e_singles) = (max_abs_diff(&whole, &pieces), max_abs_diff(&whole, &one_by_one));
    println!("600 tokens: at once vs in pieces {e_pieces:.2e}, vs one by one {e_singles:.2e} (tolerance 1e-4)");
    assert!(e_pieces < 1e-4 && e_singles < 1e-4);
}
