//! The way back straight to the serial sample: each rank's real items copied to their
//! serial places as the rank comes, its pads dropped there, so that nothing the size
//! of a padded global layout is ever made (a map's whole column axis on many ranks pads
//! far past the sample: 10 tokens on 65,536 ranks make a 34 GB padded map of a few
//! bytes of serial one).

use featshard_spec::ir::DeriveRule;
use std::collections::BTreeMap;

use featshard_spec::plan::{FeatureShapes, Plan, Remap, SampleLayout};

use super::shared::{
    assembled_shapes, axis_items, blocks_error, padded_block, to_serial_ids, Items, RankByRank,
    Turns,
};
use crate::dense::Dense;
use crate::dtype;
use crate::error::ExecError;
use crate::feature::tensor_plan;
use crate::files::Sample;

/// [`super::Assembler`]'s twin that holds the serial sample instead of the padded
/// layouts: one rank's blocks at a time, each block's real items copied to their serial
/// places (shard-local ids shifted back, padded-layout ids made serial), a replicated
/// copy compared on its real items.
#[derive(Debug)]
pub struct SerialAssembler<'p> {
    plan: &'p Plan,
    layout: &'p SampleLayout,
    features: BTreeMap<String, Serial>,
    turns: Turns,
}

/// One feature as the ranks fill it.
#[derive(Debug)]
struct Serial {
    shapes: FeatureShapes,
    /// The items of every axis.
    axes: Vec<Items>,
    dense: Dense,
    /// The rank that wrote each region, keyed by its coordinates on split axes.
    written: BTreeMap<Vec<usize>, usize>,
}

impl<'p> SerialAssembler<'p> {
    /// The serial features of `workflow` that rank 0's blocks `first` hold (every
    /// required one must be there), each as long as the sample's items.
    pub fn new(
        plan: &'p Plan,
        layout: &'p SampleLayout,
        workflow: Option<&str>,
        first: &Sample,
    ) -> Result<Self, ExecError> {
        let mut features = BTreeMap::new();
        for (name, shapes) in assembled_shapes(plan, layout, workflow, first)? {
            let t = tensor_plan(plan, &name)?;
            // A key halo is no part of the sample: every shard makes it for its mesh,
            // and a sample that gives it is refused.
            if t.derived.as_ref().and_then(DeriveRule::halo).is_some() {
                continue;
            }
            let axes = axis_items(&name, t, layout, &shapes)?;
            let shape: Vec<usize> = axes.iter().map(Items::len).collect();
            let bytes = super::pad_filled(&name, t, shape.iter().product())?;
            let dense = Dense {
                dtype: t.dtype,
                shape,
                bytes,
            };
            let written = BTreeMap::new();
            let serial = Serial {
                shapes,
                axes,
                dense,
                written,
            };
            features.insert(name, serial);
        }
        Ok(SerialAssembler {
            plan,
            layout,
            features,
            turns: Turns { next: 0 },
        })
    }
}

impl RankByRank for SerialAssembler<'_> {
    fn add(&mut self, rank: usize, blocks: &Sample) -> Result<(), ExecError> {
        self.turns.take(self.plan, self.layout, rank)?;
        for (name, f) in &mut self.features {
            let block = blocks
                .get(name)
                .ok_or_else(|| blocks_error(name, format!("rank {rank} has no block")))?;
            add_block(self.plan, self.layout, name, rank, block, f)?;
        }
        Ok(())
    }

    /// The serial sample, once every rank was added: each map in the form the sample
    /// gave it.
    fn finish(self: Box<Self>) -> Result<BTreeMap<String, Dense>, ExecError> {
        self.turns.done(self.plan, self.layout)?;
        let (plan, layout) = (self.plan, self.layout);
        self.features
            .into_iter()
            .map(|(name, f)| {
                let t = tensor_plan(plan, &name)?;
                let given = crate::deliver::to_given(&name, t, layout, f.dense)?;
                Ok((name, given))
            })
            .collect()
    }
}

/// Rank `r`'s block of one feature: its real items gathered, their ids made serial,
/// then copied to their serial places (or compared there, for a replicated copy).
fn add_block(
    plan: &Plan,
    layout: &SampleLayout,
    name: &str,
    r: usize,
    block: &crate::array::Array,
    f: &mut Serial,
) -> Result<(), ExecError> {
    let t = tensor_plan(plan, name)?;
    let coord = layout.mesh.coord(r);
    let bytes = padded_block(plan, layout, name, &f.shapes, r, block)?;
    let window = t.block_window(&f.shapes.local_shape, coord);
    let kept: Vec<Vec<(usize, usize)>> = f
        .axes
        .iter()
        .zip(&window)
        .map(|(items, &(start, len))| items.in_window(start, len))
        .collect();
    let local: Vec<Vec<usize>> = kept
        .iter()
        .map(|k| k.iter().map(|p| p.0).collect())
        .collect();
    let serial: Vec<Vec<usize>> = kept
        .iter()
        .map(|k| k.iter().map(|p| p.1).collect())
        .collect();
    let shape: Vec<usize> = local.iter().map(Vec::len).collect();
    let es = dtype::size(t.dtype);
    let mut real = Dense {
        dtype: t.dtype,
        bytes: vec![0; shape.iter().product::<usize>() * es],
        shape,
    };
    let dense_index = |n: usize| (0..n).collect::<Vec<_>>();
    let all: Vec<Vec<usize>> = real.shape.iter().map(|&n| dense_index(n)).collect();
    let from = (&f.shapes.local_shape[..], &local[..]);
    for_each_run(from, (&real.shape[..], &all[..]), es, |src, dst| {
        real.bytes[dst].copy_from_slice(&bytes[src]);
        true
    });
    if let Remap::ToPaddedLayout { of, .. } | Remap::ShardLocal { of, .. } = &t.remap {
        to_serial_ids(name, of, layout, crate::placed::index_none(t), &mut real)?;
    }
    let key: Vec<usize> = t
        .axes
        .iter()
        .filter_map(|a| a.split.mesh_axis().map(|m| coord.get(m)))
        .collect();
    let from = (&real.shape[..], &all[..]);
    let to = (&f.dense.shape[..], &serial[..]);
    match f.written.get(&key) {
        Some(&first) => {
            let out = &f.dense.bytes;
            let same = for_each_run(from, to, es, |src, dst| out[dst] == real.bytes[src]);
            match same {
                true => Ok(()),
                false => Err(blocks_error(
                    name,
                    format!("ranks {first} and {r} hold different copies of a replicated block"),
                )),
            }
        }
        None => {
            let out = &mut f.dense.bytes;
            for_each_run(from, to, es, |src, dst| {
                out[dst].copy_from_slice(&real.bytes[src]);
                true
            });
            f.written.insert(key, r);
            Ok(())
        }
    }
}

/// A tensor's shape and the indices taken along each axis.
type Taken<'a> = (&'a [usize], &'a [Vec<usize>]);

/// Calls `f(source bytes, destination bytes)` for every run of elements that is
/// consecutive in both tensors, the `k`-th index taken along each axis of the source
/// going to the `k`-th along the destination's; stops at the first `false`, which it
/// returns.
fn for_each_run(
    from: Taken,
    to: Taken,
    es: usize,
    mut f: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>) -> bool,
) -> bool {
    let (src_shape, src_idx) = from;
    let (dst_shape, dst_idx) = to;
    let (src_stride, dst_stride) = (
        featshard_spec::layout::contiguous_stride(src_shape),
        featshard_spec::layout::contiguous_stride(dst_shape),
    );
    let Some((last_src, lead_src)) = src_idx.split_last() else {
        return f(0..es, 0..es);
    };
    let last_dst = &dst_idx[dst_idx.len() - 1];
    let lens: Vec<usize> = lead_src.iter().map(Vec::len).collect();
    let mut ok = true;
    crate::local_ids::for_each_index(&lens, |_, idx| {
        if !ok {
            return;
        }
        let at = |index: &[Vec<usize>], stride: &[usize]| -> usize {
            idx.iter()
                .zip(index)
                .zip(stride)
                .map(|((&i, ix), &st)| ix[i] * st)
                .sum()
        };
        let (s0, d0) = (
            at(lead_src, &src_stride),
            at(&dst_idx[..lens.len()], &dst_stride),
        );
        let mut k = 0;
        while ok && k < last_src.len() {
            let mut n = 1;
            while k + n < last_src.len()
                && last_src[k + n] == last_src[k] + n
                && last_dst[k + n] == last_dst[k] + n
            {
                n += 1;
            }
            let (s, d) = ((s0 + last_src[k]) * es, (d0 + last_dst[k]) * es);
            ok = f(s..s + n * es, d..d + n * es);
            k += n;
        }
    });
    ok
}
