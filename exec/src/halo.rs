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
    let at = Geometry::of(name, of, *size, of_shapes, &own.padded_shape)?;
    let positions = source
        .axes
        .first()
        .and_then(|a| a.semantic.as_ref())
        .and_then(|s| layout.positions.get(s));
    let row_at = RowAt::new(name, positions.map(Vec::as_slice), x.shape()[0], at.padded)?;
    let es = dtype::size(t.dtype);
    let row = own.padded_shape[1..].iter().product::<usize>() * es;
    let rows = dense_rows(
        t.dtype,
        &x,
        source.one_hot,
        own.padded_shape.last().copied(),
    );
    if x.dim() == 0 || rows.len() != x.shape()[0] * row {
        return Err(blocks_error(
            name,
            format!("`{of}`'s rows are not the halo's"),
        ));
    }
    // A pad item inside the axis is the feature's pad, as the neighbour's block holds it;
    // past either end of the axis, the halo's own.
    let pads = [source.pad_value, t.pad_value]
        .map(|p| dtype::pad_bytes(t.dtype, p).repeat(row / es.max(1)));
    let whole = at.shards * 2 * size * row;
    let mut out = crate::alloc::with_capacity(name, whole, 1)?;
    at.lay_out(&row_at, &rows, row, &pads, &mut out);
    Ok(Array::owned(t.dtype, own.padded_shape.clone(), out))
}

/// Where a halo's rows come from: the padded axis, the shards that split it and each
/// one's block, read from the plan's shapes of the feature it is taken of.
struct Geometry {
    padded: usize,
    shards: usize,
    block: usize,
    size: usize,
}

impl Geometry {
    fn of(
        name: &str,
        of: &str,
        size: usize,
        of_shapes: &FeatureShapes,
        own: &[usize],
    ) -> Result<Geometry, ExecError> {
        let (Some(&padded), Some(&block), Some(&rows)) = (
            of_shapes.padded_shape.first(),
            of_shapes.local_shape.first(),
            own.first(),
        ) else {
            return Err(blocks_error(
                name,
                format!("`{of}` has no first axis to take a halo of"),
            ));
        };
        // An empty axis: empty blocks, one halo of pads per shard.
        let shards = match padded.checked_div(block) {
            Some(n) => n,
            None => rows / (2 * size).max(1),
        };
        if block * shards != padded || shards * 2 * size != rows {
            return Err(blocks_error(
                name,
                format!("its shape {own:?} is not 2 x {size} rows of `{of}` per shard"),
            ));
        }
        Ok(Geometry {
            padded,
            shards,
            block,
            size,
        })
    }

    /// Every shard's halo, in shard order: the `size` rows before its block and the
    /// `size` after (`pads`: the feature's inside the axis, the halo's past its ends).
    fn lay_out(
        &self,
        row_at: &RowAt,
        rows: &[u8],
        row: usize,
        pads: &[Vec<u8>; 2],
        out: &mut Vec<u8>,
    ) {
        for r in 0..self.shards {
            let (start, end) = (r * self.block, (r + 1) * self.block);
            let before = (start as i128 - self.size as i128)..start as i128;
            for p in before.chain(end as i128..(end + self.size) as i128) {
                match usize::try_from(p).ok().filter(|&p| p < self.padded) {
                    Some(p) => match row_at.get(p) {
                        Some(i) => out.extend_from_slice(&rows[i * row..(i + 1) * row]),
                        None => out.extend_from_slice(&pads[0]),
                    },
                    None => out.extend_from_slice(&pads[1]),
                }
            }
        }
    }
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
