//! The seed corpora through their targets: the committed ones (and every crash input
//! kept beside them, `corpus/<target>/regressions/`) and ones made afresh by the
//! encoders, so that a change to a format shows here before it starves a fuzz run.

use std::path::Path;

use domaind_fuzz::TARGETS;

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            found.extend(files(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[test]
fn every_committed_input_passes_its_target() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (target, run) in TARGETS {
        let inputs = files(&corpus.join(target));
        assert!(inputs.len() >= 4, "{target}: {} seeds", inputs.len());
        for path in inputs {
            let bytes = std::fs::read(&path).expect("readable");
            run(&bytes);
        }
    }
}

/// Made afresh, each seed is taken or refused as its name says: a seed that stopped
/// reaching past the first check would leave the fuzzer nothing to start from.
#[test]
fn fresh_seeds_are_taken_or_refused_as_named() {
    for (target, run) in TARGETS {
        for (name, bytes) in domaind_fuzz::seeds::of(target) {
            let refused = name.starts_with("refused-");
            assert_eq!(run(&bytes), !refused, "{target}/{name}");
        }
    }
}
