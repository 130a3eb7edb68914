//! ACE-Step's 5 Hz LM in understand mode, end to end on this machine: a song's codes,
//! the tiny LM folder the engine writes, and the labelling of a song.

use candle_core::Device;
use ostinato_engine::cancel::Cancel;
use ostinato_engine::codec::StereoAudio;
use ostinato_engine::data::Field;
use ostinato_engine::device::Precision;
use ostinato_engine::generate::wav::write_wav;
use ostinato_engine::label::understand::codes::song_codes;
use ostinato_engine::label::understand::labeller::{LmLabeller, Progress, UnderstandSettings, GENRES_VOCAB};
use ostinato_engine::label::understand::sample::Sampling;
use ostinato_engine::label::understand::tiny::{write_tiny_lm, AUDIO_CODE_TOKENS};
use ostinato_engine::load::source::ModelSource;
use ostinato_engine::Error;

use common::demo_song;

mod common;

#[test]
fn a_song_becomes_one_code_per_window_and_bad_songs_are_named() {
    let tokenizer = ModelSource::Demo.song_tokenizer(&candle_core::Device::Cpu).unwrap();
    let song = demo_song();
    let codes = song_codes(&song, &tokenizer, &Cancel::never(), &mut |_, _| {}).unwrap();
    let seconds = ostinato_engine::data::audio::decode(&song).unwrap().duration_seconds();
    let frames = (seconds * tokenizer.encoder.frames_per_second()).floor() as usize;
    println!("{}: {seconds:.2} s, {frames} latent frames, {} codes", song.display(), codes.len());
    assert_eq!(codes.len(), frames.div_ceil(tokenizer.tokenizer.pool_window()));
    assert!(codes.iter().all(|&c| c < 64000), "codes in the codebook");
    assert!(codes.iter().any(|&c| c != codes[0]), "the codes follow the music");

    let dir = tempfile::tempdir().unwrap();
    let silent = dir.path().join("silent.wav");
    write_wav(&silent, &StereoAudio::silence(48_000, 48_000)).unwrap();
    let short = dir.path().join("short.wav");
    let mut blip = StereoAudio::silence(48_000, 4_800); // 0.1 s: less than one 0.2 s code
    blip.left[100] = 0.5;
    write_wav(&short, &blip).unwrap();
    for (path, says) in [(&silent, "silent"), (&short, "shorter than one 5 Hz code")] {
        match song_codes(path, &tokenizer, &Cancel::never(), &mut |_, _| {}) {
            Err(Error::BadAudio { path: p, reason }) => {
                println!("{}: {reason}", p.display());
                assert!(p == *path && reason.contains(says), "{reason}");
            }
            other => panic!("{}: {:?}", path.display(), other.map(|c| c.len())),
        }
    }
}

#[test]
fn the_tiny_lm_folder_has_every_audio_code_and_qwen_s_specials() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_lm(dir.path(), 7).unwrap();
    let tok = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|audio_code_0|>"] {
        assert!(tok.token_to_id(t).is_some(), "{t}");
    }
    let last = format!("<|audio_code_{}|>", AUDIO_CODE_TOKENS - 1);
    let id = tok.token_to_id(&last).unwrap();
    assert_eq!(tok.decode(&[id], false).unwrap(), last);
    let enc = tok.encode("bpm: 120\ncaption: ça va", false).unwrap();
    assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), "bpm: 120\ncaption: ça va", "bytes round-trip");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap();
    assert_eq!(config["vocab_size"].as_u64().unwrap() as usize, tok.get_vocab_size(true));
}

fn lm_fixture() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lm_tiny")
}

/// Upstream's greedy runs (scripts/make_lm_fixtures.py): the labeller's decoding, with
/// its skipped LM-head rows, writes upstream's token ids exactly, without and with a
/// genres vocabulary beside the LM.
#[test]
fn greedy_labelling_writes_upstream_s_token_ids_exactly() {
    let fixture = lm_fixture();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("expected.json")).unwrap()).unwrap();
    let tensors = candle_core::safetensors::load(fixture.join("expected.safetensors"), &Device::Cpu).unwrap();
    let ids = |name: &str| -> Vec<u32> {
        tensors[name]
            .to_dtype(candle_core::DType::I64)
            .unwrap()
            .to_vec1::<i64>()
            .unwrap()
            .iter()
            .map(|&i| i as u32)
            .collect()
    };
    let codes = ids("codes");
    let settings = UnderstandSettings {
        sampling: Sampling { temperature: 0.0, ..Sampling::default() },
        max_new_tokens: expected["max_new_tokens"].as_u64().unwrap() as usize,
        max_duration: expected["max_duration"].as_u64().unwrap() as u32,
        precision: Precision::F32,
        ..UnderstandSettings::default()
    };
    for (run, genres) in [("greedy_ids", false), ("greedy_ids_genres", true)] {
        let dir = tempfile::tempdir().unwrap();
        let src = fixture.join("acestep-5Hz-lm-tiny");
        for entry in std::fs::read_dir(&src).unwrap().flatten() {
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
        if genres {
            std::fs::copy(fixture.join("genres_vocab.txt"), dir.path().join(GENRES_VOCAB)).unwrap();
        }
        let labeller = LmLabeller::load(dir.path(), &ModelSource::Demo, &Device::Cpu, settings.clone()).unwrap();
        let decoded = labeller.write(&codes, &Cancel::never(), &mut |_| {}).unwrap();
        let want = ids(run);
        let first_diff = decoded.ids.iter().zip(&want).position(|(a, b)| a != b);
        println!(
            "{run}: {} ids written, upstream {}; first difference at {first_diff:?}",
            decoded.ids.len(),
            want.len()
        );
        assert_eq!(decoded.ids, want, "{run}");
    }
}

/// A demo song through the whole labelling with a tiny LM this test writes: labels
/// from what it wrote; a budget too small to close the think block is an error naming
/// the song, with nothing kept.
#[test]
fn a_demo_song_is_labelled_and_an_unfinished_output_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_lm(dir.path(), 7).unwrap();
    let song = demo_song();
    let labeller =
        LmLabeller::load(dir.path(), &ModelSource::Demo, &Device::Cpu, UnderstandSettings::default()).unwrap();
    let mut stages = Vec::new();
    let labelled = labeller.understand(&song, &Cancel::never(), &mut |p| stages.push(p)).unwrap();
    println!("{}: {} codes, {} tokens:\n{}", song.display(), labelled.codes, labelled.tokens, labelled.text);
    println!("labels {:?}\nrefused {:?}", labelled.labels, labelled.refused);
    assert!(matches!(stages.first(), Some(Progress::Listening { .. })));
    assert!(matches!(stages.last(), Some(Progress::Writing { tokens, .. }) if *tokens == labelled.tokens));
    assert!(labelled.text.contains("</think>"));
    assert!(labelled.labels.get(Field::Caption).is_some_and(|c| !c.trim().is_empty()), "a caption");

    let short = UnderstandSettings { max_new_tokens: 8, ..UnderstandSettings::default() };
    let labeller = LmLabeller::load(dir.path(), &ModelSource::Demo, &Device::Cpu, short).unwrap();
    match labeller.understand(&song, &Cancel::never(), &mut |_| {}) {
        Err(Error::Understand { path, reason }) => {
            println!("{}: {reason}", path.display());
            assert!(path == song && reason.contains("8 tokens") && reason.contains("</think>"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}
