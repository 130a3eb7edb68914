//! Which source files of a crate import which, read from the source's `crate::` and
//! `super::` paths, comments and test-only modules left out: a grouped import
//! (`super::{forward, state}`) names each of its paths, and a re-export is followed to
//! the file that defines the item (`crate::bridge::AppState` is bridge/state.rs). The
//! engine's and the app's layering tests read their crates with it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A file as its module path: `bridge::state` is `["bridge", "state"]`, lib.rs `[]`.
pub type Module = Vec<String>;
pub type Graph = BTreeMap<Module, BTreeSet<Module>>;

/// Every `.rs` file under `dir`, by its module path, with its source.
pub fn modules(dir: &Path, prefix: &[String], out: &mut BTreeMap<Module, String>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            let mut p = prefix.to_vec();
            p.push(name);
            modules(&path, &p, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let mut p = prefix.to_vec();
            if name != "mod" && !(prefix.is_empty() && name == "lib") {
                p.push(name);
            }
            out.insert(p, std::fs::read_to_string(&path).unwrap());
        }
    }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The source without comments and test-only modules: each `#[cfg(test)] mod x { .. }`
/// cut out, and the names of those declared `#[cfg(test)] mod x;`, whose files are
/// test code too.
fn code(source: &str) -> (String, Vec<String>) {
    let mut code = source.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n");
    let mut test_files = Vec::new();
    let mut from = 0;
    while let Some(found) = code[from..].find("#[cfg(test)]") {
        let start = from + found;
        let rest = code[start + "#[cfg(test)]".len()..].trim_start();
        let rest = rest.strip_prefix("pub ").unwrap_or(rest);
        let Some(decl) = rest.strip_prefix("mod ") else {
            from = start + 1;
            continue;
        };
        let name: String = decl.bytes().take_while(|c| is_ident(*c)).map(char::from).collect();
        let after = decl[name.len()..].trim_start();
        let decl_at = code.len() - after.len();
        let end = match after.as_bytes().first() {
            Some(b';') => {
                test_files.push(name);
                decl_at + 1
            }
            // Braces counted as they come: a test module's strings keep them balanced.
            Some(b'{') => {
                let mut depth = 0;
                let close = after.bytes().position(|c| {
                    depth += (c == b'{') as i32 - (c == b'}') as i32;
                    depth == 0
                });
                decl_at + close.map_or(after.len(), |c| c + 1)
            }
            _ => {
                from = start + 1;
                continue;
            }
        };
        code.replace_range(start..end, "");
        from = start;
    }
    (code, test_files)
}

/// The paths of the use tree at `s[*i..]`, each with the name it is brought in under
/// when an `as` renames it: `a::{self, b as c, d::*}` names `a`, `a::b` (as `c`) and
/// `a::d::*`. A path in code (`super::engine::start(..)`) is a tree of one path.
fn tree(s: &[u8], i: &mut usize, prefix: Module, out: &mut Vec<(Module, Option<String>)>) {
    let skip_ws = |i: &mut usize| {
        while s.get(*i).is_some_and(u8::is_ascii_whitespace) {
            *i += 1;
        }
    };
    let ident = |i: &mut usize| {
        let start = *i;
        while s.get(*i).copied().is_some_and(is_ident) {
            *i += 1;
        }
        String::from_utf8_lossy(&s[start..*i]).into_owned()
    };
    let mut path = prefix;
    loop {
        skip_ws(i);
        if s.get(*i) == Some(&b'{') {
            *i += 1;
            loop {
                skip_ws(i);
                match s.get(*i) {
                    None => return,
                    Some(b'}') => {
                        *i += 1;
                        return;
                    }
                    Some(b',') => *i += 1,
                    Some(_) => {
                        let before = *i;
                        tree(s, i, path.clone(), out);
                        if *i == before {
                            *i += 1;
                        }
                    }
                }
            }
        }
        if s.get(*i) == Some(&b'*') {
            *i += 1;
            path.push("*".into());
            out.push((path, None));
            return;
        }
        let part = ident(i);
        if part.is_empty() {
            out.push((path, None));
            return;
        }
        if part != "self" {
            path.push(part);
        }
        if s[*i..].starts_with(b"::") {
            *i += 2;
            continue;
        }
        let mut j = *i;
        skip_ws(&mut j);
        let renamed = s[j..].starts_with(b"as") && !s.get(j + 2).copied().is_some_and(is_ident);
        let alias = renamed.then(|| {
            j += 2;
            skip_ws(&mut j);
            ident(&mut j)
        });
        if alias.as_ref().is_some_and(|a| !a.is_empty()) {
            *i = j;
        }
        out.push((path, alias.filter(|a| !a.is_empty())));
        return;
    }
}

/// `path` (its first part `crate`, `super` or, in a `pub use`, a submodule of `module`)
/// as a path from the crate's root; None for another crate's.
fn absolute(module: &[String], path: &[String], all: &BTreeSet<Module>) -> Option<Module> {
    let (mut base, mut rest) = (module.to_vec(), path);
    match rest.first().map(String::as_str) {
        Some("crate") => (base, rest) = (Vec::new(), &rest[1..]),
        Some("super") => {
            while rest.first().is_some_and(|p| p == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        Some(first) if all.contains(&[module, &[first.to_string()]].concat()) => {}
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Every `crate::` and `super::` path of `code`, in a `use` or in code.
fn paths(code: &str) -> Vec<Module> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for root in ["crate::", "super::"] {
        for (at, _) in code.match_indices(root) {
            if at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b':') {
                continue;
            }
            let mut leaves = Vec::new();
            tree(bytes, &mut at.clone(), Vec::new(), &mut leaves);
            found.extend(leaves.into_iter().map(|(path, _)| path));
        }
    }
    found
}

/// What a file re-exports (`pub use`, `pub(crate) use`): the name it is seen under, and
/// the path from the crate's root of the item it names.
fn re_exports(module: &[String], code: &str, all: &BTreeSet<Module>) -> BTreeMap<String, Module> {
    let mut names = BTreeMap::new();
    for visibility in ["pub use ", "pub(crate) use ", "pub(super) use "] {
        for (at, _) in code.match_indices(visibility) {
            let mut leaves = Vec::new();
            tree(code.as_bytes(), &mut (at + visibility.len()), Vec::new(), &mut leaves);
            for (path, alias) in leaves {
                let Some(name) = alias.or_else(|| path.last().cloned()).filter(|n| n != "*") else { continue };
                if let Some(target) = absolute(module, &path, all) {
                    names.insert(name, target);
                }
            }
        }
    }
    names
}

/// The file that defines what an absolute path names: its longest prefix that is a
/// file of the crate, through the re-exports of each file on the way.
fn file_of(
    mut path: Module,
    all: &BTreeSet<Module>,
    re_exported: &BTreeMap<Module, BTreeMap<String, Module>>,
) -> Module {
    for _ in 0..16 {
        let mut file = path.clone();
        while !file.is_empty() && !all.contains(&file) {
            file.pop();
        }
        let Some(target) = path.get(file.len()).and_then(|name| re_exported.get(&file)?.get(name)) else {
            return file;
        };
        path = [target.as_slice(), &path[file.len() + 1..]].concat();
    }
    panic!("re-exports go round a circle at {}", path.join("::"));
}

/// Each file's imports of other files of the crate (lib.rs, which declares every
/// module, is no file's import).
pub fn graph(files: &BTreeMap<Module, String>) -> Graph {
    let codes: BTreeMap<Module, (String, Vec<String>)> = files.iter().map(|(m, s)| (m.clone(), code(s))).collect();
    let test_only: Vec<Module> = codes
        .iter()
        .flat_map(|(m, (_, tests))| tests.iter().map(move |t| [m.as_slice(), std::slice::from_ref(t)].concat()))
        .collect();
    let codes: BTreeMap<Module, String> = codes
        .into_iter()
        .filter(|(m, _)| !test_only.iter().any(|t| m.starts_with(t)))
        .map(|(m, (code, _))| (m, code))
        .collect();
    let all: BTreeSet<Module> = codes.keys().cloned().collect();
    let re_exported: BTreeMap<Module, BTreeMap<String, Module>> =
        codes.iter().map(|(m, c)| (m.clone(), re_exports(m, c, &all))).collect();
    codes
        .iter()
        .map(|(m, code)| {
            let targets = paths(code)
                .iter()
                .filter_map(|p| absolute(m, p, &all))
                .map(|p| file_of(p, &all, &re_exported))
                .filter(|t| !t.is_empty() && t != m)
                .collect();
            (m.clone(), targets)
        })
        .collect()
}

/// Every circle of imports, as `a -> b -> a`: a depth-first search for back edges.
pub fn circles(g: &Graph) -> Vec<String> {
    fn visit(node: &Module, g: &Graph, stack: &mut Vec<Module>, done: &mut BTreeSet<Module>, out: &mut Vec<String>) {
        if done.contains(node) {
            return;
        }
        if let Some(i) = stack.iter().position(|n| n == node) {
            let names: Vec<String> = stack[i..].iter().chain([node]).map(|n| n.join("::")).collect();
            out.push(names.join(" -> "));
            return;
        }
        stack.push(node.clone());
        for next in g.get(node).into_iter().flatten() {
            // A file's use of its own submodules is ownership, not a dependency back.
            if next.starts_with(node) || node.is_empty() {
                continue;
            }
            visit(next, g, stack, done, out);
        }
        stack.pop();
        done.insert(node.clone());
    }
    let (mut done, mut out) = (BTreeSet::new(), Vec::new());
    for node in g.keys() {
        visit(node, g, &mut Vec::new(), &mut done, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader itself, on a made-up crate: a grouped import names each module in it, a
    /// re-export leads to the file that defines the item, and test-only code is no import.
    #[test]
    fn the_reader_follows_groups_and_re_exports_and_skips_tests() {
        let m = |p: &str| p.split("::").filter(|s| !s.is_empty()).map(String::from).collect::<Module>();
        let files: BTreeMap<Module, String> = [
            ("", "mod a;\npub use a::Thing as Renamed;"),
            ("a", "mod b;\nmod c;\nmod d;\n#[cfg(test)]\nmod tests;\npub use c::Thing;"),
            ("a::b", "use super::{c, d::{self, Other}};\n// use super::e;\nfn f() { crate::Renamed::new(); }"),
            ("a::c", "#[cfg(test)]\nmod tests {\n    use super::super::b;\n}"),
            ("a::d", "use crate::a::Thing;"),
            ("a::e", ""),
            ("a::tests", "use super::b;"),
        ]
        .into_iter()
        .map(|(p, s)| (m(p), s.to_string()))
        .collect();
        let g = graph(&files);
        assert!(!g.contains_key(&m("a::tests")), "a file declared under #[cfg(test)] is test code");
        assert_eq!(g[&m("a::b")], [m("a::c"), m("a::d")].into_iter().collect());
        assert_eq!(g[&m("a::c")], BTreeSet::new());
        assert_eq!(g[&m("a::d")], [m("a::c")].into_iter().collect());
        assert!(circles(&g).is_empty());
        let mut looped = files.clone();
        looped.insert(m("a::c"), "use super::b::f;".into());
        assert_eq!(circles(&graph(&looped)), ["a::b -> a::c -> a::b"]);
    }
}
