//! The tricky parts of the constrained decoding, on the tiny LM fixture's tokenizer
//! (whole runs against upstream are in tests/understand_constraint.rs).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::Value;
use tokenizers::Tokenizer;

use super::fsm::{MetadataConstraint, State};
use super::genres::read_genres_vocab;
use super::pystr::set_order;
use super::tables::MetadataTables;
use super::vocab::encode;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lm_tiny")
}

fn tok() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_file(fixture_dir().join("acestep-5Hz-lm-tiny/tokenizer.json")).unwrap())
}

/// Tables with max duration 180, without and with the fixture's genres vocabulary.
fn tables(genres: bool) -> &'static MetadataTables {
    static PLAIN: OnceLock<MetadataTables> = OnceLock::new();
    static GENRES: OnceLock<MetadataTables> = OnceLock::new();
    let build = || {
        let vocab = genres.then(|| read_genres_vocab(&fixture_dir().join("genres_vocab.txt")).unwrap());
        MetadataTables::new(tok(), 180, vocab.as_deref()).unwrap()
    };
    if genres {
        GENRES.get_or_init(build)
    } else {
        PLAIN.get_or_init(build)
    }
}

fn id(text: &str) -> u32 {
    match encode(tok(), text).unwrap().as_slice() {
        [one] => *one,
        many => panic!("{text:?} is {} tokens", many.len()),
    }
}

/// The tokens left allowed on all-zero logits (on a copy: the step is not taken).
fn allowed(c: &MetadataConstraint) -> BTreeSet<u32> {
    let mut scores = vec![0.0; c.tables().vocab_size()];
    c.clone().process(&mut scores);
    (0..scores.len() as u32).filter(|&i| scores[i as usize].is_finite()).collect()
}

fn texts(c: &MetadataConstraint) -> BTreeSet<String> {
    allowed(c).into_iter().map(|t| c.tables().text(t).to_string()).collect()
}

/// Takes `token` as the LM's top choice: it must be allowed and stay on top.
fn take(c: &mut MetadataConstraint, token: u32) {
    let mut scores = vec![0.0; c.tables().vocab_size()];
    scores[token as usize] = 1.0;
    c.process(&mut scores);
    assert_eq!(scores[token as usize], 1.0, "{:?} blocked in {:?}", c.tables().text(token), c.state());
    c.update(token);
}

fn write(c: &mut MetadataConstraint, text: &str) {
    for token in encode(tok(), text).unwrap() {
        take(c, token);
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn set_order_is_cpythons() {
    let text = std::fs::read_to_string(fixture_dir().join("constraint_cases.json")).unwrap();
    let cases: Value = serde_json::from_str(&text).unwrap();
    let ids = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<_>>();
    for case in cases["set_orders"].as_array().unwrap() {
        assert_eq!(set_order(&ids(&case["adds"])), ids(&case["order"]), "adds {}", case["adds"]);
    }
    assert_eq!(tables(false).language_firsts, ids(&cases["language_first_tokens"]));
}

#[test]
fn numbers_end_where_their_range_allows() {
    let mut c = MetadataConstraint::new(tables(false));
    write(&mut c, "<think>\nbpm: 3");
    assert_eq!(c.state(), State::BpmValue);
    let digits: Vec<String> = (0..10).map(|d| d.to_string()).collect();
    let digits: BTreeSet<String> = digits.into_iter().collect();
    assert_eq!(texts(&c), digits, "30..39 need a second digit");
    write(&mut c, "0");
    assert_eq!(texts(&c), set(&["0", "\n"]), "30 may end or become 300");
    write(&mut c, "0");
    assert_eq!(texts(&c), set(&["\n"]), "300 is the largest");

    let mut c = MetadataConstraint::new(tables(false));
    write(&mut c, "<think>\nbpm: 20");
    assert!(!texts(&c).contains("\n"), "20 is below 30: a third digit must follow");
    write(&mut c, "0\ncaption: A song.\nduration: 18");
    assert_eq!(c.state(), State::DurationValue);
    assert_eq!(texts(&c), set(&["0", "\n"]), "max duration 180");
    let mut c = MetadataConstraint::new(tables(false));
    write(&mut c, "<think>\nbpm: 200\ncaption: A song.\nduration: 19");
    assert_eq!(texts(&c), set(&["\n"]), "190 is past 180");
}

/// Up to "keyscale:" (genres from the vocabulary).
fn up_to_keyscale() -> MetadataConstraint<'static> {
    let mut c = MetadataConstraint::new(tables(true));
    write(&mut c, "<think>\nbpm: 90\ncaption: A song.\nduration: 60\ngenres:pop\nkeyscale:");
    assert_eq!(c.state(), State::KeyscaleValue);
    c
}

#[test]
fn keys_take_accidentals_then_a_mode() {
    let mut c = up_to_keyscale();
    assert!(texts(&c).is_superset(&set(&[" A", " Bb", " F"])), "{:?}", texts(&c));
    write(&mut c, " F");
    let after_note = texts(&c);
    assert!(after_note.is_superset(&set(&["#", "♯", "♭", " major", " minor"])), "{after_note:?}");
    assert!(!after_note.contains("\n"), "a note alone is no key");
    write(&mut c, "♯");
    assert_eq!(texts(&c), set(&[" major", " minor"]));
    write(&mut c, " minor");
    assert_eq!(texts(&c), set(&["\n"]));
    write(&mut c, "\n");
    assert_eq!(c.state(), State::LanguageName);
}

#[test]
fn language_is_the_best_scored_language_then_its_tree() {
    let mut c = up_to_keyscale();
    write(&mut c, " Bb major\nlanguage:");
    assert_eq!(c.state(), State::LanguageValue);
    let mut scores = vec![0.0; c.tables().vocab_size()];
    scores[id(" en") as usize] = 2.0;
    scores[id(" es") as usize] = 3.0;
    scores[id("x") as usize] = 10.0; // not a language: does not count
    c.clone().process(&mut scores);
    let left: Vec<u32> = (0..scores.len() as u32).filter(|&i| scores[i as usize].is_finite()).collect();
    assert_eq!(left, vec![id(" es")]);
    write(&mut c, " yue");
    assert_eq!(texts(&c), set(&["\n"]));
    write(&mut c, "\ntimesignature: 6\n</think>");
    assert!(c.is_free_text());
}

#[test]
fn caption_goes_on_over_indented_lines_and_ends_at_a_field_name() {
    let audio_code = |n: u32| tok().token_to_id(&format!("<|audio_code_{n}|>")).unwrap();
    let mut c = MetadataConstraint::new(tables(false));
    write(&mut c, "<think>\nbpm: 90\ncaption: A calm song.\n more");
    assert_eq!(c.state(), State::CaptionValue, "an indented line is still the caption");
    let open = allowed(&c);
    for blocked in [id("`"), audio_code(0), audio_code(63_999)] {
        assert!(!open.contains(&blocked), "{:?} allowed in a caption", c.tables().text(blocked));
    }
    assert!(open.contains(&audio_code(64_000)), "codes past 63999 are not audio codes to upstream");

    let mut known = c.clone();
    write(&mut known, "\nKeyscale:");
    assert_eq!(known.state(), State::KeyscaleValue, "a known field name (any case) leads to its value");
    let mut unknown = c.clone();
    write(&mut unknown, "\nmood:");
    assert_eq!(unknown.state(), State::DurationName, "an unknown one to the next field");

    // After a newline the raw argmax decides, before the caption's own masks: a
    // backtick on top ends the caption and is itself allowed.
    write(&mut c, "\n");
    let mut scores = vec![0.0; c.tables().vocab_size()];
    scores[id("`") as usize] = 1.0;
    c.process(&mut scores);
    assert!(scores.iter().all(|s| s.is_finite()), "the field name after a caption is free");
}

#[test]
fn caption_stops_at_512_tokens() {
    let mut c = MetadataConstraint::new(tables(false));
    write(&mut c, "<think>\nbpm: 90\ncaption:");
    for _ in 0..511 {
        take(&mut c, id(" la"));
    }
    assert!(allowed(&c).len() > 1000);
    take(&mut c, id(" la"));
    assert_eq!(texts(&c), set(&["\n"]));
}

#[test]
fn genres_follow_the_vocabulary_trie() {
    let mut c = MetadataConstraint::new(tables(true));
    write(&mut c, "<think>\nbpm: 90\ncaption: A song.\nduration: 60\ngenres:");
    assert_eq!(c.state(), State::GenresValue);
    let first = texts(&c);
    assert!(first.is_superset(&set(&["pop", "po", "l", "ro"])) && !first.contains("\n"), "{first:?}");
    // The value so far is stripped before the token's text is appended: a leading
    // space never fits at the start.
    assert!(!first.contains(" pop"));
    let mut pop = c.clone();
    write(&mut pop, "pop");
    let after_pop = texts(&pop);
    assert!(after_pop.is_superset(&set(&["\n", " rock", " punk"])), "{after_pop:?}");
    assert!(!after_pop.contains(" jazz"));
    write(&mut c, "lo-fi");
    assert_eq!(texts(&c), set(&["\n"]), "lo-fi is a leaf");
}

#[test]
fn free_genres_end_on_a_preferred_newline_before_it_is_taken() {
    let mut c = MetadataConstraint::new(tables(false));
    write(&mut c, "<think>\nbpm: 90\ncaption: A song.\nduration: 60\ngenres:");
    let newline = c.tables().newline();
    assert!(!allowed(&c).contains(&newline), "no empty genres");
    write(&mut c, " any words");
    assert_eq!(allowed(&c).len(), c.tables().vocab_size(), "free text");
    let mut scores = vec![0.0; c.tables().vocab_size()];
    scores[newline as usize] = 1.0;
    c.process(&mut scores);
    assert_eq!(c.state(), State::KeyscaleName, "upstream moves on inside the step");
    c.update(newline);
    // ...so the newline counts as the first character of "keyscale:".
    assert_eq!(texts(&c), set(&["ey"]));
}

#[test]
fn lyrics_block_valid_audio_codes_only() {
    let mut c = up_to_keyscale();
    write(&mut c, " C major\nlanguage: en\ntimesignature: 4\n</think>");
    assert!(c.is_free_text());
    let open = allowed(&c);
    let code = |n: u32| tok().token_to_id(&format!("<|audio_code_{n}|>")).unwrap();
    assert!(!open.contains(&code(123)) && open.contains(&code(64_999)) && open.contains(&id("`")));
    assert_eq!(open.len(), c.tables().vocab_size() - 64_000);
}
