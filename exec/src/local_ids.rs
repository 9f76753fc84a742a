//! Shard-local index values (`Remap::ShardLocal`) on a whole block, both ways: the start
//! of the holding shard taken off every real entry (padded layout -> shard-local) or
//! added back (the way back). Pads keep the pad value. Blocks written from a placed
//! sample shift as they copy ([`crate::blocks`]); this is for a block that already
//! exists, as a rank holds it or as a view of the padded layout cuts it.

use featshard_spec::plan::{Remap, SampleLayout, TensorPlan};
use featshard_spec::Coord;

use crate::dtype;
use crate::error::ExecError;

/// Which way a block's ids move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the padded layout to ids local to the holding shard.
    ToLocal,
    /// From shard-local ids back to the padded layout.
    ToPadded,
}

/// Moves the ids of `name`'s block at CP coordinate `coord` (row-major `bytes` of shape
/// `local`) in `direction`; a feature without shard-local ids is left as it is.
pub fn shift(
    name: &str,
    t: &TensorPlan,
    layout: &SampleLayout,
    local: &[usize],
    coord: Coord,
    bytes: &mut [u8],
    direction: Direction,
) -> Result<(), ExecError> {
    let Remap::ShardLocal { of, mesh_axis } = &t.remap else {
        return Ok(());
    };
    let start = layout
        .shard_start(of, *mesh_axis, coord)
        .ok_or_else(|| ExecError::Blocks {
            feature: name.to_owned(),
            message: format!("the layout has no length for `{of}`"),
        })? as i64;
    let by = match direction {
        Direction::ToLocal => -start,
        Direction::ToPadded => start,
    };
    let es = dtype::size(t.dtype);
    if bytes.len() != local.iter().product::<usize>() * es {
        return Err(ExecError::Blocks {
            feature: name.to_owned(),
            message: format!(
                "a block of {} bytes is not one of shape {local:?} ({})",
                bytes.len(),
                t.dtype
            ),
        });
    }
    let window = t.block_window(local, coord);
    let real: Vec<Vec<bool>> = t
        .axes
        .iter()
        .zip(&window)
        .map(|(a, &(at, n))| real_positions(layout, a.semantic.as_deref(), at, n))
        .collect();
    let none = crate::placed::index_none(t);
    let mut buf = Vec::with_capacity(es);
    for_each_index(local, |flat, idx| {
        if idx.iter().zip(&real).all(|(&i, r)| r[i]) {
            let at = flat * es;
            let v = dtype::read_i64(t.dtype, &bytes[at..at + es]);
            // The none value names no item: it stays none.
            let id = if Some(v) == none { v } else { v + by };
            buf.clear();
            dtype::encode_i64(t.dtype, id, &mut buf);
            bytes[at..at + es].copy_from_slice(&buf);
        }
    });
    Ok(())
}

/// Which padded positions `at..at + n` of an axis of `semantic` hold a real item.
fn real_positions(layout: &SampleLayout, semantic: Option<&str>, at: usize, n: usize) -> Vec<bool> {
    let Some(s) = semantic else {
        return vec![true; n];
    };
    match layout.positions.get(s) {
        Some(pos) => {
            let mut real = vec![false; n];
            pos.iter()
                .filter(|&&p| p >= at && p < at + n)
                .for_each(|&p| real[p - at] = true);
            real
        }
        None => {
            let len = layout.sizes.get(s).copied().unwrap_or(0);
            (at..at + n).map(|g| g < len).collect()
        }
    }
}

/// Calls `f(flat, index)` for every index of `shape`, in row-major order.
pub(crate) fn for_each_index(shape: &[usize], mut f: impl FnMut(usize, &[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for flat in 0..n {
        f(flat, &idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}
