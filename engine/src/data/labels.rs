//! Labels a song is given inside Ostinato (typed in the window, or read from its audio
//! and accepted), as a run records them in run.toml: each field set wins over what the
//! song's sidecars say. Every value is checked against what ACE-Step accepts.

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::codec::SongMeta;

/// The tempi ACE-Step's metadata takes (its `BPM_MIN`, `BPM_MAX`).
pub const BPM_RANGE: RangeInclusive<u32> = 30..=300;
/// The time signatures ACE-Step's metadata takes, by numerator (6 is 6/8).
pub const TIME_SIGNATURES: [u32; 4] = [2, 3, 4, 6];
/// The lyrics languages ACE-Step knows (its `VALID_LANGUAGES`).
pub const LANGUAGES: [&str; 51] = [
    "ar", "az", "bg", "bn", "ca", "cs", "da", "de", "el", "en", "es", "fa", "fi", "fr", "he", "hi", "hr", "ht", "hu",
    "id", "is", "it", "ja", "ko", "la", "lt", "ms", "ne", "nl", "no", "pa", "pl", "pt", "ro", "ru", "sa", "sk", "sr",
    "sv", "sw", "ta", "te", "th", "tl", "tr", "uk", "ur", "vi", "yue", "zh", "unknown",
];

/// One field a song is labelled with, named as ACE-Step's sidecars name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    Caption,
    Lyrics,
    Bpm,
    Keyscale,
    Timesignature,
    Language,
    /// Genres in words ("synthwave, retro pop"): upstream's dataset keeps it beside the
    /// caption and trains with it in place of the caption for a share of the songs.
    Genre,
}

impl Field {
    pub const ALL: [Field; 7] = [
        Field::Caption,
        Field::Lyrics,
        Field::Bpm,
        Field::Keyscale,
        Field::Timesignature,
        Field::Language,
        Field::Genre,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Field::Caption => "caption",
            Field::Lyrics => "lyrics",
            Field::Bpm => "bpm",
            Field::Keyscale => "keyscale",
            Field::Timesignature => "timesignature",
            Field::Language => "language",
            Field::Genre => "genre",
        }
    }

    /// `text` as this field's value, in the form ACE-Step writes it ("F# minor", "6"),
    /// or what is wrong with it. Blank text is no value (None).
    pub fn parse(self, text: &str) -> Result<Option<String>, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        match self {
            Field::Caption | Field::Lyrics | Field::Genre => Ok(text.to_string()),
            Field::Bpm => parse_bpm(text).map(|b| b.to_string()),
            Field::Keyscale => parse_keyscale(text),
            Field::Timesignature => parse_timesignature(text),
            Field::Language => parse_language(text),
        }
        .map(Some)
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Field {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Field::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| {
            let names: Vec<_> = Field::ALL.iter().map(|f| f.name()).collect();
            format!("`{s}` is not a label field (one of {})", names.join(", "))
        })
    }
}

fn parse_bpm(text: &str) -> Result<u32, String> {
    let (lo, hi) = (BPM_RANGE.start(), BPM_RANGE.end());
    match text.parse::<f64>() {
        Ok(b) if b.is_finite() && BPM_RANGE.contains(&(b.round() as u32)) => Ok(b.round() as u32),
        Ok(_) => Err(format!("{text} is not a tempo ACE-Step takes ({lo} to {hi} BPM)")),
        Err(_) => Err(format!("`{text}` is not a number of beats per minute")),
    }
}

/// "f# Minor" -> "F# minor"; a tonic A-G with #, b, ♯ or ♭, then major or minor.
fn parse_keyscale(text: &str) -> Result<String, String> {
    let wrong = || format!("`{text}` is not a key: a note A-G, maybe # or b, then major or minor (e.g. \"F# minor\")");
    let (tonic, mode) = text.split_once(char::is_whitespace).ok_or_else(wrong)?;
    let mode = mode.trim().to_lowercase();
    let mut chars = tonic.chars();
    let letter = chars.next().map(|c| c.to_ascii_uppercase()).filter(|c| ('A'..='G').contains(c)).ok_or_else(wrong)?;
    let accidental: String = chars.collect();
    let known = ["", "#", "b", "♯", "♭"].contains(&accidental.as_str());
    match known && (mode == "major" || mode == "minor") {
        true => Ok(format!("{letter}{accidental} {mode}")),
        false => Err(wrong()),
    }
}

/// "3/4" -> "3", "6/8" -> "6", "4" -> "4".
fn parse_timesignature(text: &str) -> Result<String, String> {
    let numerator = match text.split_once('/') {
        Some((n, d)) if matches!((n.trim(), d.trim()), ("6", "8") | ("2" | "3" | "4", "4")) => n.trim(),
        Some(_) => "",
        None => text,
    };
    match numerator.parse::<u32>() {
        Ok(n) if TIME_SIGNATURES.contains(&n) => Ok(n.to_string()),
        _ => Err(format!("`{text}` is not a time signature ACE-Step takes (2/4, 3/4, 4/4 or 6/8)")),
    }
}

fn parse_language(text: &str) -> Result<String, String> {
    let code = text.to_lowercase();
    match LANGUAGES.contains(&code.as_str()) {
        true => Ok(code),
        false => Err(format!("`{text}` is not a language code ACE-Step knows (e.g. en, es, ja, zh, or unknown)")),
    }
}

/// Values given to one song, field by field (None: not given here).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Labels {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caption: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lyrics: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bpm: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyscale: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timesignature: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub genre: Option<String>,
}

impl Labels {
    pub fn get(&self, field: Field) -> Option<&str> {
        self.slot(field).as_deref()
    }

    fn slot(&self, field: Field) -> &Option<String> {
        match field {
            Field::Caption => &self.caption,
            Field::Lyrics => &self.lyrics,
            Field::Bpm => &self.bpm,
            Field::Keyscale => &self.keyscale,
            Field::Timesignature => &self.timesignature,
            Field::Language => &self.language,
            Field::Genre => &self.genre,
        }
    }

    fn slot_mut(&mut self, field: Field) -> &mut Option<String> {
        match field {
            Field::Caption => &mut self.caption,
            Field::Lyrics => &mut self.lyrics,
            Field::Bpm => &mut self.bpm,
            Field::Keyscale => &mut self.keyscale,
            Field::Timesignature => &mut self.timesignature,
            Field::Language => &mut self.language,
            Field::Genre => &mut self.genre,
        }
    }

    /// Sets `field` from `text` (blank clears it), or says what is wrong and leaves it.
    pub fn set(&mut self, field: Field, text: &str) -> Result<(), String> {
        *self.slot_mut(field) = field.parse(text)?;
        Ok(())
    }

    /// Sets or clears `field` with a value already checked.
    pub fn put(&mut self, field: Field, value: Option<String>) {
        *self.slot_mut(field) = value;
    }

    pub fn is_empty(&self) -> bool {
        Field::ALL.iter().all(|f| self.get(*f).is_none())
    }

    /// What is wrong with the first value ACE-Step would not take: (field, why).
    pub fn check(&self) -> Result<(), (Field, String)> {
        for field in Field::ALL {
            if let Some(value) = self.get(field) {
                field.parse(value).map_err(|why| (field, why))?;
            }
        }
        Ok(())
    }

    /// `meta` with the fields given here in place of its own.
    pub fn apply(&self, meta: &mut SongMeta) {
        if let Some(caption) = &self.caption {
            meta.caption = caption.clone();
        }
        if let Some(lyrics) = &self.lyrics {
            meta.lyrics = lyrics.clone();
        }
        if let Some(bpm) = self.bpm.as_deref().and_then(|b| b.parse().ok()) {
            meta.bpm = Some(bpm);
        }
        for (value, slot) in [
            (&self.keyscale, &mut meta.keyscale),
            (&self.timesignature, &mut meta.timesignature),
            (&self.language, &mut meta.language),
            (&self.genre, &mut meta.genre),
        ] {
            if value.is_some() {
                slot.clone_from(value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_as_ace_step_writes_them() {
        let ok = |f: Field, t: &str| f.parse(t).unwrap();
        assert_eq!(ok(Field::Bpm, " 120.4 "), Some("120".into()));
        assert_eq!(ok(Field::Keyscale, "f# Minor"), Some("F# minor".into()));
        assert_eq!(ok(Field::Keyscale, "B♭ major"), Some("B♭ major".into()));
        assert_eq!(ok(Field::Timesignature, "6/8"), Some("6".into()));
        assert_eq!(ok(Field::Timesignature, "3"), Some("3".into()));
        assert_eq!(ok(Field::Language, "EN"), Some("en".into()));
        assert_eq!(ok(Field::Caption, "  "), None);
        for (field, text, says) in [
            (Field::Bpm, "fast", "not a number"),
            (Field::Bpm, "12", "30 to 300"),
            (Field::Bpm, "NaN", "30 to 300"),
            (Field::Keyscale, "H minor", "not a key"),
            (Field::Keyscale, "C dorian", "not a key"),
            (Field::Keyscale, "C", "not a key"),
            (Field::Timesignature, "5/4", "2/4, 3/4, 4/4 or 6/8"),
            (Field::Timesignature, "6/4", "2/4, 3/4, 4/4 or 6/8"),
            (Field::Language, "english", "language code"),
        ] {
            let err = field.parse(text).unwrap_err();
            assert!(err.contains(says), "{field} {text}: {err}");
        }
        assert!("tempo".parse::<Field>().unwrap_err().contains("caption, lyrics, bpm"));
    }

    #[test]
    fn given_fields_replace_the_sidecars_and_the_rest_stay() {
        let mut labels = Labels::default();
        labels.set(Field::Caption, "edited caption").unwrap();
        labels.set(Field::Bpm, "98").unwrap();
        assert!(labels.set(Field::Keyscale, "X major").is_err());
        assert_eq!(labels.keyscale, None);
        let mut meta = SongMeta { caption: "sidecar".into(), keyscale: Some("A minor".into()), ..SongMeta::default() };
        labels.apply(&mut meta);
        assert_eq!(
            (meta.caption.as_str(), meta.bpm, meta.keyscale.as_deref()),
            ("edited caption", Some(98), Some("A minor"))
        );
        let bad = Labels { timesignature: Some("7".into()), ..Labels::default() };
        assert_eq!(bad.check().unwrap_err().0, Field::Timesignature);
    }
}
