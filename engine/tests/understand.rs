//! ACE-Step's 5 Hz LM in understand mode, end to end on this machine: a song's codes,
//! the tiny LM folder the engine writes, and the labelling of a song.

use std::path::Path;

use ostinato_engine::cancel::Cancel;
use ostinato_engine::codec::StereoAudio;
use ostinato_engine::generate::wav::write_wav;
use ostinato_engine::label::understand::codes::song_codes;
use ostinato_engine::label::understand::tiny::{write_tiny_lm, AUDIO_CODE_TOKENS};
use ostinato_engine::load::source::ModelSource;
use ostinato_engine::Error;

fn demo_song() -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/demo");
    let mut songs: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    songs.sort();
    songs.into_iter().find(|p| p.extension().is_some_and(|e| e == "wav")).expect("a demo song")
}

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
