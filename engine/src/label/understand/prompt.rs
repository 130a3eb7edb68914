//! The LM's prompts rendered with the LM folder's chat template (the understand
//! prompt here; any chat through `chat`), and their tokens.
//!
//! Upstream asks the LM with one system message (the instruction) and one user
//! message (the song's codes as `<|audio_code_N|>` tokens), rendered by
//! transformers' `apply_chat_template(tokenize=False, add_generation_prompt=True)`,
//! then tokenized as plain text. The template is rendered here in an environment set up
//! as transformers sets up Jinja: blocks trimmed and left-stripped, loop controls,
//! Python's string methods, `raise_exception` and a `tojson` that writes what Python's
//! `json.dumps` writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use minijinja::value::{Value as JinjaValue, ValueKind};
use minijinja::{context, Environment, ErrorKind};
use serde_json::Value;
use tokenizers::Tokenizer;

use super::decode::{Decoder, StopTokens};
use crate::codec::tokenizer::read_tokenizer;
use crate::{Error, Result};

/// The system message's instruction for understand mode, as upstream words it.
pub const UNDERSTAND_INSTRUCTION: &str =
    "Understand the given musical conditions and describe the audio semantics accordingly:";

/// Valid 5 Hz codes are 0..64000 (the FSQ levels 8·8·8·5·5·5); the LM's vocabulary has
/// code tokens past that, which no audio produces.
pub const AUDIO_CODES: u32 = 64_000;

/// The token that stands for 5 Hz code `code` in the LM's vocabulary.
pub fn audio_code_token(code: u32) -> String {
    format!("<|audio_code_{code}|>")
}

/// An LM folder's tokenizer and chat template, ready to phrase the understand prompt.
pub struct UnderstandPrompt {
    tokenizer: Tokenizer,
    tokenizer_file: PathBuf,
    template: String,
    /// The file the template came from, for render errors.
    template_file: PathBuf,
    /// Special tokens by name (`eos_token`, ...), which transformers hands the template.
    special_tokens: Vec<(&'static str, String)>,
    eos: u32,
    pad: u32,
}

impl UnderstandPrompt {
    /// Reads `lm_dir`'s tokenizer.json, tokenizer_config.json (and chat_template.jinja
    /// where there is one) and config.json, and checks that the folder is an ACE-Step
    /// 5 Hz LM: every audio-code token present and within config.json's vocab_size.
    pub fn new(lm_dir: &Path) -> Result<Self> {
        let tokenizer_file = lm_dir.join("tokenizer.json");
        let tokenizer = read_tokenizer(&tokenizer_file)?;
        let config_file = lm_dir.join("tokenizer_config.json");
        let config: Value = crate::error::read_json(&config_file)?;
        let (template, template_file) = chat_template(lm_dir, &config, &config_file)?;
        check_template_syntax(&template, &template_file)?;

        let special_tokens: Vec<(&'static str, String)> = ["bos_token", "eos_token", "unk_token", "pad_token"]
            .into_iter()
            .filter_map(|key| special_token(&config, key).map(|token| (key, token)))
            .collect();
        let token_id = |key: &str| -> Result<Option<u32>> {
            let Some(token) = special_token(&config, key) else { return Ok(None) };
            tokenizer.token_to_id(&token).map(Some).ok_or_else(|| Error::ModelFile {
                path: config_file.clone(),
                key: key.to_string(),
                reason: format!("{token:?} is not a token of {}", tokenizer_file.display()),
            })
        };
        // Upstream stops on either; a folder naming one uses it for both.
        let (eos, pad) = match (token_id("eos_token")?, token_id("pad_token")?) {
            (Some(eos), Some(pad)) => (eos, pad),
            (Some(id), None) | (None, Some(id)) => (id, id),
            (None, None) => {
                return Err(Error::ModelFile {
                    path: config_file,
                    key: "eos_token".into(),
                    reason: "neither eos_token nor pad_token is set: the LM's output could not be ended".into(),
                })
            }
        };
        check_vocabulary(lm_dir, &tokenizer)?;
        Ok(Self { tokenizer, tokenizer_file, template, template_file, special_tokens, eos, pad })
    }

    /// The prompt text for a song's codes, as upstream's
    /// `build_formatted_prompt_for_understanding` renders it.
    pub fn render(&self, codes: &[u32]) -> Result<String> {
        let system = format!("# Instruction\n{UNDERSTAND_INSTRUCTION}\n\n");
        let user = codes_string(codes)?;
        self.chat(&[("system", &system), ("user", &user)], true)
    }

    /// `messages` (role, content) rendered as `apply_chat_template(tokenize=False,
    /// add_generation_prompt=...)` renders them.
    pub fn chat(&self, messages: &[(&str, &str)], add_generation_prompt: bool) -> Result<String> {
        render_chat(&self.template, messages, add_generation_prompt, &self.special_tokens).map_err(|e| Error::BadFile {
            path: self.template_file.clone(),
            reason: format!("the chat template fails to render: {}", describe(&e)),
        })
    }

    /// The prompt's token ids: the rendered text encoded as upstream's tokenizer call
    /// does (special tokens added, which for Qwen's tokenizer is none).
    pub fn tokens(&self, codes: &[u32]) -> Result<Vec<u32>> {
        self.encode(&self.render(codes)?)
    }

    /// A rendered prompt's token ids, as upstream's `tokenizer(prompt)` gives them.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.tokenizer.encode(text, true).map_err(|e| Error::BadFile {
            path: self.tokenizer_file.clone(),
            reason: format!("the rendered prompt cannot be tokenized: {e}"),
        })?;
        Ok(encoding.get_ids().to_vec())
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// A decoding loop that ends on this folder's eos or pad, writes text with its
    /// tokenizer and stops after `max_new_tokens` (upstream: `MAX_NEW_TOKENS`).
    pub fn decoder(&self, max_new_tokens: usize) -> Decoder<'_> {
        Decoder {
            tokenizer: &self.tokenizer,
            tokenizer_file: &self.tokenizer_file,
            stop: StopTokens { eos: self.eos, pad: self.pad },
            max_new_tokens,
        }
    }

    /// The end-of-sequence token (`eos_token`; `pad_token` where it is unset).
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// The padding token (`pad_token`; `eos_token` where it is unset). Upstream's loop
    /// stops on it as on eos.
    pub fn pad(&self) -> u32 {
        self.pad
    }
}

/// `<|audio_code_N|>` per code, concatenated, as upstream serializes a song's codes.
fn codes_string(codes: &[u32]) -> Result<String> {
    if let Some((i, code)) = codes.iter().enumerate().find(|(_, &c)| c >= AUDIO_CODES) {
        return Err(Error::BadRequest(format!(
            "audio code {code} at position {i} is out of range (codes are 0..{AUDIO_CODES})"
        )));
    }
    Ok(codes.iter().map(|&c| audio_code_token(c)).collect())
}

/// The template transformers would use: chat_template.jinja beside the config wins over
/// the config's `chat_template` (a string, or named templates of which "default").
fn chat_template(lm_dir: &Path, config: &Value, config_file: &Path) -> Result<(String, PathBuf)> {
    let jinja_file = lm_dir.join("chat_template.jinja");
    if jinja_file.is_file() {
        let text = std::fs::read_to_string(&jinja_file).map_err(|e| Error::io(&jinja_file, e))?;
        return Ok((text, jinja_file));
    }
    let missing = |reason: &str| Error::ModelFile {
        path: config_file.to_path_buf(),
        key: "chat_template".into(),
        reason: reason.into(),
    };
    let template = match config.get("chat_template") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .ok_or_else(|| missing("none of the named chat templates is \"default\""))?
            .to_string(),
        Some(_) => return Err(missing("expected a string (a Jinja template)")),
        None => return Err(missing("the LM folder has no chat template (nor chat_template.jinja)")),
    };
    Ok((template, config_file.to_path_buf()))
}

/// A special token's text: tokenizer_config gives it as a string or as {"content": ...}.
fn special_token(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(token) => Some(token.clone()),
        Value::Object(added) => added.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// Every valid audio code has its token, and config.json's vocab_size covers every
/// token id (the embedding has a row for each).
fn check_vocabulary(lm_dir: &Path, tokenizer: &Tokenizer) -> Result<()> {
    if let Some(missing) = (0..AUDIO_CODES).map(audio_code_token).find(|t| tokenizer.token_to_id(t).is_none()) {
        return Err(Error::ModelFolder {
            path: lm_dir.to_path_buf(),
            problems: vec![format!(
                "its tokenizer has no {missing} token: not an ACE-Step 5 Hz LM (another vocabulary)"
            )],
        });
    }
    let config_file = lm_dir.join("config.json");
    let config: Value = crate::error::read_json(&config_file)?;
    let vocab_size = config.get("vocab_size").and_then(Value::as_u64).ok_or_else(|| Error::ModelFile {
        path: config_file.clone(),
        key: "vocab_size".into(),
        reason: "missing or not a whole number".into(),
    })?;
    let tokens = tokenizer.get_vocab(true).into_values().max().map_or(0, |id| u64::from(id) + 1);
    if tokens > vocab_size {
        return Err(Error::ModelFile {
            path: config_file,
            key: "vocab_size".into(),
            reason: format!("{vocab_size} is smaller than the tokenizer's {tokens} tokens"),
        });
    }
    Ok(())
}

/// Jinja as transformers configures it for chat templates.
fn template_environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .expect("the default delimiters are a valid syntax");
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> std::result::Result<JinjaValue, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
    });
    env.add_filter("tojson", python_json);
    env
}

/// `template` rendered for `messages` (role, content), with or without a generation
/// prompt, and the variables transformers passes beside them.
fn render_chat(
    template: &str,
    messages: &[(&str, &str)],
    add_generation_prompt: bool,
    special_tokens: &[(&'static str, String)],
) -> std::result::Result<String, minijinja::Error> {
    let messages: Vec<JinjaValue> =
        messages.iter().map(|&(role, content)| context! { role => role, content => content }).collect();
    let special: BTreeMap<String, String> =
        special_tokens.iter().map(|(key, token)| (key.to_string(), token.clone())).collect();
    let ctx = context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        tools => JinjaValue::from(()),
        documents => JinjaValue::from(()),
        ..JinjaValue::from(special)
    };
    template_environment().render_str(template, ctx)
}

/// Parses the template once so that a broken one is refused when the folder is read.
fn check_template_syntax(template: &str, file: &Path) -> Result<()> {
    template_environment().template_from_str(template).map(|_| ()).map_err(|e| Error::BadFile {
        path: file.to_path_buf(),
        reason: format!("the chat template is not valid Jinja: {}", describe(&e)),
    })
}

/// minijinja's message with its line, and the template's own message for
/// `raise_exception`.
fn describe(e: &minijinja::Error) -> String {
    match e.line() {
        Some(line) => format!("{e} (template line {line})"),
        None => e.to_string(),
    }
}

/// The `tojson` transformers installs: Python's `json.dumps(x, ensure_ascii=False)`,
/// whose separators are ", " and ": ", which keeps a mapping's order and escapes no
/// HTML characters.
fn python_json(value: &JinjaValue) -> std::result::Result<JinjaValue, minijinja::Error> {
    let mut out = String::new();
    write_python_json(value, &mut out)?;
    Ok(JinjaValue::from_safe_string(out))
}

fn write_python_json(value: &JinjaValue, out: &mut String) -> std::result::Result<(), minijinja::Error> {
    let unsupported = || minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: cannot write {value}"));
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&value.to_string()),
        // serde_json escapes a string as Python does without ensure_ascii.
        ValueKind::String => out.push_str(&Value::String(value.to_string()).to_string()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_json(&item, out)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Value::String(key.to_string()).to_string());
                out.push_str(": ");
                write_python_json(&value.get_item(&key)?, out)?;
            }
            out.push('}');
        }
        _ => return Err(unsupported()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str) -> std::result::Result<String, minijinja::Error> {
        let messages = [("system", "sys <b>&'\"\n"), ("user", "  hi  ")];
        render_chat(template, &messages, true, &[("eos_token", "<|im_end|>".to_string())])
    }

    #[test]
    fn renders_as_transformers_jinja_does() {
        // Blocks trimmed and left-stripped, pycompat's string methods, Python's json.dumps
        // for tojson, special tokens and add_generation_prompt as variables. The expected
        // text is what transformers 5.25 (jinja2 3.1.6) renders for the same call.
        let template = concat!(
            "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content.strip() }}]\n  {% endif %}\n",
            r#"{{ m | tojson }}|{{ {"b": [1, 2.5, none, true], "a": "é\u0001"} | tojson }}"#,
            "\n{% endfor %}{{ eos_token }}{{ 'x,y'.split(',') | length }}",
            "{% if add_generation_prompt %}<gen>{% endif %}\n",
        );
        let json = r#"{"b": [1, 2.5, null, true], "a": "é\u0001"}"#;
        let expected = format!(
            r#"{{"role": "system", "content": "sys <b>&'\"\n"}}|{json}
[hi]
{{"role": "user", "content": "  hi  "}}|{json}
<|im_end|>2<gen>"#
        );
        assert_eq!(render(template).unwrap(), expected);
    }

    /// Qwen3-style constructs (namespace, a reversed slice, `is string`, Python string
    /// methods, whitespace control next to trimmed and left-stripped blocks).
    const QWEN_STYLE: &str = r#"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- for tool in tools %}{{- tool | tojson }}{%- endfor %}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>' + message.role + '\n' + content.strip('\n') + '<|im_end|>\n' }}
    {%- endif %}
    {%- if loop.index0 == ns.last_query_index and message.content.split('|>')|length > 2 %}
    {# a comment #}
  {% if true %}
    [q{{ loop.index0 }}:{{ message.content.rstrip('>').split('_')[-1] }}]
  {% endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"#;

    #[test]
    fn a_qwen_style_template_renders_as_transformers_does() {
        // Expected: transformers 5.25's apply_chat_template(tokenize=False,
        // add_generation_prompt=True) on a folder with this template.
        let system = format!("# Instruction\n{UNDERSTAND_INSTRUCTION}\n\n");
        let user = codes_string(&[5, 63_999]).unwrap();
        let text = render_chat(QWEN_STYLE, &[("system", &system), ("user", &user)], true, &[]).unwrap();
        let expected = format!(
            "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n    [q1:63999|]\n\
             <|im_start|>assistant\n"
        );
        assert_eq!(text, expected);
    }

    #[test]
    fn raise_exception_fails_the_render_with_its_message() {
        let err = render("{{ raise_exception('only user and assistant roles') }}").unwrap_err();
        assert!(err.to_string().contains("only user and assistant roles"), "{err}");
    }

    #[test]
    fn codes_become_audio_code_tokens() {
        assert_eq!(codes_string(&[0, 63_999, 7]).unwrap(), "<|audio_code_0|><|audio_code_63999|><|audio_code_7|>");
        assert_eq!(codes_string(&[]).unwrap(), "");
        let err = codes_string(&[1, 64_000]).unwrap_err().to_string();
        assert!(err.contains("64000") && err.contains("position 1"), "{err}");
    }

    #[test]
    fn special_tokens_are_strings_or_added_token_objects() {
        let config = serde_json::json!({
            "eos_token": "<|im_end|>",
            "pad_token": {"content": "<|endoftext|>", "special": true},
            "bos_token": null,
        });
        assert_eq!(special_token(&config, "eos_token").as_deref(), Some("<|im_end|>"));
        assert_eq!(special_token(&config, "pad_token").as_deref(), Some("<|endoftext|>"));
        assert_eq!(special_token(&config, "bos_token"), None);
        assert_eq!(special_token(&config, "unk_token"), None);
    }
}
