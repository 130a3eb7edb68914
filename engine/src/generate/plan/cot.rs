//! The think block text2music writes into the codes prompt: upstream's
//! `_format_metadata_as_cot`, `yaml.dump(items, allow_unicode=True, sort_keys=True)`
//! between "<think>\n" and "\n</think>". The YAML is written as PyYAML's emitter writes
//! a flat mapping of scalars: a string that reads as another type (`no`, `1.5`, `~`)
//! or starts with an indicator is quoted, special characters force double quotes with
//! escapes, and lines fold at a space past column 80, continued two spaces in.

use std::sync::LazyLock;

use regex::Regex;

/// `<think>\n{yaml}\n</think>` for `items` (name, value), sorted by name as PyYAML
/// sorts; digit-only values are written as the integers upstream turns them into.
pub fn format_cot(items: &[(&str, &str)]) -> String {
    let mut sorted: Vec<&(&str, &str)> = items.iter().collect();
    sorted.sort_by_key(|(name, _)| *name);
    let mut yaml = String::new();
    for (name, value) in sorted {
        let mut line = Line { out: format!("{name}:"), column: name.chars().count() + 1 };
        write_text(&mut line, &python_int_text(value));
        yaml.push_str(&line.out);
        yaml.push('\n');
    }
    format!("<think>\n{}\n</think>", yaml.trim())
}

/// Digit-only text as `int(text)` prints it; other text as it is.
fn python_int_text(text: &str) -> String {
    match !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        true => {
            let trimmed = text.trim_start_matches('0');
            if trimmed.is_empty() { "0" } else { trimmed }.to_string()
        }
        false => text.to_string(),
    }
}

const WIDTH: usize = 80;
const INDENT: &str = "\n  ";

struct Line {
    out: String,
    column: usize,
}

impl Line {
    fn push(&mut self, s: &str) {
        self.out.push_str(s);
        self.column += s.chars().count();
    }

    fn fold(&mut self) {
        self.out.push_str(INDENT);
        self.column = 2;
    }
}

fn write_text(line: &mut Line, text: &str) {
    if text.chars().all(|c| c.is_ascii_digit()) && !text.is_empty() {
        return line.push(&format!(" {text}"));
    }
    let style = analyze(text);
    if style.plain && !reads_as_other_type(text) {
        line.push(" ");
        write_plain(line, text);
    } else if style.single_quoted {
        line.push(" '");
        write_single_quoted(line, text);
        line.push("'");
    } else {
        line.push(" \"");
        write_double_quoted(line, text);
        line.push("\"");
    }
}

struct Styles {
    plain: bool,
    single_quoted: bool,
}

fn is_break(c: char) -> bool {
    matches!(c, '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn is_blank(c: char) -> bool {
    matches!(c, '\0' | ' ' | '\t' | '\r') || is_break(c)
}

fn printable_unicode(c: char) -> bool {
    matches!(c, '\u{85}' | '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFE}')
        && c != '\u{FEFF}'
}

/// PyYAML's `analyze_scalar` (allow_unicode), for a block mapping's value.
fn analyze(text: &str) -> Styles {
    if text.is_empty() {
        return Styles { plain: true, single_quoted: true };
    }
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len();
    let mut block_indicators = text.starts_with("---") || text.starts_with("...");
    let (mut line_breaks, mut special) = (false, false);
    let (mut leading, mut trailing, mut break_space, mut space_break) = (false, false, false, false);
    let (mut previous_space, mut previous_break) = (false, false);
    let mut preceded_by_whitespace = true;
    for (i, &ch) in chars.iter().enumerate() {
        let followed_by_whitespace = i + 1 >= n || is_blank(chars[i + 1]);
        if i == 0 {
            if "#,[]{}&*!|>'\"%@`".contains(ch) || (ch == '-' || ch == '?' || ch == ':') && followed_by_whitespace {
                block_indicators = true;
            }
        } else if (ch == ':' && followed_by_whitespace) || (ch == '#' && preceded_by_whitespace) {
            block_indicators = true;
        }
        if is_break(ch) {
            line_breaks = true;
        }
        if !(ch == '\n' || (' '..='~').contains(&ch) || printable_unicode(ch)) {
            special = true;
        }
        if ch == ' ' {
            leading |= i == 0;
            trailing |= i == n - 1;
            break_space |= previous_break;
            (previous_space, previous_break) = (true, false);
        } else if is_break(ch) {
            leading |= i == 0;
            trailing |= i == n - 1;
            space_break |= previous_space;
            (previous_space, previous_break) = (false, true);
        } else {
            (previous_space, previous_break) = (false, false);
        }
        preceded_by_whitespace = is_blank(ch);
    }
    let plain = !(leading || trailing || break_space || space_break || special || line_breaks || block_indicators);
    Styles { plain, single_quoted: !(break_space || space_break || special) }
}

/// Whether PyYAML's implicit resolvers read `text` as a bool, number, null, timestamp,
/// merge or value key: then it is quoted to stay a string.
fn reads_as_other_type(text: &str) -> bool {
    static OTHER: LazyLock<Regex> = LazyLock::new(|| {
        let patterns = [
            r"yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF",
            r"[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?",
            r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
            r"[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+",
            r"[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+",
            r"<<|~|null|Null|NULL|=",
            r"[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]",
            r"[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:[Tt]|[ \t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9](?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?",
        ];
        Regex::new(&format!("^(?:{})$", patterns.join("|"))).expect("the resolvers' patterns are valid")
    });
    text.is_empty() || OTHER.is_match(text)
}

/// PyYAML's `write_plain` (no line breaks reach it: such text is quoted).
fn write_plain(line: &mut Line, text: &str) {
    let chars: Vec<char> = text.chars().collect();
    let mut start = 0;
    let mut spaces = false;
    for end in 0..=chars.len() {
        let ch = chars.get(end).copied();
        if spaces {
            if ch != Some(' ') {
                if start + 1 == end && line.column > WIDTH {
                    line.fold();
                } else {
                    line.push(&chars[start..end].iter().collect::<String>());
                }
                start = end;
            }
        } else if ch.is_none_or(|c| c == ' ') {
            line.push(&chars[start..end].iter().collect::<String>());
            start = end;
        }
        spaces = ch == Some(' ');
    }
}

/// PyYAML's `write_single_quoted` (no line breaks: text with them is never single-quoted
/// here, as upstream's captions hold none).
fn write_single_quoted(line: &mut Line, text: &str) {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len();
    let mut start = 0;
    let mut spaces = false;
    for end in 0..=n {
        let ch = chars.get(end).copied();
        if spaces {
            if ch != Some(' ') {
                if start + 1 == end && line.column > WIDTH && start != 0 && end != n {
                    line.fold();
                } else {
                    line.push(&chars[start..end].iter().collect::<String>());
                }
                start = end;
            }
        } else if ch.is_none_or(|c| c == ' ' || is_break(c) || c == '\'') && start < end {
            line.push(&chars[start..end].iter().collect::<String>());
            start = end;
        }
        if ch == Some('\'') {
            line.push("''");
            start = end + 1;
        }
        spaces = ch == Some(' ');
    }
}

/// PyYAML's `write_double_quoted`: escapes, and a fold with a trailing backslash.
fn write_double_quoted(line: &mut Line, text: &str) {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len();
    let mut start = 0;
    for end in 0..=n {
        let ch = chars.get(end).copied();
        let escaped = ch.is_none_or(|c| {
            "\"\\\u{85}\u{2028}\u{2029}\u{FEFF}".contains(c)
                || !((' '..='~').contains(&c) || matches!(c, '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}'))
        });
        if escaped {
            if start < end {
                line.push(&chars[start..end].iter().collect::<String>());
                start = end;
            }
            if let Some(c) = ch {
                line.push(&escape(c));
                start = end + 1;
            }
        }
        if 0 < end
            && end + 1 < n
            && (ch == Some(' ') || start >= end)
            && line.column + end.saturating_sub(start) > WIDTH
        {
            let mut data: String = chars[start.min(end)..end].iter().collect();
            data.push('\\');
            if start < end {
                start = end;
            }
            line.push(&data);
            line.fold();
            if chars[start] == ' ' {
                line.push("\\");
            }
        }
    }
}

fn escape(c: char) -> String {
    let short = match c {
        '\0' => "0",
        '\x07' => "a",
        '\x08' => "b",
        '\t' => "t",
        '\n' => "n",
        '\x0B' => "v",
        '\x0C' => "f",
        '\r' => "r",
        '\x1B' => "e",
        '"' => "\"",
        '\\' => "\\",
        '\u{85}' => "N",
        '\u{A0}' => "_",
        '\u{2028}' => "L",
        '\u{2029}' => "P",
        _ => "",
    };
    match (short, c as u32) {
        ("", n) if n <= 0xFF => format!("\\x{n:02X}"),
        ("", n) if n <= 0xFFFF => format!("\\u{n:04X}"),
        ("", n) => format!("\\U{n:08X}"),
        (s, _) => format!("\\{s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected: PyYAML 6's `yaml.dump(..., allow_unicode=True, sort_keys=True)`.
    #[test]
    fn writes_what_pyyaml_writes() {
        let caption = "A bright pop song with piano and drums that builds to a big chorus, then fades out slowly";
        let items = [
            ("timesignature", "4"),
            ("bpm", "0120"),
            ("caption", caption),
            ("language", "no"),
            ("keyscale", "F# minor"),
        ];
        let expected = "<think>\nbpm: 120\ncaption: A bright pop song with piano and drums that builds to a big chorus, then\n  fades out slowly\nkeyscale: F# minor\nlanguage: 'no'\ntimesignature: 4\n</think>";
        assert_eq!(format_cot(&items), expected);
        let quoted = [("caption", "]"), ("x", "it's: \u{16}")];
        assert_eq!(format_cot(&quoted), "<think>\ncaption: ']'\nx: \"it's: \\x16\"\n</think>");
        assert_eq!(format_cot(&[]), "<think>\n\n</think>");
    }
}
