//! A key halo (`derive: {halo: {of, size}}`) laid out: for every shard of the windowed
//! first axis of `of`, the `size` rows of the padded layout before the shard's block and
//! the `size` rows after it (the feature's pads where they are, the halo's past either
//! end), one halo per shard, in shard order.
//! Each rank's block of it is its own halo; every number is the plan's.

use std::collections::BTreeMap;

use featshard_spec::ir::{DType, DeriveRule, PadValue};
use featshard_spec::plan::{FeatureShapes, Plan, SampleLayout};

use crate::array::Array;
use crate::assemble::blocks_error;
use crate::dtype;
use crate::error::ExecError;
use crate::feature::tensor_plan;

/// Halo `name` of the placed features `arrays` (index values already in the padded
/// layout), as its padded layout (`shapes[name]`).
pub(crate) fn halo(
    plan: &Plan,
    name: &str,
    layout: &SampleLayout,
    shapes: &BTreeMap<String, FeatureShapes>,
    arrays: &BTreeMap<String, Array>,
) -> Result<Array<'static>, ExecError> {
    let t = tensor_plan(plan, name)?;
    let Some(DeriveRule::Halo { of, size }) = &t.derived else {
        return Err(ExecError::Missing {
            feature: name.to_owned(),
        });
    };
    let missing = |f: &str| ExecError::Missing {
        feature: f.to_owned(),
    };
    let source = tensor_plan(plan, of)?;
    let x = arrays.get(of).ok_or_else(|| missing(of))?.contiguous();
    let (of_shapes, own) = (shapes.get(of).ok_or_else(|| missing(of))?, shapes.get(name));
    let own = own.ok_or_else(|| missing(name))?;
    let (Some(&padded), Some(&halo_rows), true) = (
        of_shapes.padded_shape.first(),
        own.padded_shape.first(),
        x.dim() > 0,
    ) else {
        return Err(blocks_error(
            name,
            format!("`{of}` has no first axis to take a halo of"),
        ));
    };
    // One halo per shard of the axis, as the plan's shapes say, every shard's block as
    // long (an empty axis: empty blocks, halos of pads).
    let shards = halo_rows / (2 * size).max(1);
    let block = padded.checked_div(shards).unwrap_or(0);
    let positions = source
        .axes
        .first()
        .and_then(|a| a.semantic.as_ref())
        .and_then(|s| layout.positions.get(s));
    let row_at = RowAt::new(name, positions.map(Vec::as_slice), x.shape()[0], padded)?;
    let es = dtype::size(t.dtype);
    let row = own.padded_shape[1..].iter().product::<usize>() * es;
    let rows = dense_rows(
        t.dtype,
        &x,
        source.one_hot,
        own.padded_shape.last().copied(),
    );
    if rows.len() != x.shape()[0] * row {
        return Err(blocks_error(
            name,
            format!("`{of}`'s rows are not the halo's"),
        ));
    }
    // A pad item inside the axis is the feature's pad, as the neighbour's block holds it;
    // past either end of the axis, the halo's own.
    let inside = dtype::pad_bytes(t.dtype, source.pad_value).repeat(row / es.max(1));
    let outside = dtype::pad_bytes(t.dtype, t.pad_value).repeat(row / es.max(1));
    let whole = own
        .padded_shape
        .iter()
        .product::<usize>()
        .saturating_mul(es);
    let rows_fit = shards
        .checked_mul(2 * size)
        .and_then(|n| n.checked_mul(row))
        == Some(whole);
    if block.checked_mul(shards) != Some(padded) || !rows_fit {
        return Err(blocks_error(
            name,
            format!(
                "its shape {:?} is not 2 x {size} rows of `{of}` per shard",
                own.padded_shape
            ),
        ));
    }
    let mut out = crate::alloc::with_capacity(name, whole, 1)?;
    for r in 0..shards {
        let (start, end) = (r * block, (r + 1) * block);
        let before = (start as i128 - *size as i128)..start as i128;
        for p in before.chain(end as i128..(end + size) as i128) {
            match usize::try_from(p).ok().filter(|&p| p < padded) {
                Some(p) => match row_at.get(p) {
                    Some(i) => out.extend_from_slice(&rows[i * row..(i + 1) * row]),
                    None => out.extend_from_slice(&inside),
                },
                None => out.extend_from_slice(&outside),
            }
        }
    }
    Ok(Array::owned(t.dtype, own.padded_shape.clone(), out))
}

/// The rows of `x` in `dtype`: a feature given narrow (a mask as bool, ranged integers)
/// widened, as its blocks are; a one-hot feature given as its indices (one axis short)
/// expanded to its one-hot rows, `width` wide (a negative index: a row of none).
fn dense_rows(dtype: DType, x: &Array, one_hot: Option<usize>, width: Option<usize>) -> Vec<u8> {
    let es = dtype::size(dtype);
    match (one_hot, width) {
        (Some(axis), Some(width)) if axis == x.dim() => {
            let mut out = Vec::with_capacity(x.numel() * width * es);
            let (zero, one) = (
                dtype::pad_bytes(dtype, PadValue::Int(0)),
                dtype::pad_bytes(dtype, PadValue::Int(1)),
            );
            let xes = dtype::size(x.dtype());
            for b in x.base_bytes().chunks_exact(xes) {
                let v = dtype::read_i64(x.dtype(), b);
                for c in 0..width {
                    out.extend_from_slice(if v == c as i64 { &one } else { &zero });
                }
            }
            out
        }
        _ if x.dtype() == dtype => x.base_bytes().to_vec(),
        _ => {
            let mut wide = vec![0u8; x.numel() * es];
            dtype::cast(x.dtype(), x.base_bytes(), dtype, &mut wide);
            wide
        }
    }
}

/// The serial row at a padded position of the axis (none at a pad), known by the real
/// rows alone: the padded axis may be far longer than the sample (a large window), and
/// nothing is allocated by its length.
struct RowAt {
    /// `(padded position, serial row)` of every real row, by position; `None`: the
    /// rows lie at their own positions.
    by_position: Option<Vec<(usize, usize)>>,
    rows: usize,
}

impl RowAt {
    fn new(
        name: &str,
        positions: Option<&[usize]>,
        rows: usize,
        padded: usize,
    ) -> Result<RowAt, ExecError> {
        let Some(positions) = positions else {
            return Ok(RowAt {
                by_position: None,
                rows: rows.min(padded),
            });
        };
        let what = format!("feature `{name}`'s halo rows");
        let mut by_position = crate::alloc::with_capacity(&what, rows, 16)?;
        by_position.extend(positions.iter().copied().zip(0..rows));
        by_position.sort_unstable();
        Ok(RowAt {
            by_position: Some(by_position),
            rows,
        })
    }

    fn get(&self, p: usize) -> Option<usize> {
        match &self.by_position {
            None => (p < self.rows).then_some(p),
            Some(v) => v
                .binary_search_by_key(&p, |&(at, _)| at)
                .ok()
                .map(|k| v[k].1),
        }
    }
}
