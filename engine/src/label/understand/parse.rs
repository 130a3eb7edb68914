//! Reading the LM's text: the metadata fields in its think block and the lyrics after it.
//!
//! This follows upstream's `parse_lm_output` (metadata part),
//! `_extract_lyrics_from_output` and the caption post-processing line for line,
//! quirks included, so that a caption reads the same as in upstream's datasets:
//! - the block is the first `<think>…</think>` (else `<reasoning>…</reasoning>`); an
//!   empty or missing block means the whole text before any audio code is read instead;
//! - a field starts on a line that begins with no whitespace and holds a colon (the key is
//!   the text before the first colon, trimmed and lowercased); lines indented by a space or
//!   tab continue the open field; lines beginning with `<` (after trimming) and other lines
//!   are skipped; a field seen twice keeps its last value; unknown keys are dropped;
//! - the lyrics are what follows the first `</think>`, trimmed, less a leading
//!   `# Lyric` header (upstream's pattern `Lyri[c|cs]?` misses `# Lyrics`) and a final
//!   `<|im_end|>`.
//!
//! Whitespace is Python's (`str.strip`, `\s`): Unicode white space plus the separators
//! U+001C..U+001F. Numbers are read as Python's `int()` reads ASCII text (sign,
//! underscores between digits); digits of other scripts and values beyond i64, which
//! Python would also take as integers, stay text here.

use std::sync::LazyLock;

use regex::Regex;

/// `bpm` and `duration` as upstream keeps them: an integer where `int()` reads one,
/// else the text the LM wrote (`N/A`, `12O`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntOrText {
    Int(i64),
    Text(String),
}

/// The fields upstream's understand mode returns, each absent where the LM did not
/// write it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Understood {
    pub bpm: Option<IntOrText>,
    pub caption: Option<String>,
    pub duration: Option<IntOrText>,
    pub genres: Option<String>,
    pub keyscale: Option<String>,
    pub language: Option<String>,
    pub timesignature: Option<String>,
    /// Absent when nothing follows `</think>` (upstream leaves the key out then).
    pub lyrics: Option<String>,
    /// Whether the text holds `</think>`: without it the LM never finished its metadata
    /// and wrote no lyrics.
    pub think_closed: bool,
}

const THINK_END: &str = "</think>";

/// Reads the LM's whole generated text (special tokens kept).
pub fn parse_understanding(text: &str) -> Understood {
    let lyrics = extract_lyrics(text);
    Understood {
        lyrics: (!lyrics.is_empty()).then_some(lyrics),
        think_closed: closes_think(text),
        ..parse_metadata(text)
    }
}

/// Whether the LM closed its think block: without `</think>` it never finished its
/// metadata and wrote no lyrics.
pub fn closes_think(text: &str) -> bool {
    text.contains(THINK_END)
}

/// The metadata fields of `text` (upstream's `parse_lm_output`, less its audio codes);
/// `lyrics` and `think_closed` are left unset.
pub fn parse_metadata(text: &str) -> Understood {
    let mut fields = Understood::default();
    let mut open: Option<(String, Vec<&str>)> = None;
    for line in reasoning_text(text).split('\n') {
        if py_strip(line).starts_with('<') {
            continue;
        }
        let starts_with_space = line.chars().next().is_some_and(py_is_space);
        if let (false, Some((key, value))) = (starts_with_space, line.split_once(':')) {
            if let Some((key, lines)) = open.take() {
                save_field(&mut fields, &key, &lines);
            }
            let lines = if py_strip(value).is_empty() { vec![] } else { vec![value] };
            open = Some((py_strip(key).to_lowercase(), lines));
        } else if line.starts_with(' ') || line.starts_with('\t') {
            // Python's truthiness: an empty key takes no continuation.
            if let Some((key, lines)) = open.as_mut() {
                if !key.is_empty() {
                    lines.push(line);
                }
            }
        }
    }
    if let Some((key, lines)) = open {
        save_field(&mut fields, &key, &lines);
    }
    fields
}

/// The lyrics after the first `</think>` (upstream's `_extract_lyrics_from_output`); empty
/// when there is none.
pub fn extract_lyrics(text: &str) -> String {
    static HEADER: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(?i)\A#[\s\x1c-\x1f]*Lyri[c|cs]?[\s\x1c-\x1f]*\n").expect("a valid pattern"));
    static TRAILING_IM_END: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"<\|im_end\|>[\s\x1c-\x1f]*\z").expect("a valid pattern"));
    let Some(end) = text.find(THINK_END) else { return String::new() };
    let after = py_strip(&text[end + THINK_END.len()..]);
    let after = HEADER.replace(after, "");
    let after = TRAILING_IM_END.replace(&after, "");
    py_strip(&after).to_string()
}

/// A caption written as a YAML block on several lines, made one line: each line
/// trimmed, empty ones dropped, joined by single spaces.
pub fn postprocess_caption(caption: &str) -> String {
    caption.split('\n').map(py_strip).filter(|line| !line.is_empty()).collect::<Vec<_>>().join(" ")
}

/// The text the fields are read from: the first think (or reasoning) block's inside,
/// or, where that is missing or blank, all the text before the first audio code.
fn reasoning_text(text: &str) -> &str {
    for (open, close) in [("<think>", THINK_END), ("<reasoning>", "</reasoning>")] {
        let block = text.find(open).map(|start| &text[start + open.len()..]).and_then(|rest| {
            let end = rest.find(close)?;
            Some(&rest[..end])
        });
        if let Some(block) = block {
            let inside = py_strip(block);
            if inside.is_empty() {
                break;
            }
            return inside;
        }
    }
    let before_codes = text.split("<|audio_code_").next().unwrap_or_default();
    py_strip(before_codes)
}

/// Stores a finished field: its lines joined by newlines, then as upstream reads each key.
fn save_field(fields: &mut Understood, key: &str, lines: &[&str]) {
    if lines.is_empty() {
        return;
    }
    let value = lines.join("\n");
    let text = || py_strip(&value).to_string();
    let number = || py_int(py_strip(&value)).map_or_else(|| IntOrText::Text(text()), IntOrText::Int);
    match key {
        "bpm" => fields.bpm = Some(number()),
        "caption" => fields.caption = Some(postprocess_caption(&value)),
        "duration" => fields.duration = Some(number()),
        "genres" => fields.genres = Some(text()),
        "keyscale" => fields.keyscale = Some(text()),
        "language" => fields.language = Some(text()),
        "timesignature" => fields.timesignature = Some(text()),
        _ => {}
    }
}

/// Python's `str.isspace` for one character.
fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()`.
fn py_strip(s: &str) -> &str {
    s.trim_matches(py_is_space)
}

/// Python's `int(s)` for ASCII text already stripped: an optional sign, then digits with
/// single underscores between them.
fn py_int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    let well_formed = digits.split('_').all(|group| !group.is_empty() && group.bytes().all(|b| b.is_ascii_digit()));
    if !well_formed {
        return None;
    }
    let sign = if s.starts_with('-') { "-" } else { "" };
    format!("{sign}{}", digits.replace('_', "")).parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_python_int_reads_them() {
        for (text, expected) in [
            ("120", Some(120)),
            ("+7", Some(7)),
            ("-3", Some(-3)),
            ("007", Some(7)),
            ("1_000", Some(1000)),
            ("1__0", None),
            ("_1", None),
            ("1_", None),
            ("12O", None),
            ("1.5", None),
            ("", None),
            ("-", None),
            ("99999999999999999999", None),
        ] {
            assert_eq!(py_int(text), expected, "{text:?}");
        }
    }

    #[test]
    fn python_whitespace_includes_the_separators() {
        assert_eq!(py_strip("\u{1c}\u{a0} a b \u{3000}\u{1f}\r\n"), "a b");
        assert!(!py_is_space('\u{200b}'), "zero-width space is not white space to Python");
    }

    #[test]
    fn caption_yaml_lines_join_with_single_spaces() {
        assert_eq!(
            postprocess_caption("An emotional ballad.\n  The track opens\n\n\t with piano.  "),
            "An emotional ballad. The track opens with piano."
        );
        assert_eq!(postprocess_caption(""), "");
    }

    #[test]
    fn continuation_lines_need_an_open_key() {
        // `:x` opens a field with an empty key, which takes no continuation; a plain
        // line closes nothing, so the indented line after it still continues caption.
        let fields = parse_metadata("<think>\n  orphan\ncaption: a\nplain line\n  b\n: x\n  c\n</think>");
        assert_eq!(fields.caption.as_deref(), Some("a b"));
        assert_eq!(parse_metadata("<think>\nbpm:\n  \ncaption: x\n</think>").bpm, Some(IntOrText::Text(String::new())));
    }

    #[test]
    fn lyrics_header_and_trailing_im_end() {
        assert_eq!(extract_lyrics("</think>\n# LYRIC \n\nla<|im_end|>\n"), "la");
        assert_eq!(extract_lyrics("</think>#lyri|\nla"), "la");
        assert_eq!(extract_lyrics("</think>\n# Lyrics\nla"), "# Lyrics\nla");
        assert_eq!(extract_lyrics("</think><|im_end|>a<|im_end|> "), "<|im_end|>a");
        assert_eq!(extract_lyrics("no end tag"), "");
    }

    #[test]
    fn understanding_notes_an_unclosed_think_block() {
        let open = parse_understanding("<think>\nbpm: 90\ncaption: x");
        assert!(!open.think_closed);
        assert_eq!((open.bpm, open.lyrics), (Some(IntOrText::Int(90)), None));
        let closed = parse_understanding("<think>\nbpm: 90\n</think>\nla");
        assert!(closed.think_closed);
        assert_eq!(closed.lyrics.as_deref(), Some("la"));
    }
}
