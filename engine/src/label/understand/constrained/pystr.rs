//! Python's `str` methods as upstream's processor calls them, where Rust's differ: its
//! whitespace also holds the four separators U+001C..U+001F (a byte-level vocabulary
//! has tokens for them), and its lengths and slices count code points.

/// `c.isspace()`.
pub(crate) fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `s.strip()`.
pub(crate) fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// `s.lstrip()`.
pub(crate) fn lstrip(s: &str) -> &str {
    s.trim_start_matches(is_space)
}

/// `s.rstrip()`.
pub(crate) fn rstrip(s: &str) -> &str {
    s.trim_end_matches(is_space)
}

/// `s[start:]` with `start` in code points (empty past the end).
pub(crate) fn tail(s: &str, start: usize) -> &str {
    s.char_indices().nth(start).map_or("", |(at, _)| &s[at..])
}

/// `s[:end]` with `end` in code points.
pub(crate) fn head(s: &str, end: usize) -> &str {
    s.char_indices().nth(end).map_or(s, |(at, _)| &s[..at])
}

/// `len(s)`.
pub(crate) fn len(s: &str) -> usize {
    s.chars().count()
}

/// `c.lower()` where it is one character (a few lowercase to two; upstream's single
/// character keys then never match a trie's characters).
pub(crate) fn lower_char(c: char) -> Option<char> {
    let mut lower = c.to_lowercase();
    match (lower.next(), lower.next()) {
        (Some(l), None) => Some(l),
        _ => None,
    }
}

/// The order `list(s)` gives a set of ints built by `s = set()` and `s.add(x)` for
/// each of `adds` in CPython (3.11's setobject.c: hash(x) == x, open addressing with
/// up to 9 linear probes then perturbed jumps, the table regrown to hold 4x what it
/// holds once 3/5 full). Upstream breaks ties by this order where it takes the argmax
/// over a set's members.
pub(crate) fn set_order(adds: &[u32]) -> Vec<u32> {
    let mut table: Vec<Option<u32>> = vec![None; 8];
    let mut used = 0;
    for &x in adds {
        if table.contains(&Some(x)) {
            continue;
        }
        set_insert(&mut table, x);
        used += 1;
        if used * 5 >= (table.len() - 1) * 3 {
            let wanted = if used > 50_000 { used * 2 } else { used * 4 };
            let mut size = 8;
            while size <= wanted {
                size <<= 1;
            }
            let old = std::mem::replace(&mut table, vec![None; size]);
            for x in old.into_iter().flatten() {
                set_insert(&mut table, x);
            }
        }
    }
    table.into_iter().flatten().collect()
}

fn set_insert(table: &mut [Option<u32>], x: u32) {
    const LINEAR_PROBES: usize = 9;
    let mask = table.len() - 1;
    let mut perturb = x as usize;
    let mut i = x as usize & mask;
    loop {
        let probes = if i + LINEAR_PROBES <= mask { LINEAR_PROBES } else { 0 };
        if let Some(slot) = table[i..=i + probes].iter_mut().find(|s| s.is_none()) {
            *slot = Some(x);
            return;
        }
        perturb >>= 5;
        i = (i * 5 + 1 + perturb) & mask;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_whitespace_and_code_point_slices() {
        assert_eq!(strip("\u{1f} a\u{a0}\n"), "a");
        assert_eq!(lstrip("\u{1c}\tb "), "b ");
        assert_eq!(rstrip(" b\u{1d}"), " b");
        assert_eq!(tail("♯ab", 1), "ab");
        assert_eq!(tail("ab", 5), "");
        assert_eq!(head("♭cd", 2), "♭c");
        assert_eq!(head("ab", 9), "ab");
        assert_eq!(len("D♯"), 2);
        assert_eq!(lower_char('Σ'), Some('σ'));
        assert_eq!(lower_char('İ'), None);
    }
}
