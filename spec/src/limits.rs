//! Hard limits on spec input, so that no spec can exhaust memory or time.

/// Largest spec file accepted, in bytes.
pub const MAX_SPEC_BYTES: usize = 32 * 1024 * 1024;
/// Most features one spec may declare.
pub const MAX_FEATURES: usize = 100_000;
/// Most semantics one spec may declare.
pub const MAX_SEMANTICS: usize = 1_000;
/// Most axes one feature may have (torch supports at most 64 dimensions).
pub const MAX_AXES: usize = 32;
/// Deepest YAML nesting accepted.
pub const MAX_DEPTH: usize = 32;
/// Most YAML nodes (scalars, sequences, mappings), aliases expanded.
pub const MAX_NODES: usize = 4_000_000;
/// Most alias uses; alias expansion also counts towards [`MAX_NODES`].
pub const MAX_ALIASES: usize = 10_000;

/// The parser options that enforce these limits.
pub(crate) fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_DEPTH;
    budget.max_nodes = MAX_NODES;
    budget.max_events = 2 * MAX_NODES;
    budget.max_aliases = MAX_ALIASES;
    budget.max_reader_input_bytes = Some(MAX_SPEC_BYTES);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.with_snippet = false;
    options
}
