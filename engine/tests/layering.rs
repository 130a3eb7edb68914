//! The engine's modules depend one way, as DESIGN.md draws them: each top-level module
//! uses only modules of a lower layer (the DiT knows nothing of training, data or
//! loading), and no two source files import each other, directly or round a circle.
//! Read by the import-graph crate (grouped imports named, re-exports followed to the
//! defining file, test-only code left out), as the app's tests/layering.rs reads its own.

use std::collections::BTreeMap;
use std::path::Path;

use import_graph::{circles, modules, Graph};

/// Every top-level module and its layer: a module may use only lower layers.
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("atomic", 1),
    ("heap", 0),
    ("cancel", 1),
    ("kernels", 0),
    ("trace", 0),
    ("tensor_io", 1),
    ("metrics", 0),
    ("device", 1),
    ("finite", 1),
    ("runtime", 2),
    ("model", 2),
    ("lora", 3),
    ("codec", 3),
    ("data", 4),
    ("load", 4),
    ("label", 5),
    ("events", 5),
    ("generate", 6),
    ("run_state", 6),
    ("noise_levels", 7),
    ("train", 7),
    ("charts", 8),
    ("export", 8),
    ("bench", 8),
];

/// Each file's imports of the engine's other files.
fn graph() -> Graph {
    let mut files = BTreeMap::new();
    modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &[], &mut files);
    import_graph::graph(&files)
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
    println!("checked {} files ({} imports between them)", g.len(), g.values().map(|t| t.len()).sum::<usize>());
    let found = circles(&g);
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}
