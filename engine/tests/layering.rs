//! The engine's modules depend one way, as DESIGN.md draws them: each top-level module
//! uses only modules of a lower layer (the DiT knows nothing of training, data or
//! loading), and no two source files import each other, directly or round a circle.
//! Read from the source's `crate::` and `super::` paths, test modules left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every top-level module and its layer: a module may use only lower layers.
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("atomic", 1),
    ("heap", 0),
    ("cancel", 0),
    ("kernels", 0),
    ("tensor_io", 0),
    ("metrics", 0),
    ("device", 0),
    ("finite", 0),
    ("runtime", 1),
    ("model", 1),
    ("lora", 2),
    ("codec", 2),
    ("data", 3),
    ("load", 3),
    ("label", 4),
    ("events", 4),
    ("generate", 4),
    ("run_state", 5),
    ("noise_levels", 6),
    ("train", 6),
    ("charts", 7),
    ("export", 7),
    ("bench", 7),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, as its module path (`model::attention`, `lib`).
fn modules(dir: &Path, prefix: &[String], out: &mut BTreeMap<Vec<String>, String>) {
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

/// The source without its `#[cfg(test)]` module and its comments.
fn code(source: &str) -> String {
    let body = match source.find("#[cfg(test)]\nmod tests") {
        Some(i) => &source[..i],
        None => source,
    };
    body.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n")
}

/// The paths a file names: `crate::a::b::c` and `super::b` (made absolute), each as
/// the longest prefix that is a module of the crate.
fn imports(module: &[String], code: &str, all: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    for (root, base) in [("crate::", Vec::new()), ("super::", module[..module.len().saturating_sub(1)].to_vec())] {
        for (i, _) in code.match_indices(root) {
            if i > 0 && (is_ident(code[..i].chars().last().unwrap()) || code[..i].ends_with(':')) {
                continue;
            }
            let mut path = base.clone();
            for part in code[i + root.len()..].split("::") {
                let ident: String = part.chars().take_while(|c| is_ident(*c)).collect();
                if ident.is_empty() {
                    break;
                }
                path.push(ident.clone());
                if ident.len() != part.len() {
                    break;
                }
            }
            while !path.is_empty() && !all.contains(&path) {
                path.pop();
            }
            if !path.is_empty() && path != module {
                found.insert(path);
            }
        }
    }
    found
}

fn graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = BTreeMap::new();
    modules(&src(), &[], &mut files);
    let all: BTreeSet<Vec<String>> = files.keys().cloned().collect();
    files.iter().map(|(m, s)| (m.clone(), imports(m, &code(s), &all))).collect()
}

#[test]
fn each_module_uses_only_lower_layers() {
    let layer = |m: &[String]| LAYERS.iter().find(|(n, _)| m.first().map(String::as_str) == Some(*n)).map(|l| l.1);
    let mut wrong = Vec::new();
    for (from, targets) in graph() {
        if from.is_empty() {
            continue; // lib.rs declares every module
        }
        let Some(own) = layer(&from) else {
            wrong.push(format!("{} has no layer in LAYERS: place it", from.join("::")));
            continue;
        };
        for to in targets.iter().filter(|t| t.first() != from.first()) {
            match layer(to) {
                Some(l) if l < own => {}
                _ => wrong.push(format!("{} uses {}", from.join("::"), to.join("::"))),
            }
        }
    }
    println!("checked {} layer rules", LAYERS.len());
    assert!(wrong.is_empty(), "dependencies against the layers:\n{}", wrong.join("\n"));
}

#[test]
fn no_two_files_import_each_other_round_a_circle() {
    let g = graph();
    // Depth-first search for a back edge; the path to it is the circle.
    fn visit(
        node: &Vec<String>,
        g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        stack: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
        circles: &mut Vec<String>,
    ) {
        if done.contains(node) {
            return;
        }
        if let Some(i) = stack.iter().position(|n| n == node) {
            let names: Vec<String> = stack[i..].iter().chain([node]).map(|n| n.join("::")).collect();
            circles.push(names.join(" -> "));
            return;
        }
        stack.push(node.clone());
        for next in g.get(node).into_iter().flatten() {
            // A file's use of its own submodules is ownership, not a dependency back.
            if next.starts_with(node) || node.is_empty() {
                continue;
            }
            visit(next, g, stack, done, circles);
        }
        stack.pop();
        done.insert(node.clone());
    }
    let (mut done, mut circles) = (BTreeSet::new(), Vec::new());
    for node in g.keys() {
        visit(node, &g, &mut Vec::new(), &mut done, &mut circles);
    }
    println!("checked {} files", g.len());
    assert!(circles.is_empty(), "import circles:\n{}", circles.join("\n"));
}
