//! What a sample's features weigh as `explain` counts them: the lengths `--lengths`
//! gives (owned items spread evenly over their owners), and each feature's bytes dense
//! and in its compact form.

use featshard_exec::compact::{stored_form, Form};
use featshard_spec::plan::{Lengths, Padding, Plan, TensorPlan};

use crate::commands::Failure;

/// The lengths `--lengths` gives, refused by name for a semantic the spec lacks; owned
/// items are spread evenly over their root owners (said in `notes`).
pub(crate) fn explain_lengths(
    plan: &Plan,
    given: &[(String, usize)],
    notes: &mut Vec<String>,
) -> Result<Lengths, Failure> {
    let mut l = Lengths::default();
    for (k, v) in given {
        if !plan.semantics.contains_key(k) {
            return Err(Failure::Other(format!(
                "--lengths: semantic `{k}` is not declared in the spec"
            )));
        }
        l.sizes.insert(k.clone(), *v);
    }
    // Owner counts are per sample; explain spreads items evenly over their root owners.
    for (name, s) in &plan.semantics {
        let Padding::OwnerBlocks { root, .. } = &s.padding else {
            continue;
        };
        if !l.sizes.contains_key(name) || !l.sizes.contains_key(root) {
            continue;
        }
        l.counts
            .insert(name.clone(), featshard_spec::plan::RootCounts::Even);
        notes.push(format!(
            "{name} assumed spread evenly over {root}; real samples pad to their largest block"
        ));
    }
    Ok(l)
}

/// A feature's bytes at its padded global shape, dense and in its compact form (a
/// one-hot feature or map as indices, a mask as bits, a ranged feature narrowed; the
/// others as they are). A sparse feature's compact bytes depend on its values: `None`.
/// Counted in `u128`, saturating: `explain` takes any length, and a count past memory
/// is shown as large, never wrapped to a small one.
pub(crate) fn feature_bytes(t: &TensorPlan, global: &[usize]) -> (u128, Option<u128>) {
    let bytes = |shape: &[usize], d| {
        shape
            .iter()
            .fold(featshard_exec::dtype::size(d) as u128, |n, &k| {
                n.saturating_mul(k as u128)
            })
    };
    let dense = bytes(global, t.dtype);
    let compact = match stored_form(t, global, 0) {
        Some((Form::Sparse, _, _)) => None,
        Some((_, d, shape)) => Some(bytes(&shape, d)),
        None => Some(dense),
    };
    (dense, compact)
}

/// The bytes of features at these shapes: dense, compact (sparse features left out, their
/// bytes depend on values) and how many sparse features there are.
pub(crate) fn total_bytes<'a>(
    plan: &Plan,
    shapes: impl Iterator<Item = (&'a str, &'a [usize])>,
) -> (u128, u128, usize) {
    let (mut dense, mut compact, mut sparse) = (0u128, 0u128, 0usize);
    for (name, shape) in shapes {
        let Some(t) = plan.tensor(name) else { continue };
        let (d, c) = feature_bytes(t, shape);
        dense = dense.saturating_add(d);
        match c {
            Some(c) => compact = compact.saturating_add(c),
            None => sparse += 1,
        }
    }
    (dense, compact, sparse)
}
