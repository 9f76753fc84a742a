//! Padding: one serial sample -> the global padded layout of a mesh.
//!
//! A sample is first [`place`]d: validated, laid out, index values moved to the padded
//! layout and block-diagonal features checked, nothing copied. Any window of a
//! feature's padded layout (the whole of it, or a rank's block) is then written by the
//! byte executor (`featshard_exec::blocks`) straight into tensor memory.

use std::collections::BTreeMap;

use featshard_exec::blocks::{FeatureBlocks, Part};
use featshard_exec::buffer::{block_slot, Slot};
use featshard_spec::plan::{FeatureShapes, Plan, SampleLayout};
use featshard_spec::{Coord, Mesh};
use tch::{Device, Tensor};

use crate::error::RuntimeError;
use crate::kind::kind_of;
use crate::sample::{Features, Options};
use crate::views::{new_written, write_into};

/// One sample in the padded global layout of one mesh.
#[derive(Debug)]
pub struct Padded {
    /// Padded lengths and owner-block positions.
    pub layout: SampleLayout,
    /// Every tensor feature's shapes.
    pub shapes: BTreeMap<String, FeatureShapes>,
    /// Every tensor feature at its padded shape.
    pub tensors: BTreeMap<String, Tensor>,
    /// Features carried along untouched.
    pub passthrough: BTreeMap<String, Tensor>,
    /// What intake did to the sample as emitted (incoming pads, dropped keys).
    pub intake: IntakeReport,
}

pub use crate::views::Placed;
pub use featshard_exec::IntakeReport;

/// Validates a serial sample and pads it for `mesh`.
pub fn pad(
    plan: &Plan,
    mesh: Mesh,
    features: &Features,
    opts: &Options,
) -> Result<Padded, RuntimeError> {
    place(plan, mesh, features, opts)?.into_padded(plan)
}

/// Validates a serial sample and places it on `mesh`: layout, shapes, index values
/// remapped, nothing outside the diagonal blocks of co-sharded features. The rules run
/// in the byte executor on views of the tensors; every block is then written by it
/// from them.
pub fn place(
    plan: &Plan,
    mesh: Mesh,
    features: &Features,
    opts: &Options,
) -> Result<Placed, RuntimeError> {
    Placed::new(plan, mesh, features, opts)
}

impl Placed {
    /// Padded lengths and owner-block positions.
    pub fn layout(&self) -> &SampleLayout {
        &self.exec().layout
    }

    /// What intake did to the sample as emitted (incoming pads, dropped keys).
    pub fn intake(&self) -> &IntakeReport {
        &self.exec().intake
    }

    /// Every placed feature's name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.exec().arrays.keys().cloned().collect()
    }

    /// Every passed-through feature's name, sorted.
    pub fn passthrough_names(&self) -> Vec<String> {
        self.exec().passthrough.keys().cloned().collect()
    }

    /// Runs `f` on the executor's writer of one placed feature, with the device its
    /// padded tensor goes to (the device of the tensor the sample gave for it; the
    /// CPU for one the executor made).
    pub(crate) fn with_blocks<R>(
        &self,
        plan: &Plan,
        name: &str,
        f: impl FnOnce(&FeatureBlocks, Device, &FeatureShapes) -> Result<R, RuntimeError>,
    ) -> Result<R, RuntimeError> {
        let shapes = self
            .exec()
            .shapes
            .get(name)
            .ok_or_else(|| RuntimeError::Missing {
                feature: name.to_owned(),
            })?;
        let blocks = self.exec().blocks(plan, name)?;
        let device = self.input(name).map_or(Device::Cpu, Tensor::device);
        f(&blocks, device, shapes)
    }

    /// One feature at its padded global shape, in a new tensor (on the feature's device).
    pub fn padded(&self, plan: &Plan, name: &str) -> Result<Tensor, RuntimeError> {
        self.with_blocks(plan, name, |blocks, device, shapes| {
            let whole: Vec<(usize, usize)> = shapes.padded_shape.iter().map(|&n| (0, n)).collect();
            let kind = kind_of(blocks.dtype);
            new_written(name, &shapes.padded_shape, kind, device, |sink| {
                blocks.write_region(&whole, sink)
            })
        })
    }

    /// One feature's region `window` (`(start, len)` per axis of its padded shape)
    /// written into `out`, a tensor (or view) of the window's shape and the feature's
    /// dtype.
    pub fn write_window(
        &self,
        plan: &Plan,
        name: &str,
        window: &[(i64, i64)],
        out: &Tensor,
    ) -> Result<(), RuntimeError> {
        self.with_blocks(plan, name, |blocks, _, shapes| {
            let region: Option<Vec<(usize, usize)>> = window
                .iter()
                .map(|&(a, n)| Some((usize::try_from(a).ok()?, usize::try_from(n).ok()?)))
                .collect();
            let want: Vec<i64> = window.iter().map(|w| w.1).collect();
            match region {
                Some(region) if out.size() == want && out.kind() == kind_of(blocks.dtype) => {
                    write_into(name, out, |sink| blocks.write_region(&region, sink))
                }
                _ => Err(RuntimeError::Blocks {
                    feature: name.to_owned(),
                    message: format!(
                        "window {window:?} of padded shape {:?} ({:?}) written into a {:?} tensor of shape {:?}",
                        shapes.padded_shape,
                        kind_of(blocks.dtype),
                        out.kind(),
                        out.size()
                    ),
                }),
            }
        })
    }

    /// The slot feature `name`'s block takes in a rank's buffer (the executor's
    /// contract, `featshard_exec::buffer`): with `compact`, its compact block where it
    /// has a compact form.
    pub fn slot(&self, plan: &Plan, name: &str, compact: bool) -> Result<Slot, RuntimeError> {
        self.with_blocks(plan, name, |blocks, _, shapes| {
            let t = crate::sample::tensor_plan(plan, name)?;
            Ok(block_slot(t, blocks, shapes, compact))
        })
    }

    /// One feature's compact block on the rank at `coord` (see
    /// [`Placed::slot`]) written into `out`, a tensor of its dtype and shape.
    pub fn write_compact_block(
        &self,
        plan: &Plan,
        name: &str,
        coord: Coord,
        out: &Tensor,
    ) -> Result<(), RuntimeError> {
        self.with_blocks(plan, name, |blocks, _, _| {
            let at = Part::Compact(coord);
            let shape = blocks.compact_shape().unwrap_or_else(|| blocks.shape.clone());
            if out.size() != dims(&shape) || out.kind() != kind_of(blocks.dtype_of(at)) {
                return Err(RuntimeError::Blocks {
                    feature: name.to_owned(),
                    message: format!(
                        "a compact block of shape {shape:?} ({}) written into a {:?} tensor of shape {:?}",
                        blocks.dtype_of(at),
                        out.kind(),
                        out.size()
                    ),
                });
            }
            write_into(name, out, |sink| blocks.write_compact(coord, sink))
        })
    }

    /// Every feature padded, in new tensors.
    pub fn into_padded(self, plan: &Plan) -> Result<Padded, RuntimeError> {
        let tensors = self
            .names()
            .into_iter()
            .map(|n| Ok((n.clone(), self.padded(plan, &n)?)))
            .collect::<Result<_, RuntimeError>>()?;
        let passthrough = self
            .passthrough_names()
            .into_iter()
            .filter_map(|n| Some((n.clone(), self.input(&n)?.shallow_clone())))
            .collect();
        Ok(Padded {
            layout: self.layout().clone(),
            shapes: self.exec().shapes.clone(),
            tensors,
            passthrough,
            intake: self.intake().clone(),
        })
    }
}

pub(crate) fn dims(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&d| d as i64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::{assemble, unpad};
    use featshard_spec::Mesh;
    use tch::{Device, Kind};

    const SPEC: &str = "\
version: 1
module: t
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true}
  atoms: {shard: true, owner: tokens, counts: counts}
features:
  counts: {axes: [tokens], dtype: int64}
  pair: {axes: [atoms, 2, atoms], dtype: float32, pad: -1.0}
";

    #[test]
    fn padding_a_counts_sample_puts_serial_values_at_their_positions() {
        let (_, plan) = featshard_spec::compile_str("t.yaml", SPEC).expect("spec");
        let counts = [2i64, 0, 3, 1, 4];
        let a: i64 = counts.iter().sum();
        let x = Tensor::rand([a, 2, a], (Kind::Float, Device::Cpu));
        let features: Features = [
            ("counts".to_owned(), Tensor::from_slice(&counts)),
            ("pair".to_owned(), x.shallow_clone()),
        ]
        .into();
        let padded = pad(
            &plan,
            Mesh::new(&[2, 3]).unwrap(),
            &features,
            &Options::default(),
        )
        .expect("pad");
        let out = &padded.tensors["pair"];
        let pos: Vec<i64> = padded.layout.positions["atoms"]
            .iter()
            .map(|&p| p as i64)
            .collect();
        let pos = Tensor::from_slice(&pos);
        let back = out.index_select(0, &pos).index_select(2, &pos);
        assert!(back.equal(&x));
        // Everything else is the pad value.
        let pads = out.eq(-1.0).sum(Kind::Int64).int64_value(&[]);
        assert_eq!(pads as usize + x.numel(), out.numel());
    }

    /// A shard-local index vector (the owner token of each atom, as an id on the shard
    /// holding the atom): blocks viewed from the padded tensor and blocks written straight
    /// from the serial sample hold the same local ids, and both assemble back.
    #[test]
    fn shard_local_ids_are_local_in_viewed_and_written_blocks() {
        let spec = format!(
            "{SPEC}  owner: {{axes: [atoms], dtype: int64, pad: -1, index: {{of: tokens, scope: shard_local}}}}\n"
        );
        let (_, plan) = featshard_spec::compile_str("t.yaml", &spec).expect("spec");
        let counts = [2i64, 0, 3, 1, 4, 0, 2];
        let owner: Vec<i64> = counts
            .iter()
            .enumerate()
            .flat_map(|(t, &c)| std::iter::repeat_n(t as i64, c as usize))
            .collect();
        let a = owner.len() as i64;
        let sample: Features = [
            ("counts".to_owned(), Tensor::from_slice(&counts)),
            ("owner".to_owned(), Tensor::from_slice(&owner)),
            (
                "pair".to_owned(),
                Tensor::rand([a, 2, a], (Kind::Float, Device::Cpu)),
            ),
        ]
        .into();
        for mesh in [[2, 1], [3, 2], [4, 1]].map(|s| Mesh::new(&s).unwrap()) {
            let padded = pad(&plan, mesh, &sample, &Options::default()).expect("pad");
            let placed = place(&plan, mesh, &sample, &Options::default()).expect("place");
            let layout = &padded.layout;
            let (n_loc, a_loc) = (
                (layout.padded["tokens"] / mesh.size(0)) as i64,
                (layout.padded["atoms"] / mesh.size(0)) as i64,
            );
            let mut ranks = Vec::new();
            for rank in 0..mesh.ranks() {
                let coord = mesh.coord(rank);
                let viewed = padded.block(&plan, "owner", coord).expect("block").tensor;
                let mut written = viewed.full_like(7);
                placed
                    .write_block(&plan, "owner", coord, &mut written)
                    .expect("write");
                assert!(written.equal(&viewed), "mesh {mesh:?} rank {rank}");
                // Every real atom's id is its owner's padded position minus the shard start.
                for row in 0..a_loc {
                    let p = coord.get(0) as i64 * a_loc + row;
                    let local = written.int64_value(&[row]);
                    match layout.positions["atoms"]
                        .iter()
                        .position(|&q| q as i64 == p)
                    {
                        Some(atom) => {
                            // Tokens are end-padded: a token's padded position is its index.
                            let token = owner[atom];
                            assert_eq!(local, token - coord.get(0) as i64 * n_loc, "atom {atom}");
                            assert!((0..n_loc).contains(&local));
                        }
                        None => assert_eq!(local, -1, "pad at {p}"),
                    }
                }
                let mut blocks: Features = padded
                    .rank_blocks(&plan, rank)
                    .expect("blocks")
                    .into_iter()
                    .map(|(n, b)| (n, b.tensor))
                    .collect();
                blocks.insert("owner".into(), written);
                ranks.push(blocks);
            }
            let assembled = assemble(&plan, layout, None, &ranks).expect("assemble");
            let serial = unpad(&plan, layout, &assembled).expect("unpad");
            assert!(serial["owner"].equal(&sample["owner"]), "mesh {mesh:?}");
        }
    }
}
