//! What a feature's compact block is (its form, dtype and shape), asked by every writer
//! and reader of compact rank files and buffers, and a stored block checked and expanded.

use featshard_spec::ir::{DType, Role};
use featshard_spec::plan::TensorPlan;

use super::entries::entries_fault;
use super::{bits_len, check_range, narrowed, Form, OneHot};
use crate::array::Array;
use crate::dtype;
use crate::error::ExecError;

/// How a block of feature `t` (block shape `block`) is stored and sent compact: its
/// form, and the compact block's dtype and shape; `None` for a feature kept as its
/// block. A sparse block's shape is `[entries, 2]`: the room made for its entries (the
/// most any rank's block holds, or what a stored block holds). Every writer and reader
/// of compact blocks asks this.
pub fn stored_form(
    t: &TensorPlan,
    block: &[usize],
    entries: usize,
) -> Option<(Form, DType, Vec<usize>)> {
    if let Some(oh) = OneHot::of(t, block) {
        return Some((oh.form(), oh.index, oh.compact_shape(block)));
    }
    if t.sparse {
        return Some((Form::Sparse, DType::Int64, vec![entries, 2]));
    }
    if let Some(index) = narrowed(t) {
        return Some((Form::Narrow { index }, index, block.to_vec()));
    }
    // Saturating: a block past memory is refused where it would be made, not here.
    let numel = block.iter().fold(1usize, |n, &k| n.saturating_mul(k));
    matches!(t.role, Role::Mask { .. }).then(|| (Form::Bits, DType::Uint8, vec![bits_len(numel)]))
}

/// The room a stored sparse block makes for entries: the rows it holds.
pub(crate) fn stored_entries(stored: &Array) -> usize {
    stored_entries_of(&stored.shape())
}

/// The room a stored sparse block of shape `shape` makes for entries.
pub(crate) fn stored_entries_of(shape: &[usize]) -> usize {
    shape.first().copied().unwrap_or(0)
}

/// A block of feature `name` stored compact (`stored`, as [`stored_form`] describes it)
/// expanded to its dense block of shape `block`. A stored block of another dtype or
/// shape, or an index that names no class, is refused by name.
pub fn expand_stored(
    name: &str,
    t: &TensorPlan,
    block: &[usize],
    stored: &Array,
) -> Result<Array<'static>, ExecError> {
    let form = check_stored(name, t, block, stored)?;
    // `check_stored` showed the block's bytes addressable; memory may still lack them.
    let bytes = block.iter().product::<usize>() * dtype::size(t.dtype);
    let mut out = crate::alloc::zeroed(&format!("feature `{name}`'s dense block"), bytes)?;
    form.expand_into(stored.contiguous().base_bytes(), t.dtype, block, &mut out);
    Ok(Array::owned(t.dtype, block.to_vec(), out))
}

/// The form of a block of feature `name` stored compact, once `stored` is shown to be
/// one ([`expand_stored`]'s checks), for a caller that expands it into its own memory.
pub fn check_stored(
    name: &str,
    t: &TensorPlan,
    block: &[usize],
    stored: &Array,
) -> Result<Form, ExecError> {
    let fault = |message: String| ExecError::Blocks {
        feature: name.to_owned(),
        message,
    };
    if let Some(message) = block_shape_fault(t, block) {
        return Err(fault(message));
    }
    let (form, dtype, shape) = stored_form(t, block, stored_entries(stored))
        .ok_or_else(|| fault("the spec gives it no compact form".into()))?;
    if stored.dtype() != dtype || stored.shape() != shape {
        return Err(fault(format!(
            "stored compact as {:?} {}, its compact form is {shape:?} {dtype}",
            stored.shape(),
            stored.dtype()
        )));
    }
    if let (Form::Narrow { .. }, Some(range)) = (form, t.range) {
        check_range(name, stored, range)?;
    }
    if form == Form::Sparse {
        let numel = block.iter().product();
        if let Some(message) = entries_fault(stored.contiguous().base_bytes(), numel, t.dtype) {
            return Err(fault(format!("{message} (the file is corrupt)")));
        }
    }
    if let Form::OneHot {
        classes,
        index,
        map,
        ..
    } = form
    {
        if let Some(k) = first_stray(index, stored.contiguous().base_bytes(), classes, map) {
            return Err(fault(format!(
                "a stored index {k} names no class of {classes} (the file is corrupt)"
            )));
        }
    }
    Ok(form)
}

/// The first of the stored indices `packed` (elements of `index`) that is neither one
/// of the `classes` nor the index of none (`classes`; -1 in a one-hot map's blocks).
fn first_stray(index: DType, packed: &[u8], classes: usize, map: bool) -> Option<i64> {
    // Shifted by one in a map, the valid values are exactly those at most `classes`
    // unsigned: checked branch-free a piece at a time, searched only where one fails.
    let shift = i64::from(map);
    let valid = |v: i64| (v.wrapping_add(shift) as u64) <= classes as u64;
    dtype::by_piece(index, packed, |_, wide| {
        match wide.iter().fold(true, |all, &v| all & valid(v)) {
            true => Ok(()),
            false => Err(wide
                .iter()
                .copied()
                .find(|&v| !valid(v))
                .unwrap_or_default()),
        }
    })
    .err()
}

/// Why `block` cannot be a dense block of feature `t`, if it cannot: another rank, a
/// channel axis (a one-hot feature's classes among them) of another size, or more
/// bytes than memory can address.
fn block_shape_fault(t: &TensorPlan, block: &[usize]) -> Option<String> {
    if block.len() != t.axes.len() {
        return Some(format!(
            "a dense block of shape {block:?} has {} axes, the feature {}",
            block.len(),
            t.axes.len()
        ));
    }
    let fixed =
        t.axes.iter().zip(block).enumerate().find(|(_, (a, &n))| {
            a.semantic.is_none() && a.size.is_some_and(|size| size != n as u64)
        });
    if let Some((axis, (a, n))) = fixed {
        return Some(format!(
            "a dense block of shape {block:?} has {n} along channel axis {axis}, declared {}",
            a.size.unwrap_or_default()
        ));
    }
    let bytes = block
        .iter()
        .try_fold(dtype::size(t.dtype), |n, &d| n.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize);
    bytes
        .is_none()
        .then(|| format!("a dense block of shape {block:?} is larger than memory can address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(d: DType, values: &[i64]) -> Vec<u8> {
        let mut out = vec![0; values.len() * dtype::size(d)];
        dtype::write_ints(d, values, &mut out);
        out
    }

    #[test]
    fn a_stray_index_is_found_past_the_first_piece_in_features_and_maps() {
        // Every class and the index of none pass; the first value past them is found,
        // however far into the block, in every index dtype: the values just outside,
        // and the dtype's own ends.
        for map in [false, true] {
            let (none, outside) = if map { (-1, [33, -2]) } else { (33, [34, -1]) };
            let good: Vec<i64> = (0..3000)
                .map(|i| if i % 5 == 0 { none } else { i % 33 })
                .collect();
            for d in [DType::Int16, DType::Int32, DType::Int64] {
                let (lo, hi) = d.int_range().unwrap_or_default();
                assert_eq!(first_stray(d, &packed(d, &good), 33, map), None);
                for stray in outside.into_iter().chain([lo, hi]) {
                    let mut values = good.clone();
                    values[2500] = stray;
                    values[2900] = 40;
                    let found = first_stray(d, &packed(d, &values), 33, map);
                    assert_eq!(found, Some(stray), "{d}, map {map}");
                }
            }
        }
    }
}
