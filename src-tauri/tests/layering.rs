//! The app's source files depend one way (README.md, "What is where"): no two files
//! import each other, directly or round a circle. The twin of the engine's
//! tests/layering.rs, on the same reader (the import-graph crate).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use import_graph::{circles, graph, modules};

#[test]
fn no_two_files_import_each_other_round_a_circle() {
    let mut files = BTreeMap::new();
    modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &[], &mut files);
    let g = graph(&files);
    println!("checked {} files ({} imports between them)", g.len(), g.values().map(BTreeSet::len).sum::<usize>());
    let found = circles(&g);
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}
