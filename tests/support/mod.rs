//! Helpers shared by the spec-error tests.

#![allow(dead_code)]

pub mod cli;

use featshard_spec::compile_str;

/// The rendered errors of a spec that must be rejected.
pub fn errors_of(text: &str) -> String {
    // `FEATSHARD_FUZZ_SEEDS=DIR` saves every case as a fuzzing seed (fuzz/seeds/).
    if let Some(dir) = std::env::var_os("FEATSHARD_FUZZ_SEEDS") {
        if text.len() < 64 * 1024 {
            let name = featshard_spec::sha256_hex(text);
            let _ = std::fs::write(
                std::path::Path::new(&dir).join(format!("malformed-{}.yaml", &name[..16])),
                text,
            );
        }
    }
    match compile_str("spec.yaml", text) {
        Ok(_) => panic!("spec was accepted:\n{text}"),
        Err(d) => {
            for e in &d.errors {
                assert_snippet_at_message(text, e);
            }
            d.render_plain()
        }
    }
}

/// The snippet a rendered error underlines starts where its message says: the label's
/// byte offset lies at the error's line:col.
pub fn assert_snippet_at_message(text: &str, e: &featshard_spec::diag::SpecError) {
    if !e.loc.is_known() {
        return;
    }
    let before = &text[..e.loc.offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    assert_eq!(
        (line, column),
        (e.loc.line as usize, e.loc.column as usize),
        "`{e}` says {} but its snippet starts at {line}:{column}",
        e.loc
    );
}

/// Asserts that some error line holds every `needle`.
pub fn assert_error(text: &str, needles: &[&str]) {
    let rendered = errors_of(text);
    assert!(
        rendered
            .lines()
            .any(|line| needles.iter().all(|n| line.contains(n))),
        "no error line holds all of {needles:?}; errors were:\n{rendered}"
    );
}
