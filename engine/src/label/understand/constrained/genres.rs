//! The genres value under a genres vocabulary, as upstream constrains it: the whole
//! value (commas included) must spell one vocabulary entry, compared in lower case
//! character by character through a trie, a token at a time. Upstream's second,
//! caption-matched trie is never built in understand mode (nothing sets a caption), so
//! only the full vocabulary's trie is here.

use std::collections::HashMap;
use std::path::Path;

use super::pystr;
use super::vocab::Vocab;
use crate::{Error, Result};

/// A genres vocabulary file as upstream reads it: one genre a line, blank lines and
/// lines starting with `#` skipped, each stripped and lowercased.
pub fn read_genres_vocab(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    // Python's text mode splits lines at \r too.
    Ok(text
        .split(['\n', '\r'])
        .map(pystr::strip)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_lowercase)
        .collect())
}

#[derive(Default)]
struct Node {
    children: Vec<(char, usize)>,
    complete: bool,
}

/// The genres trie and, over the LM's vocabulary, each token's text as the trie
/// compares it and the tokens each first character can start.
pub(crate) struct Genres {
    nodes: Vec<Node>,
    /// Lowercased, trailing whitespace stripped; a whitespace-only token reads " ".
    token_texts: Vec<String>,
    /// A token's first character and its first non-space one, lowercased -> tokens.
    by_first_char: HashMap<char, Vec<u32>>,
}

impl Genres {
    pub(crate) fn new(genres: &[String], vocab: &Vocab) -> Self {
        let mut nodes = vec![Node::default()];
        for genre in genres {
            let mut at = 0;
            for c in genre.to_lowercase().chars() {
                at = match nodes[at].children.iter().find(|(k, _)| *k == c) {
                    Some(&(_, child)) => child,
                    None => {
                        nodes.push(Node::default());
                        let child = nodes.len() - 1;
                        nodes[at].children.push((c, child));
                        child
                    }
                };
            }
            nodes[at].complete = true;
        }
        let mut token_texts = Vec::with_capacity(vocab.len());
        let mut by_first_char: HashMap<char, Vec<u32>> = HashMap::new();
        for (id, text) in vocab.iter() {
            let lower = text.to_lowercase();
            let stripped = pystr::rstrip(&lower);
            token_texts.push(if stripped.is_empty() && !lower.is_empty() { " ".into() } else { stripped.into() });
            let first = text.chars().next();
            let first_non_space = pystr::lstrip(text).chars().next().filter(|_| pystr::lstrip(text) != text);
            for c in [first, first_non_space].into_iter().flatten().filter_map(pystr::lower_char) {
                let ids = by_first_char.entry(c).or_default();
                if ids.last() != Some(&id) {
                    ids.push(id);
                }
            }
        }
        Self { nodes, token_texts, by_first_char }
    }

    /// The trie node `text` (lowercased) leads to.
    fn node(&self, text: &str) -> Option<&Node> {
        let mut at = 0;
        for c in text.to_lowercase().chars() {
            at = self.nodes[at].children.iter().find(|(k, _)| *k == c)?.1;
        }
        Some(&self.nodes[at])
    }

    /// The tokens that may follow the value so far (`value`: the decoded tokens
    /// concatenated), the newline among them where the value is a complete genre; an
    /// empty list where nothing may (the caller then forces the newline).
    pub(crate) fn allowed(&self, value: &str, newline: u32) -> Vec<u32> {
        let lower = value.to_lowercase();
        let prefix = pystr::strip(&lower);
        let Some(node) = self.node(prefix) else { return vec![newline] };
        let mut allowed: Vec<u32> = Vec::new();
        let space_or_comma_next = node.children.iter().any(|(c, _)| *c == ' ' || *c == ',');
        for (c, _) in &node.children {
            for &id in self.by_first_char.get(c).into_iter().flatten() {
                let text = self.token_texts[id as usize].as_str();
                let fits = if pystr::strip(text).is_empty() {
                    space_or_comma_next
                } else {
                    self.node(&format!("{prefix}{text}")).is_some()
                };
                if fits {
                    allowed.push(id);
                }
            }
        }
        if node.complete {
            allowed.push(newline);
        }
        allowed.sort_unstable();
        allowed.dedup();
        allowed
    }
}
