//! Hard limits on spec input, so that no spec can exhaust memory or time.

/// Largest spec file accepted, in bytes.
pub const MAX_SPEC_BYTES: usize = 32 * 1024 * 1024;
/// Most features one spec may declare. Real specs have about a hundred; 10,000 generate
/// every output in under a second (`cargo bench --bench generate_large`), where 100,000
/// took 25 s and 1.7 GB, mostly formatting a 50 MB Rust file nobody would compile.
pub const MAX_FEATURES: usize = 10_000;
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
/// Longest ownership chain (`rset -> atoms -> tokens` is 2 deep).
pub const MAX_OWNER_DEPTH: usize = 16;
/// Longest module name: it names files (`test_<module>_parity.py`), which most file
/// systems limit to 255 bytes.
pub const MAX_MODULE_NAME: usize = 64;
/// Most ranks a mesh may have at run time, along one axis or in all.
pub const MAX_RANKS: usize = 65_536;
/// Largest run-time length of one semantic (items along an axis): layouts keep one
/// position per item, so this bounds their memory (1 GiB of positions).
pub const MAX_LENGTH: usize = 1 << 27;

/// Most elements a sparse feature may be given as (`NAME.indices`/`NAME.values`, or a
/// sparse tensor): each is read into 24 bytes before the dense form's blocks are made
/// (3 GiB at the limit). As many as one semantic's items may be long.
pub const MAX_ENTRIES: usize = MAX_LENGTH;

/// A run-time mesh within [`MAX_RANKS`]; the error names the size at fault.
pub fn check_mesh(mesh: &[usize]) -> Result<(), String> {
    let mut world: usize = 1;
    for &n in mesh {
        if n == 0 {
            return Err(format!("mesh {mesh:?}: a mesh axis of size 0"));
        }
        world = world
            .checked_mul(n)
            .filter(|&w| w <= MAX_RANKS)
            .ok_or_else(|| format!("mesh {mesh:?}: more than the limit of {MAX_RANKS} ranks"))?;
    }
    Ok(())
}

/// A run-time length within [`MAX_LENGTH`].
pub fn check_length(semantic: &str, n: usize) -> Result<(), String> {
    if n > MAX_LENGTH {
        return Err(format!(
            "`{semantic}` length {n} is more than the limit of {MAX_LENGTH}"
        ));
    }
    Ok(())
}

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

/// Most items a key halo holds on each side of a block (`derive: {halo: ...}`).
pub const MAX_HALO: usize = 1 << 20;
