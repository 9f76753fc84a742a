//! Errors of a sample against its plan, shared by every executor (this crate's and the
//! tch runtime's): each names the feature and, where one is at fault, the axis.

use std::fmt;

use featshard_spec::plan::ResolveError;

/// Why a sample could not be laid out, sharded or assembled.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum ExecError {
    /// A feature of the spec (or workflow) is not in the sample.
    Missing {
        feature: String,
    },
    /// Features in the sample that the spec does not declare (and that were not
    /// passed through explicitly).
    Unknown {
        features: Vec<String>,
    },
    /// Features of the spec that belong to other workflows than the one asked for:
    /// each with the workflows that have it.
    OtherWorkflow {
        workflow: String,
        features: Vec<(String, Vec<String>)>,
    },
    Rank {
        feature: String,
        expected: usize,
        got: Vec<i64>,
    },
    DType {
        feature: String,
        expected: String,
        got: String,
    },
    ChannelSize {
        feature: String,
        axis: usize,
        expected: u64,
        got: i64,
    },
    /// Two axes of one semantic disagree on its length.
    Length {
        feature: String,
        axis: usize,
        semantic: String,
        got: i64,
        expected: usize,
        first: String,
    },
    /// A domain plan's batch axis is not 1 long.
    BatchSize {
        feature: String,
        axis: usize,
        semantic: String,
        got: usize,
    },
    /// An owner count or owner map is inconsistent with the owned axis.
    Ownership {
        feature: String,
        axis: usize,
        semantic: String,
        message: String,
    },
    /// Index values outside the indexed semantic.
    IndexRange {
        feature: String,
        semantic: String,
        min: i64,
        max: i64,
        len: usize,
    },
    /// A one-hot feature with values other than 0/1 or rows with several ones.
    OneHot {
        feature: String,
        axis: usize,
        message: String,
    },
    /// An axis that arrives padded does not fit the rule that tells its real items.
    Incoming {
        feature: String,
        axis: usize,
        semantic: String,
        message: String,
    },
    /// A derived feature given in the sample differs from what its rule makes.
    Derived {
        feature: String,
        rule: String,
    },
    /// A sparse feature given as its elements that do not describe it.
    Entries {
        feature: String,
        message: String,
    },
    /// A ranged feature holding a value outside its declared range.
    Range {
        feature: String,
        value: i64,
        at: Vec<usize>,
        range: [i64; 2],
    },
    /// A mask holding a value that is neither 0 nor 1.
    MaskValue {
        feature: String,
        index: i64,
        value: f64,
    },
    /// A block-diagonal feature with entries outside the diagonal blocks: sharding
    /// would drop them.
    OffDiagonal {
        feature: String,
        axis: usize,
        semantic: String,
    },
    /// The sample does not fit the plan's rules for this mesh.
    Plan(ResolveError),
    /// Blocks given to `assemble` do not match the plan.
    Blocks {
        feature: String,
        message: String,
    },
    /// A failure inside libtorch, in the tch runtime (a bug if it happens after
    /// validation).
    Torch {
        feature: String,
        message: String,
    },
    /// As many ranks' items (blocks, headers, paths) as the mesh has ranks were
    /// expected.
    RankCount {
        what: &'static str,
        given: usize,
        mesh: [usize; 2],
    },
    /// A rank outside the mesh.
    NoSuchRank {
        rank: usize,
        mesh: [usize; 2],
    },
    /// A semantic without a `window` cannot be packed.
    NoWindow {
        semantic: String,
    },
    /// A safetensors header or file could not be written.
    Safetensors {
        message: String,
    },
    /// Memory could not be allocated for `what` (a feature's block, a rank's buffer).
    Alloc {
        what: String,
        bytes: usize,
        message: String,
    },
    /// A length, count or size a sample or a file gives past a limit.
    TooLarge {
        feature: String,
        message: String,
    },
    Io {
        path: String,
        message: String,
    },
    /// A plan this runtime does not execute.
    Unsupported {
        message: String,
    },
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ExecError::*;
        match self {
            Missing { feature } => write!(f, "feature `{feature}`: missing from the sample"),
            Unknown { features } => write!(
                f,
                "features not in the spec: {} (declare them, list them under `drop`, or set `other_keys: drop | pass`)",
                first_few(features.iter().map(|n| format!("`{n}`")))
            ),
            OtherWorkflow { workflow, features } => write!(
                f,
                "features of the spec that workflow `{workflow}` does not have: {} (leave them out of the sample, or give the workflow it was made for)",
                first_few(
                    features
                        .iter()
                        .map(|(n, ws)| format!("`{n}` (workflow {})", ws.join(", ")))
                )
            ),
            Rank { feature, expected, got } => write!(
                f,
                "feature `{feature}`: expected {expected} axes, got shape {got:?}"
            ),
            DType { feature, expected, got } => {
                write!(f, "feature `{feature}`: expected dtype {expected}, got {got}")
            }
            ChannelSize { feature, axis, expected, got } => write!(
                f,
                "feature `{feature}`, axis {axis} (channel): expected size {expected}, got {got}"
            ),
            Length { feature, axis, semantic, got, expected, first } => write!(
                f,
                "feature `{feature}`, axis {axis} ({semantic}): length {got}, but feature `{first}` has {semantic} length {expected}"
            ),
            BatchSize { feature, axis, semantic, got } => write!(
                f,
                "feature `{feature}`, axis {axis} ({semantic}): the per-domain-group batch size must be 1, got {got}; scale the batch over the data-parallel axis"
            ),
            Ownership { feature, axis, semantic, message } => {
                write!(f, "feature `{feature}`, axis {axis} ({semantic}): {message}")
            }
            IndexRange { feature, semantic, min, max, len } => write!(
                f,
                "feature `{feature}`: index values must lie in [0, {len}) of `{semantic}`, found [{min}, {max}]"
            ),
            OneHot { feature, axis, message } => {
                write!(f, "feature `{feature}`, axis {axis} (one-hot): {message}")
            }
            Incoming { feature, axis, semantic, message } => write!(
                f,
                "feature `{feature}`, axis {axis} ({semantic}, incoming pads): {message}"
            ),
            Derived { feature, rule } => write!(
                f,
                "feature `{feature}`: the sample's value differs from {rule}, which the spec derives it as"
            ),
            Entries { feature, message } => write!(f, "feature `{feature}`: {message}"),
            Range { feature, value, at, range: [lo, hi] } => write!(
                f,
                "feature `{feature}`: its values lie in `range: [{lo}, {hi}]`, found {value} at {at:?}"
            ),
            MaskValue { feature, index, value } => write!(
                f,
                "feature `{feature}`: a mask holds 0 or 1 (false/true, 0/1, 0.0/1.0), found {value} at flat index {index}"
            ),
            OffDiagonal { feature, axis, semantic } => write!(
                f,
                "feature `{feature}`, axis {axis} ({semantic}): nonzero entries outside the diagonal blocks; each item must point at an item of its own shard"
            ),
            Plan(e) => write!(f, "{e}"),
            Blocks { feature, message } => write!(f, "feature `{feature}`: {message}"),
            Torch { feature, message } => write!(f, "feature `{feature}`: torch: {message}"),
            RankCount { what, given, mesh } => write!(
                f,
                "{given} {what} given for a {}x{} mesh of {} ranks",
                mesh[0],
                mesh[1],
                mesh[0] * mesh[1]
            ),
            NoSuchRank { rank, mesh } => write!(
                f,
                "rank {rank} is outside the {}x{} mesh of {} ranks",
                mesh[0],
                mesh[1],
                mesh[0] * mesh[1]
            ),
            NoWindow { semantic } => write!(
                f,
                "semantic `{semantic}` has no `window`, so it cannot be packed"
            ),
            Safetensors { message } => write!(f, "safetensors: {message}"),
            Alloc { what, bytes, message } => write!(
                f,
                "{what}: cannot allocate {bytes} bytes ({:.2} GB): {message}",
                *bytes as f64 / 1e9
            ),
            TooLarge { feature, message } => write!(f, "feature `{feature}`: {message}"),
            Io { path, message } => write!(f, "{path}: {message}"),
            Unsupported { message } => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for ExecError {}

impl From<ResolveError> for ExecError {
    fn from(e: ResolveError) -> Self {
        ExecError::Plan(e)
    }
}

/// The first names of a list, and how many more: a message stays readable (and small)
/// whatever the sample holds.
fn first_few(names: impl ExactSizeIterator<Item = String>) -> String {
    const SHOWN: usize = 10;
    let total = names.len();
    let mut out: Vec<String> = names.take(SHOWN).collect();
    if total > SHOWN {
        out.push(format!("and {} more", total - SHOWN));
    }
    out.join(", ")
}
