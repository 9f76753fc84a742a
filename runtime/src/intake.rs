//! Intake: a sample as the featurizer emitted it, made into the sample the plan lays
//! out (keys sorted, incoming pads cut, unowned rows dropped, derived features made or
//! checked). The rules run in the byte executor (`featshard_exec::intake`), on views
//! of the tensors' memory; here their result is applied to the tensors.

use std::collections::BTreeMap;

use featshard_exec::files::Sample;
use featshard_spec::plan::Plan;

use crate::error::RuntimeError;
use crate::sample::{Features, Options};
use crate::views::{tensor, views};

/// A sample after intake.
#[derive(Debug)]
pub struct Intake {
    /// Tensor features to lay out (real items only, derived ones added) and the
    /// features carried along untouched.
    pub features: Features,
    /// Names in `features` carried along untouched, sorted.
    pub passthrough: Vec<String>,
    /// Sample keys removed (`drop` or the `other_keys: drop` policy), sorted.
    pub dropped: Vec<String>,
    /// Semantics whose axes arrived longer than their real items: the arrived length.
    pub arrived: BTreeMap<String, usize>,
    /// Owner-map rows without an owner dropped as pads, per semantic.
    pub unowned: BTreeMap<String, usize>,
}

/// Runs intake on one serial sample (see the module documentation).
pub fn intake(plan: &Plan, features: &Features, opts: &Options) -> Result<Intake, RuntimeError> {
    let seen = views(plan, features)?;
    let taken = featshard_exec::intake::intake(plan, &seen, opts)?;
    to_tensors(taken, features, &seen)
}

/// The executor's intake applied to the tensors it viewed.
fn to_tensors(
    taken: featshard_exec::intake::Intake,
    features: &Features,
    seen: &Sample,
) -> Result<Intake, RuntimeError> {
    let mut out = Features::new();
    for (name, a) in &taken.features {
        let x = match taken.passthrough.contains(name) {
            true => features[name].shallow_clone(),
            false => tensor(name, a, features.get(name).zip(seen.get(name)))?,
        };
        out.insert(name.clone(), x);
    }
    Ok(Intake {
        features: out,
        passthrough: taken.passthrough,
        dropped: taken.dropped,
        arrived: taken.arrived,
        unowned: taken.unowned,
    })
}
