//! Errors of a sample against its plan, shared by every executor (this crate's and the
//! tch runtime's): each names the feature and, where one is at fault, the axis.

use featshard_spec::mesh::Named;
use featshard_spec::plan::ResolveError;

/// Why a sample could not be laid out, sharded or assembled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[allow(missing_docs)]
pub enum ExecError {
    /// A feature of the spec (or workflow) is not in the sample.
    #[error("feature `{feature}`: missing from the sample")]
    Missing { feature: String },
    /// Several features of the spec (or workflow) are not in the sample: every one named
    /// at once (the first few, and how many).
    #[error("{} features missing from the sample: {}", .features.len(), quoted(.features))]
    MissingMany { features: Vec<String> },
    /// Features in the sample that the spec does not declare (and that were not
    /// passed through explicitly).
    #[error("features not in the spec: {} (declare them, list them under `drop`, or set `other_keys: drop | pass`){hint}", quoted(.features))]
    Unknown { features: Vec<String>, hint: String },
    /// One feature given under two keys (a nested path and a key joined by the
    /// separator, or two separators): which value is meant is not for intake to guess.
    #[error("feature `{feature}`: given twice, as {}: give it once", quoted(.keys))]
    Twice { feature: String, keys: Vec<String> },
    /// Features of the spec that belong to other workflows than the one asked for:
    /// each with the workflows that have it.
    #[error("features of the spec that workflow `{workflow}` does not have: {} (leave them out of the sample, or give the workflow it was made for)", with_workflows(.features))]
    OtherWorkflow {
        workflow: String,
        features: Vec<(String, Vec<String>)>,
    },
    #[error("feature `{feature}`: expected {expected} axes, got shape {got:?}")]
    Rank {
        feature: String,
        expected: usize,
        got: Vec<i64>,
    },
    #[error("feature `{feature}`: expected dtype {expected}, got {got}")]
    DType {
        feature: String,
        expected: String,
        got: String,
    },
    #[error("feature `{feature}`, axis {axis} (channel): expected size {expected}, got {got}")]
    ChannelSize {
        feature: String,
        axis: usize,
        expected: u64,
        got: i64,
    },
    /// Two axes of one semantic disagree on its length.
    #[error("feature `{feature}`, axis {axis} ({semantic}): length {got}, but feature `{first}` has {semantic} length {expected}")]
    Length {
        feature: String,
        axis: usize,
        semantic: String,
        got: i64,
        expected: usize,
        first: String,
    },
    /// A domain plan's batch axis is not 1 long.
    #[error("feature `{feature}`, axis {axis} ({semantic}): the per-domain-group batch size must be 1, got {got}; scale the batch over the data-parallel axis")]
    BatchSize {
        feature: String,
        axis: usize,
        semantic: String,
        got: usize,
    },
    /// An owner count or owner map is inconsistent with the owned axis.
    #[error("feature `{feature}`, axis {axis} ({semantic}): {message}")]
    Ownership {
        feature: String,
        axis: usize,
        semantic: String,
        message: String,
    },
    /// Index values outside the indexed semantic.
    #[error("feature `{feature}`: index values must lie in [0, {len}) of `{semantic}`, found [{min}, {max}]{}", none_hint(*.min, *.none))]
    IndexRange {
        feature: String,
        semantic: String,
        min: i64,
        max: i64,
        len: usize,
        /// The feature's none value, if it declares one.
        none: Option<i64>,
    },
    /// A one-hot feature with values other than 0/1 or rows with several ones.
    #[error("feature `{feature}`, axis {axis} (one-hot): {message}")]
    OneHot {
        feature: String,
        axis: usize,
        message: String,
    },
    /// An axis that arrives padded does not fit the rule that tells its real items.
    #[error("feature `{feature}`, axis {axis} ({semantic}, incoming pads): {message}")]
    Incoming {
        feature: String,
        axis: usize,
        semantic: String,
        message: String,
    },
    /// A derived feature given in the sample differs from what its rule makes.
    #[error(
        "feature `{feature}`: the sample's value differs from {rule}, which the spec derives it as"
    )]
    Derived { feature: String, rule: String },
    /// A sparse feature given as its elements that do not describe it.
    #[error("feature `{feature}`: {message}")]
    Entries { feature: String, message: String },
    /// A ranged feature holding a value outside its declared range.
    #[error("feature `{feature}`: its values lie in `range: [{}, {}]`, found {value} at {at:?}", .range[0], .range[1])]
    Range {
        feature: String,
        value: i64,
        at: Vec<usize>,
        range: [i64; 2],
    },
    /// A mask holding a value that is neither 0 nor 1.
    #[error("feature `{feature}`: a mask holds 0 or 1 (false/true, 0/1, 0.0/1.0), found {value} at flat index {index}")]
    MaskValue {
        feature: String,
        index: i64,
        value: f64,
    },
    /// A block-diagonal feature with entries outside the diagonal blocks: sharding
    /// would drop them.
    #[error("feature `{feature}`, axis {axis} ({semantic}): nonzero entries outside the diagonal blocks; each item must point at an item of its own shard")]
    OffDiagonal {
        feature: String,
        axis: usize,
        semantic: String,
    },
    /// A shard-local id that names an item of another shard.
    #[error("feature `{feature}`, axis {axis} ({semantic}): {message}")]
    OffShard {
        feature: String,
        axis: usize,
        semantic: String,
        message: String,
    },
    /// The sample does not fit the plan's rules for this mesh.
    #[error(transparent)]
    Plan(#[from] ResolveError),
    /// A feature the pipeline makes as it lays the blocks out (a key halo), given by the
    /// sample.
    #[error("feature `{feature}`: {rule}, which the pipeline makes beside each block: leave it out of the sample")]
    MadeWithBlocks { feature: String, rule: String },
    /// Blocks given to `assemble` do not match the plan.
    #[error("feature `{feature}`: {message}")]
    Blocks { feature: String, message: String },
    /// A failure inside libtorch, in the tch runtime (a bug if it happens after
    /// validation).
    #[error("feature `{feature}`: torch: {message}")]
    Torch { feature: String, message: String },
    /// As many ranks' items (blocks, headers, paths) as the mesh has ranks were
    /// expected.
    #[error("{given} {what} given for mesh {mesh} of {} ranks", .mesh.ranks())]
    RankCount {
        what: &'static str,
        given: usize,
        mesh: Named,
    },
    /// A rank outside the mesh.
    #[error("rank {rank} is outside mesh {mesh} of {} ranks", .mesh.ranks())]
    NoSuchRank { rank: usize, mesh: Named },
    /// A safetensors header or file could not be written.
    #[error("safetensors: {message}")]
    Safetensors { message: String },
    /// Memory could not be allocated for `what` (a feature's block, a rank's buffer).
    #[error("{what}: cannot allocate {bytes} bytes ({:.2} GB): {message}", *.bytes as f64 / 1e9)]
    Alloc {
        what: String,
        bytes: usize,
        message: String,
    },
    /// A length, count or size a sample or a file gives past a limit.
    #[error("feature `{feature}`: {message}")]
    TooLarge { feature: String, message: String },
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    /// A batch that collate cannot stack (empty, or samples or replicas holding
    /// different features).
    #[error("collate: {message}")]
    Collate { message: String },
    /// A plan this runtime does not execute.
    #[error("{message}")]
    Unsupported { message: String },
}

/// Feature names quoted, the first few of them.
fn quoted(names: &[String]) -> String {
    first_few(names.iter().map(|n| format!("`{n}`")))
}

/// Feature names with the workflows that have them, the first few of them.
fn with_workflows(features: &[(String, Vec<String>)]) -> String {
    first_few(
        features
            .iter()
            .map(|(n, ws)| format!("`{n}` (workflow {})", ws.join(", "))),
    )
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

/// How to declare the value a featurizer writes for "no item", when a negative index
/// is found and none is declared.
fn none_hint(min: i64, none: Option<i64>) -> String {
    match none {
        None if min < 0 => format!(
            " (if {min} names no item, as AlphaFold3's -1 does, declare it: `index: {{..., none: {min}}}`)"
        ),
        _ => String::new(),
    }
}
