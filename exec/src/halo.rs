//! A key halo (`derive: {halo: {of, size}}`) laid out: for every shard of the windowed
//! first axis of `of`, the `size` rows of the padded layout before the shard's block and
//! the `size` rows after it (the feature's pads where they are, the halo's past either
//! end), one halo per shard, in shard order.
//! Each rank's block of it is its own halo; every number is the plan's.

use std::collections::BTreeMap;

use featshard_spec::ir::DeriveRule;
use featshard_spec::plan::{FeatureShapes, Plan, SampleLayout};

use crate::array::Array;
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
    let (padded, block) = (of_shapes.padded_shape[0], of_shapes.local_shape[0].max(1));
    // The serial row at each padded position of the axis (none at a pad).
    let mut row_at: Vec<Option<usize>> = vec![None; padded];
    let positions = source.axes[0]
        .semantic
        .as_ref()
        .and_then(|s| layout.positions.get(s));
    for i in 0..x.shape()[0] {
        let p = positions.map_or(i, |pos| pos[i]);
        if let Some(slot) = row_at.get_mut(p) {
            *slot = Some(i);
        }
    }
    let es = dtype::size(t.dtype);
    let row = x.shape()[1..].iter().product::<usize>() * es;
    // A feature given narrow (a mask as bool, ranged integers) widened to the declared
    // dtype, as its blocks are; any other as it is.
    let rows = match x.dtype() == t.dtype {
        true => x.base_bytes().to_vec(),
        false => {
            let mut wide = vec![0u8; x.numel() * es];
            dtype::cast(x.dtype(), x.base_bytes(), t.dtype, &mut wide);
            wide
        }
    };
    // A pad item inside the axis is the feature's pad, as the neighbour's block holds it;
    // past either end of the axis, the halo's own.
    let inside = dtype::pad_bytes(t.dtype, source.pad_value).repeat(row / es.max(1));
    let outside = dtype::pad_bytes(t.dtype, t.pad_value).repeat(row / es.max(1));
    let shards = padded / block;
    let mut out = Vec::with_capacity(shards * 2 * size * row);
    for r in 0..shards {
        let (start, end) = (r * block, (r + 1) * block);
        let before = (start as i128 - *size as i128)..start as i128;
        for p in before.chain(end as i128..(end + size) as i128) {
            match usize::try_from(p).ok().and_then(|p| row_at.get(p)) {
                Some(Some(i)) => out.extend_from_slice(&rows[i * row..(i + 1) * row]),
                Some(None) => out.extend_from_slice(&inside),
                None => out.extend_from_slice(&outside),
            }
        }
    }
    Ok(Array::owned(t.dtype, own.padded_shape.clone(), out))
}
