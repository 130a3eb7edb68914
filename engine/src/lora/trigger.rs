//! The trigger word an adapter was trained with, kept in its files so that a loader can
//! show it: `trigger_word` and `tag_position` (prepend, append or replace), the names
//! ACE-Step LoRA trainers already write, in `adapter_config.json` and in the safetensors
//! header. The libraries pass them over: PEFT drops config keys its `LoraConfig` does
//! not take, diffusers reads only `lora_adapter_metadata` from the header, ComfyUI and
//! LyCORIS only the tensors. The tag itself and how it joins a caption are defined here,
//! below the data that trains with it.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// How a trigger tag joins the caption.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TagMode {
    Prepend,
    Append,
    Replace,
}

impl TagMode {
    /// As run.toml and the adapter's files write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Prepend => "prepend",
            Self::Append => "append",
            Self::Replace => "replace",
        }
    }
}

impl std::str::FromStr for TagMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "prepend" => Ok(Self::Prepend),
            "append" => Ok(Self::Append),
            "replace" => Ok(Self::Replace),
            other => Err(format!("unknown tag position `{other}` (expected prepend, append or replace)")),
        }
    }
}

/// A word or phrase joined to every caption, so the adapter answers to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriggerTag {
    pub tag: String,
    pub mode: TagMode,
}

pub const WORD_KEY: &str = "trigger_word";
pub const POSITION_KEY: &str = "tag_position";

/// The trigger's fields, as both files hold them (none for a blank word).
pub fn fields(trigger: Option<&TriggerTag>) -> Vec<(&'static str, String)> {
    match trigger.filter(|t| !t.tag.trim().is_empty()) {
        Some(t) => vec![(WORD_KEY, t.tag.clone()), (POSITION_KEY, t.mode.name().to_string())],
        None => Vec::new(),
    }
}

/// The trigger from its fields as read (None: the file has none); an error naming
/// `origin` and the field when one is not what it should be. A word without a
/// position was prepended, as trainers do by default.
pub fn read(word: Option<&str>, position: Option<&str>, origin: &Path) -> Result<Option<TriggerTag>> {
    let bad = |reason: String| Error::Adapter { path: origin.to_path_buf(), reason };
    let mode = position
        .map(|p| p.parse::<TagMode>().map_err(|why| bad(format!("`{POSITION_KEY}`: {why}"))))
        .transpose()?
        .unwrap_or(TagMode::Prepend);
    match word.map(str::trim) {
        Some(tag) if !tag.is_empty() => Ok(Some(TriggerTag { tag: tag.to_string(), mode })),
        _ if position.is_some() => Err(bad(format!("`{POSITION_KEY}` is given without a `{WORD_KEY}`"))),
        _ => Ok(None),
    }
}

/// The trigger of a JSON object (`adapter_config.json`): its fields must be strings.
pub fn from_json(object: &serde_json::Value, origin: &Path) -> Result<Option<TriggerTag>> {
    let text = |key: &str| match object.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.as_str())),
        Some(other) => {
            Err(Error::Adapter { path: origin.to_path_buf(), reason: format!("`{key}` must be text, found {other}") })
        }
    };
    read(text(WORD_KEY)?, text(POSITION_KEY)?, origin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_back_and_bad_ones_are_named() {
        let origin = Path::new("adapter_config.json");
        let tag = TriggerTag { tag: "ostn style".into(), mode: TagMode::Append };
        let fields = fields(Some(&tag));
        let get = |key: &str| fields.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str());
        assert_eq!(read(get(WORD_KEY), get(POSITION_KEY), origin).unwrap(), Some(tag));
        assert_eq!(read(Some("ostn"), None, origin).unwrap().unwrap().mode, TagMode::Prepend);
        assert_eq!(read(None, None, origin).unwrap(), None);
        assert!(super::fields(Some(&TriggerTag { tag: " ".into(), mode: TagMode::Prepend })).is_empty());
        for (word, position, named) in [(Some("x"), Some("sideways"), POSITION_KEY), (None, Some("append"), WORD_KEY)] {
            let err = read(word, position, origin).unwrap_err().to_string();
            assert!(err.contains(named) && err.contains("adapter_config.json"), "{err}");
        }
        let err = from_json(&serde_json::json!({ "trigger_word": 3 }), origin).unwrap_err().to_string();
        assert!(err.contains("`trigger_word` must be text"), "{err}");
    }
}
