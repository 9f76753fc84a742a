//! Collate's plan, for every adapter that stacks a DP replica's samples (the tch
//! runtime's `collate`, the Python package's): the samples of a batch must hold the same
//! keys, the replicas agree in one all-reduce of max over a frame whose length the
//! plan fixes (whether a replica failed, its batch size, which tensor features it holds
//! and lacks, and the longest length of each of their axes), and the reduced frame
//! gives every feature's target local shape, or the one error every rank raises. A
//! replica whose batch is refused still takes part ([`failed_frame`]), so that no
//! replica waits for it: the ranks then exchange status frames (`crate::agree`).

use std::collections::BTreeMap;

use featshard_spec::ir::PadValue;
use featshard_spec::plan::{Plan, Spread};

use crate::error::ExecError;

/// What one DP replica reduces, and reads back reduced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollateFrame {
    /// The features this replica's batch holds, sorted.
    pub names: Vec<String>,
    /// The frame to all-reduce by max over the DP group: 1 if this replica failed; its
    /// batch size and its negation; per tensor feature of the plan, 1 where held; then 1
    /// where lacking; then per axis of each, its longest length in this replica's batch
    /// (0 where lacking).
    pub frame: Vec<i64>,
}

/// Where the per-feature part of a frame starts.
const HEAD: usize = 3;

/// A value of a sample that is not a block: a tensor's dtype and shape (stacked by
/// collate), or `None` (collected in a list).
pub type Other = Option<(String, Vec<usize>)>;

/// A sample's values that are not blocks (metadata, passed-through values), by name.
pub type Others = BTreeMap<String, Other>;

/// The frame of a replica whose batch holds `samples` (each sample's blocks' local
/// shapes, by feature name) and `others` (each sample's other values). Refused by name:
/// an empty batch, a block the spec does not declare, samples holding different keys,
/// and tensors that cannot be stacked.
pub fn collate_frame(
    plan: &Plan,
    samples: &[BTreeMap<String, Vec<usize>>],
    others: &[Others],
) -> Result<CollateFrame, ExecError> {
    check_batch(plan, samples, others)?;
    let first = &samples[0];
    let names: Vec<String> = first.keys().cloned().collect();
    let tensors: Vec<(&str, usize)> = plan.tensors().map(|(n, t)| (n, t.axes.len())).collect();
    let held = |n: &str| first.contains_key(n);
    let batch = i64::try_from(samples.len()).unwrap_or(i64::MAX);
    let mut frame = vec![0, batch, -batch];
    frame.extend(tensors.iter().map(|&(n, _)| i64::from(held(n))));
    frame.extend(tensors.iter().map(|&(n, _)| i64::from(!held(n))));
    for &(name, rank) in &tensors {
        for d in 0..rank {
            let longest = samples
                .iter()
                .filter_map(|s| s.get(name)?.get(d).copied())
                .max()
                .unwrap_or(0);
            frame.push(i64::try_from(longest).unwrap_or(i64::MAX));
        }
    }
    Ok(CollateFrame { names, frame })
}

/// The frame of a replica whose batch was refused: it fails the reduction everywhere.
pub fn failed_frame(plan: &Plan) -> CollateFrame {
    let mut frame = vec![0i64; frame_len(plan)];
    frame[0] = 1;
    CollateFrame {
        names: Vec::new(),
        frame,
    }
}

fn frame_len(plan: &Plan) -> usize {
    HEAD + plan.tensors().map(|(_, t)| 2 + t.axes.len()).sum::<usize>()
}

/// The batch's own checks, before any frame is made.
fn check_batch(
    plan: &Plan,
    samples: &[BTreeMap<String, Vec<usize>>],
    others: &[Others],
) -> Result<(), ExecError> {
    let Some(first) = samples.first() else {
        return Err(collate_error("empty batch".into()));
    };
    if others.len() != samples.len() {
        return Err(collate_error(format!(
            "{} samples' blocks but {} samples' other values",
            samples.len(),
            others.len()
        )));
    }
    for (i, s) in samples.iter().enumerate() {
        if let Some(name) = s.keys().find(|n| plan.tensor(n).is_none()) {
            return Err(collate_error(format!(
                "sample {i} holds a DTensor `{name}`, which the spec `{}` does not place (a sample of another spec?)",
                plan.module
            )));
        }
        if !s.keys().eq(first.keys()) {
            return Err(collate_error(format!(
                "the samples of a batch hold different features: sample 0 has {:?}, sample {i} has {:?}",
                first.keys().collect::<Vec<_>>(),
                s.keys().collect::<Vec<_>>()
            )));
        }
    }
    for (i, o) in others.iter().enumerate() {
        if let Some(key) = o.keys().find(|k| !others[0].contains_key(*k)) {
            return Err(collate_error(format!(
                "sample {i} holds `{key}`, sample 0 does not: the samples of a batch hold the same keys"
            )));
        }
        if let Some(key) = others[0].keys().find(|k| !o.contains_key(*k)) {
            return Err(collate_error(format!(
                "sample 0 holds `{key}`, sample {i} does not: the samples of a batch hold the same keys"
            )));
        }
        for (key, value) in o {
            if value != &others[0][key] {
                return Err(collate_error(format!(
                    "`{key}` cannot be stacked: sample 0 holds {}, sample {i} holds {}",
                    describe(&others[0][key]),
                    describe(value)
                )));
            }
        }
    }
    Ok(())
}

fn describe(value: &Other) -> String {
    match value {
        Some((dtype, shape)) => format!("a {dtype} tensor of shape {shape:?}"),
        None => "a value that is not a tensor".into(),
    }
}

/// Every held feature's target local shape from the frame reduced by max over the DP
/// group; `None` when a replica failed (the ranks then exchange status frames); the
/// error every rank raises where the replicas' batches differ in size or features.
pub fn collate_targets(
    plan: &Plan,
    frame: &CollateFrame,
    reduced: &[i64],
) -> Result<Option<BTreeMap<String, Vec<usize>>>, ExecError> {
    let tensors: Vec<(&str, usize)> = plan.tensors().map(|(n, t)| (n, t.axes.len())).collect();
    let n = tensors.len();
    if reduced.len() != frame.frame.len() || reduced.len() != frame_len(plan) {
        return Err(collate_error(format!(
            "a reduced frame of {} values for a frame of {}",
            reduced.len(),
            frame.frame.len()
        )));
    }
    if reduced[0] != 0 {
        return Ok(None);
    }
    let (most, least) = (reduced[1], reduced[2].wrapping_neg());
    if most != least {
        return Err(collate_error(format!(
            "DP replicas collate batches of different sizes, from {least} to {most} samples: every replica collates as many (the DP sampler gives every replica as many samples; batch them alike)"
        )));
    }
    let differ: Vec<String> = tensors
        .iter()
        .enumerate()
        .filter(|&(i, _)| reduced[HEAD + i] > 0 && reduced[HEAD + n + i] > 0)
        .map(|(_, (name, _))| format!("`{name}`"))
        .collect();
    if !differ.is_empty() {
        return Err(collate_error(format!(
            "DP replicas hold different features: {} absent on some replicas",
            differ.join(", ")
        )));
    }
    let mut at = HEAD + 2 * n;
    let mut targets = BTreeMap::new();
    for (name, rank) in tensors {
        let lengths = &reduced[at..at + rank];
        at += rank;
        if frame.names.iter().any(|h| h == name) {
            let shape = lengths.iter().map(|&l| usize::try_from(l).unwrap_or(0));
            targets.insert(name.to_owned(), shape.collect());
        }
    }
    Ok(Some(targets))
}

/// How one sample's block of a feature joins its collated batch, stated as data for a
/// tensor executor (the tch runtime's collate, the Python package's) to apply on the
/// block's own device: index values re-padded first, then the block written at the
/// start of a `target`-shaped block of `pad` values (each shard's items keep their
/// place and gain pads at its end).
#[derive(Clone, Debug, PartialEq)]
pub struct Join {
    /// The batch's agreed local shape of the feature.
    pub target: Vec<usize>,
    /// The pad value around the sample's block.
    pub pad: PadValue,
    /// `(old, new)` for an index into an owner-partitioned layout whose per-block stride
    /// grows from `old` to `new` in the batch: every value `v >= 0` becomes
    /// `(v / old) * new + v % old` (`featshard_spec::layout::repad_index`); negative
    /// values (pads of index lists) stay. `None`: values stay.
    pub repad: Option<(usize, usize)>,
    /// Whole axes holding a sharded semantic's padded layout (a map's global columns on
    /// one CP axis): along each, the block's `k` runs of `old` items are written at the
    /// starts of the target's `k` runs of `new` (`Plan::collate_spreads`). Other axes
    /// keep the block at their start.
    pub spread: Vec<Spread>,
}

/// The [`Join`] of feature `name`'s block in a sample whose blocks have the local shapes
/// `local`, into a batch whose agreed local shapes are `targets` ([`collate_targets`]);
/// a block larger than its target, or of another rank, is refused by name.
pub fn join(
    plan: &Plan,
    name: &str,
    local: &BTreeMap<String, Vec<usize>>,
    targets: &BTreeMap<String, Vec<usize>>,
) -> Result<Join, ExecError> {
    let t = crate::feature::tensor_plan(plan, name)?;
    let (Some(shape), Some(target)) = (local.get(name), targets.get(name)) else {
        return Err(collate_error(format!(
            "feature `{name}`: no block or no agreed shape in this batch"
        )));
    };
    let fits = shape.len() == target.len() && shape.iter().zip(target).all(|(a, b)| a <= b);
    if !fits {
        return Err(collate_error(format!(
            "feature `{name}`: a block of shape {shape:?} does not fit the batch's {target:?}"
        )));
    }
    let repad = plan
        .repad_strides(name, pairs(local), pairs(targets))
        .filter(|&(old, new)| old > 0 && old != new);
    let spread = plan.collate_spreads(name, local, targets);
    for s in &spread {
        let (n, to) = (shape[s.axis], target[s.axis]);
        if n % s.old != 0 || (n / s.old).checked_mul(s.new).is_none_or(|m| m > to) {
            return Err(collate_error(format!(
                "feature `{name}`: axis {} holds {n} items, not whole blocks of {} that grow to {} within the batch's {to}",
                s.axis, s.old, s.new
            )));
        }
    }
    Ok(Join {
        target: target.clone(),
        pad: t.pad_value,
        repad,
        spread,
    })
}

/// Shapes by name, as the plan's shape lookups take them.
fn pairs(m: &BTreeMap<String, Vec<usize>>) -> impl Iterator<Item = (&str, &[usize])> {
    m.iter().map(|(n, v)| (n.as_str(), v.as_slice()))
}

fn collate_error(message: String) -> ExecError {
    ExecError::Collate { message }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        let spec = "version: 1\nmodule: m\nmesh: {cp: [cp0, cp1], dp: dp}\n\
            semantics: {tokens: {shard: true}}\n\
            features:\n  a: {axes: [tokens, 3], dtype: float32}\n  \
            b: {axes: [tokens], dtype: int64, optional: true}\n";
        featshard_spec::compile_str("m.yaml", spec).expect("spec").1
    }

    fn sample(a: usize, b: Option<usize>) -> BTreeMap<String, Vec<usize>> {
        let mut s = BTreeMap::from([("a".to_owned(), vec![a, 3])]);
        if let Some(b) = b {
            s.insert("b".to_owned(), vec![b]);
        }
        s
    }

    /// The frame of blocks alone (no other values).
    fn frame(
        plan: &Plan,
        samples: &[BTreeMap<String, Vec<usize>>],
    ) -> Result<CollateFrame, ExecError> {
        collate_frame(plan, samples, &vec![Others::new(); samples.len()])
    }

    fn max(frames: &[&CollateFrame]) -> Vec<i64> {
        (0..frames[0].frame.len())
            .map(|i| frames.iter().map(|f| f.frame[i]).max().unwrap_or(0))
            .collect()
    }

    #[test]
    fn replicas_agree_on_the_longest_shape_of_every_feature_they_hold() {
        let plan = plan();
        let one = frame(&plan, &[sample(4, Some(4)), sample(6, Some(6))]).unwrap();
        let two = frame(&plan, &[sample(5, Some(5)), sample(5, Some(5))]).unwrap();
        let reduced = max(&[&one, &two]);
        let targets = collate_targets(&plan, &one, &reduced).unwrap().unwrap();
        assert_eq!(targets["a"], vec![6, 3]);
        assert_eq!(targets["b"], vec![6]);
        assert_eq!(
            collate_targets(&plan, &two, &reduced).unwrap(),
            Some(targets)
        );
    }

    #[test]
    fn replicas_or_samples_holding_different_features_are_refused_by_name() {
        let plan = plan();
        let one = frame(&plan, &[sample(4, Some(4))]).unwrap();
        let two = frame(&plan, &[sample(5, None)]).unwrap();
        let reduced = max(&[&one, &two]);
        for frame in [&one, &two] {
            let e = collate_targets(&plan, frame, &reduced)
                .unwrap_err()
                .to_string();
            assert_eq!(
                e,
                "collate: DP replicas hold different features: `b` absent on some replicas"
            );
        }
        let e = frame(&plan, &[sample(4, Some(4)), sample(4, None)]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("collate: the samples of a batch hold different features"),
            "{e}"
        );
        assert_eq!(
            frame(&plan, &[]).unwrap_err().to_string(),
            "collate: empty batch"
        );
        let foreign = BTreeMap::from([("pair".to_owned(), vec![2, 2])]);
        let e = frame(&plan, &[foreign]).unwrap_err().to_string();
        assert!(
            e.contains("holds a DTensor `pair`, which the spec `m` does not place"),
            "{e}"
        );
    }

    #[test]
    fn replicas_of_different_batch_sizes_are_every_ranks_error() {
        let plan = plan();
        let one = frame(&plan, &[sample(4, Some(4)), sample(4, Some(4))]).unwrap();
        let two = frame(&plan, &[sample(4, Some(4))]).unwrap();
        let reduced = max(&[&one, &two]);
        for f in [&one, &two] {
            let e = collate_targets(&plan, f, &reduced).unwrap_err().to_string();
            assert!(
                e.contains("batches of different sizes, from 1 to 2 samples"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_failed_replica_fails_the_reduction_everywhere() {
        let plan = plan();
        let ok = frame(&plan, &[sample(4, Some(4))]).unwrap();
        let failed = failed_frame(&plan);
        assert_eq!(failed.frame.len(), ok.frame.len());
        let reduced = max(&[&ok, &failed]);
        assert_eq!(collate_targets(&plan, &ok, &reduced).unwrap(), None);
        assert_eq!(collate_targets(&plan, &failed, &reduced).unwrap(), None);
    }

    #[test]
    fn other_values_must_be_the_same_keys_and_stackable() {
        let plan = plan();
        let tensor = |shape: Vec<usize>| Some(("float32".to_owned(), shape));
        let others = |v: Vec<(&str, Other)>| -> Others {
            v.into_iter().map(|(k, x)| (k.to_owned(), x)).collect()
        };
        let two = [sample(4, None), sample(4, None)];
        let ok = vec![others(vec![("t", tensor(vec![2])), ("m", None)]); 2];
        assert!(collate_frame(&plan, &two, &ok).is_ok());
        let later = [others(vec![]), others(vec![("m", None)])];
        let e = collate_frame(&plan, &two, &later).unwrap_err().to_string();
        assert!(e.contains("sample 1 holds `m`, sample 0 does not"), "{e}");
        let shapes = [
            others(vec![("t", tensor(vec![2]))]),
            others(vec![("t", tensor(vec![3]))]),
        ];
        let e = collate_frame(&plan, &two, &shapes).unwrap_err().to_string();
        assert!(e.contains("`t` cannot be stacked: sample 0 holds a float32 tensor of shape [2], sample 1 holds a float32 tensor of shape [3]"), "{e}");
    }

    /// A sample's block joins its batch at the agreed shape with the feature's pad
    /// value; an index into an owner-partitioned layout is re-padded by the stride of
    /// the semantic it points into, other features are not; a block that outgrows its
    /// target is refused by name.
    #[test]
    fn a_join_pads_to_the_target_and_repads_indices_into_owner_layouts() {
        let spec = "version: 1\nmodule: t\nmesh: {cp: [cp0, cp1]}\n\
            semantics:\n  tokens: {shard: true}\n  \
            atoms: {shard: true, owner: tokens, counts: atoms_per_token}\n\
            features:\n  atoms_per_token: {axes: [tokens], dtype: int64}\n  \
            coords: {axes: [atoms, 3], dtype: float32, pad: -1.0}\n  \
            frames: {axes: [tokens, 3], dtype: int64, pad: -1, index: {of: atoms, scope: padded_global}}\n";
        let plan = featshard_spec::compile_str("t.yaml", spec).expect("spec").1;
        let shapes = |t: usize, a: usize| {
            BTreeMap::from([
                ("atoms_per_token".to_owned(), vec![t]),
                ("coords".to_owned(), vec![a, 3]),
                ("frames".to_owned(), vec![t, 3]),
            ])
        };
        let (local, target) = (shapes(4, 12), shapes(5, 16));
        let frames = join(&plan, "frames", &local, &target).expect("frames");
        assert_eq!(frames.target, vec![5, 3]);
        assert_eq!(frames.repad, Some((12, 16)));
        assert_eq!(frames.pad, PadValue::Int(-1));
        let coords = join(&plan, "coords", &local, &target).expect("coords");
        assert_eq!((coords.repad, coords.pad), (None, PadValue::Float(-1.0)));
        // The same strides: nothing to re-pad.
        assert_eq!(join(&plan, "frames", &target, &target).unwrap().repad, None);
        let e = join(&plan, "coords", &target, &local)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("feature `coords`") && e.contains("[16, 3]"),
            "{e}"
        );
    }

    /// In serial order (one CP axis) every block of tokens and atoms grows at its end, so
    /// global ids of either move with their blocks, and a map's whole column axis is
    /// re-laid out block by block; a shard-local id and a block's own axes stay.
    #[test]
    fn a_join_on_one_axis_repads_global_ids_and_spreads_whole_axes() {
        let spec = "version: 1\nmodule: t\nmesh: {cp: [cp], dp: dp}\n\
            semantics:\n  tokens: {shard: true}\n  \
            atoms: {shard: true, owner: tokens, map: map}\n\
            features:\n  \
            map: {axes: [atoms, tokens], dtype: int64, coshard: [{axis: 1, follows: 0}], index: {of: tokens, scope: shard_local, one_hot: 1}}\n  \
            tok: {axes: [atoms], dtype: int64, index: {of: tokens, scope: padded_global}}\n  \
            token_index: {axes: [tokens], dtype: int64}\n";
        let plan = featshard_spec::compile_str("t.yaml", spec).expect("spec").1;
        // 7 tokens on cp 2 (blocks of 4), 17 atoms (blocks of 10); a batch of 5 and 12.
        let shapes = |t: usize, a: usize, cp: usize| {
            BTreeMap::from([
                ("map".to_owned(), vec![a, t * cp]),
                ("tok".to_owned(), vec![a]),
                ("token_index".to_owned(), vec![t]),
            ])
        };
        let (local, target) = (shapes(4, 10, 2), shapes(5, 12, 2));
        let tok = join(&plan, "tok", &local, &target).expect("tok");
        assert_eq!((tok.repad, tok.spread.as_slice()), (Some((4, 5)), &[][..]));
        let map = join(&plan, "map", &local, &target).expect("map");
        assert_eq!(map.repad, None);
        assert_eq!(
            map.spread,
            vec![Spread {
                axis: 1,
                old: 4,
                new: 5
            }]
        );
        let index = join(&plan, "token_index", &local, &target).expect("token_index");
        assert_eq!((index.repad, index.spread.len()), (None, 0));
    }
}
