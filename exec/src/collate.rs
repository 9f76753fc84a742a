//! Collate's plan, for every adapter that stacks a DP replica's samples (the tch
//! runtime's `collate`, the Python package's): the samples of a batch must hold the same
//! features, the replicas agree in one all-reduce of max over a frame whose length the
//! plan fixes (which tensor features each replica holds and lacks, and the longest
//! length of each of their axes), and the reduced frame gives every feature's target
//! local shape or the one error every rank raises.

use std::collections::BTreeMap;

use featshard_spec::plan::Plan;

use crate::error::ExecError;

/// What one DP replica reduces, and reads back reduced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollateFrame {
    /// The features this replica's batch holds, sorted.
    pub names: Vec<String>,
    /// The frame to all-reduce by max over the DP group: per tensor feature of the plan,
    /// 1 where held; then 1 where lacking; then per axis of each, its longest length in
    /// this replica's batch (0 where lacking).
    pub frame: Vec<i64>,
}

/// The frame of a replica whose batch holds `samples`: each sample's blocks' local
/// shapes, by feature name. Samples holding different features are refused.
pub fn collate_frame(
    plan: &Plan,
    samples: &[BTreeMap<String, Vec<usize>>],
) -> Result<CollateFrame, ExecError> {
    let Some(first) = samples.first() else {
        return Err(collate_error("empty batch".into()));
    };
    let names: Vec<String> = first.keys().cloned().collect();
    if let Some((i, s)) = samples
        .iter()
        .enumerate()
        .find(|(_, s)| !s.keys().eq(names.iter()))
    {
        return Err(collate_error(format!(
            "the samples of a batch hold different features: sample 0 has {names:?}, sample {i} has {:?}",
            s.keys().collect::<Vec<_>>()
        )));
    }
    let tensors: Vec<(&str, usize)> = plan.tensors().map(|(n, t)| (n, t.axes.len())).collect();
    let held = |n: &str| first.contains_key(n);
    let mut frame: Vec<i64> = tensors.iter().map(|&(n, _)| i64::from(held(n))).collect();
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

/// Every held feature's target local shape from the frame reduced by max over the DP
/// group; the error every rank raises where the replicas hold different features.
pub fn collate_targets(
    plan: &Plan,
    frame: &CollateFrame,
    reduced: &[i64],
) -> Result<BTreeMap<String, Vec<usize>>, ExecError> {
    let tensors: Vec<(&str, usize)> = plan.tensors().map(|(n, t)| (n, t.axes.len())).collect();
    let n = tensors.len();
    if reduced.len() != frame.frame.len() {
        return Err(collate_error(format!(
            "a reduced frame of {} values for a frame of {}",
            reduced.len(),
            frame.frame.len()
        )));
    }
    let differ: Vec<String> = tensors
        .iter()
        .enumerate()
        .filter(|&(i, _)| reduced[i] > 0 && reduced[n + i] > 0)
        .map(|(_, (name, _))| format!("`{name}`"))
        .collect();
    if !differ.is_empty() {
        return Err(collate_error(format!(
            "DP replicas hold different features: {} absent on some replicas",
            differ.join(", ")
        )));
    }
    let mut at = 2 * n;
    let mut targets = BTreeMap::new();
    for (name, rank) in tensors {
        let lengths = &reduced[at..at + rank];
        at += rank;
        if frame.names.iter().any(|h| h == name) {
            let shape = lengths.iter().map(|&l| usize::try_from(l).unwrap_or(0));
            targets.insert(name.to_owned(), shape.collect());
        }
    }
    Ok(targets)
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

    fn max(frames: &[&CollateFrame]) -> Vec<i64> {
        (0..frames[0].frame.len())
            .map(|i| frames.iter().map(|f| f.frame[i]).max().unwrap_or(0))
            .collect()
    }

    #[test]
    fn replicas_agree_on_the_longest_shape_of_every_feature_they_hold() {
        let plan = plan();
        let one = collate_frame(&plan, &[sample(4, Some(4)), sample(6, Some(6))]).unwrap();
        let two = collate_frame(&plan, &[sample(5, Some(5))]).unwrap();
        let reduced = max(&[&one, &two]);
        let targets = collate_targets(&plan, &one, &reduced).unwrap();
        assert_eq!(targets["a"], vec![6, 3]);
        assert_eq!(targets["b"], vec![6]);
        assert_eq!(collate_targets(&plan, &two, &reduced).unwrap(), targets);
    }

    #[test]
    fn replicas_or_samples_holding_different_features_are_refused_by_name() {
        let plan = plan();
        let one = collate_frame(&plan, &[sample(4, Some(4))]).unwrap();
        let two = collate_frame(&plan, &[sample(5, None)]).unwrap();
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
        let e = collate_frame(&plan, &[sample(4, Some(4)), sample(4, None)]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("collate: the samples of a batch hold different features"),
            "{e}"
        );
        assert_eq!(
            collate_frame(&plan, &[]).unwrap_err().to_string(),
            "collate: empty batch"
        );
    }
}
