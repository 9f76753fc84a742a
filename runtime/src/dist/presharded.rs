//! Reading pre-sharded samples (`featshard shard` over a dataset): every rank opens
//! only its own rank file of each sample and gets the same [`LocalSample`] the online
//! [`distribute`](super::distribute) hands it, with no source rank and no collective.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use featshard_exec::array::Array;
use featshard_exec::compact::{check_stored, stored_form, Form};
use featshard_exec::shard_folder::{read_dataset, RankFile, ShardFolder};
use featshard_spec::plan::Plan;
use featshard_spec::plan::TensorPlan;
use featshard_spec::shards::{self, Encoding, Manifest};
use tch::{Device, Kind, Tensor};

use super::error::DistError;
use super::local::LocalSample;
use super::on_device;
use crate::files;
use crate::shard::{DTensorMeta, LocalBlock};
use crate::Features;
use featshard_spec::Mesh;

/// A folder of pre-sharded samples, read from one rank.
#[derive(Debug)]
pub struct PreshardedDataset {
    root: PathBuf,
    names: Vec<String>,
    cp: Mesh,
    verify: bool,
    expand: Expansion,
}

/// Where a rank file's compact blocks become dense blocks, once the executor has
/// checked them on the host.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expansion {
    /// On the host, by the executor.
    Host,
    /// On a device, by torch: only the compact blocks are copied there.
    Torch(Device),
}

fn setup(message: String) -> DistError {
    DistError::Setup { message }
}

impl PreshardedDataset {
    /// Opens `root` (with its `dataset.json`) for `plan` on a CP mesh of sizes `cp`:
    /// refuses a folder sharded with another spec or mesh. Failed samples are left out.
    pub fn open(root: &Path, plan: &Plan, cp: Mesh) -> Result<Self, DistError> {
        let d = read_dataset(plan, root, cp).map_err(setup)?;
        let names = d
            .samples
            .into_iter()
            .filter(|s| s.status != shards::Status::Failed)
            .map(|s| s.name)
            .collect();
        Ok(PreshardedDataset {
            root: root.to_path_buf(),
            names,
            cp,
            verify: true,
            expand: Expansion::Host,
        })
    }

    /// Whether each rank file's size and CRC-32 are checked against its manifest
    /// before it is used (on by default: one more pass over the file's bytes).
    pub fn with_verify(mut self, verify: bool) -> Self {
        self.verify = verify;
        self
    }

    /// The device every block and passed-through tensor of a read sample is on (the
    /// host by default). On a GPU, compact blocks are checked by the executor on the
    /// host, then only they are copied to the device and expanded there by torch
    /// (as the online path does on an NCCL mesh).
    pub fn with_device(mut self, device: Device) -> Self {
        self.expand = match device {
            Device::Cpu => Expansion::Host,
            d => Expansion::Torch(d),
        };
        self
    }

    /// How many samples the pre-sharded dataset holds.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether it holds no sample.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The CP rank's part of sample `index`, read from its own rank file alone: the
    /// blocks with their DTensor metadata, as the online path delivers them. The file
    /// must say it is this rank's of the sample's run and layout.
    pub fn read(
        &self,
        plan: &Plan,
        index: usize,
        cp_rank: usize,
    ) -> Result<LocalSample, DistError> {
        let name = self.names.get(index).ok_or_else(|| {
            setup(format!(
                "sample {index} of {} pre-sharded samples",
                self.names.len()
            ))
        })?;
        let folder =
            ShardFolder::open(plan, &self.root.join(name), Some(self.cp)).map_err(setup)?;
        // Mapped and checked once; its blocks copied into one buffer from that map.
        let file = folder
            .open_rank(plan, cp_rank, self.verify)
            .map_err(setup)?;
        let mut tensors = tensors_of(&file)?;
        let m = folder.manifest();
        let blocks = blocks_of(plan, m, &mut tensors, self.expand)?;
        if let Expansion::Torch(device) = self.expand {
            for t in tensors.values_mut() {
                *t = t.f_to_device(device).map_err(|e| DistError::Protocol {
                    message: format!("{}: {e}", file.path().display()),
                })?;
            }
        }
        Ok(LocalSample {
            sample: index,
            layout: m.layout.clone(),
            coord: self.cp.coord(cp_rank),
            blocks,
            passthrough: tensors,
        })
    }
}

/// Every tensor of a checked rank file, copied from its map into one buffer (laid out
/// as a rank's buffer is) and viewed there: one copy, no second open of the file.
fn tensors_of(file: &RankFile) -> Result<Features, DistError> {
    let (listed, total) = file.packed();
    let at = |e: String| setup(format!("{}: {e}", file.path().display()));
    let buffer = Tensor::f_empty([total as i64], (Kind::Uint8, Device::Cpu))
        .map_err(|e| at(e.to_string()))?;
    crate::views::fill_into("rank file", &buffer, |out| {
        file.copy_packed(out)
            .map_err(|e| crate::error::RuntimeError::Blocks {
                feature: "rank file".into(),
                message: e,
            })
    })?;
    listed
        .into_iter()
        .map(|(name, dtype, shape, offset, bytes)| {
            let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            let kind = crate::kind::kind_of(dtype);
            let bytes = buffer.f_narrow(0, offset as i64, bytes as i64);
            let view = match kind {
                Kind::Uint8 => bytes,
                _ => bytes.and_then(|b| b.f_view_dtype(kind)),
            };
            let t = view
                .and_then(|v| v.f_view(shape.as_slice()))
                .map_err(|e| at(e.to_string()))?;
            Ok((name, t))
        })
        .collect()
}

/// The tensor features of the rank file as blocks with the manifest's DTensor metadata;
/// what is left in `tensors` is passed through. Compact blocks are checked first, all
/// of them, then expanded (see [`expanded`]); the others are moved as they are stored.
fn blocks_of(
    plan: &Plan,
    m: &Manifest,
    tensors: &mut Features,
    expand: Expansion,
) -> Result<BTreeMap<String, LocalBlock>, DistError> {
    let mut blocks = BTreeMap::new();
    let (mut compact, mut entries) = (Vec::new(), Vec::new());
    for (name, entry) in &m.features {
        let Some(t) = plan.tensor(name) else {
            continue;
        };
        let stored = tensors.remove(name).ok_or_else(|| DistError::Protocol {
            message: format!("feature `{name}`: in the manifest, not in the rank file"),
        })?;
        let local = &entry.local_shape;
        if m.encoding == Encoding::Compact && stored_form(t, local, 0).is_some() {
            compact.push(checked(name, t, local, stored)?);
            entries.push(entry);
            continue;
        }
        let tensor = match expand {
            Expansion::Host => stored,
            Expansion::Torch(device) => stored.f_to_device(device).map_err(torch_error(name))?,
        };
        blocks.insert(name.clone(), local_block(name, t, entry, tensor)?);
    }
    let dense = expanded(&compact, expand)?;
    for ((c, entry), tensor) in compact.iter().zip(entries).zip(dense) {
        blocks.insert(c.name.to_string(), local_block(c.name, c.t, entry, tensor)?);
    }
    Ok(blocks)
}

/// `tensor` as the block of feature `name`, which must be of the manifest's local shape.
fn local_block(
    name: &str,
    t: &TensorPlan,
    entry: &shards::FeatureEntry,
    tensor: Tensor,
) -> Result<LocalBlock, DistError> {
    let local: Vec<i64> = entry.local_shape.iter().map(|&d| d as i64).collect();
    if tensor.size() != local {
        return Err(DistError::Protocol {
            message: format!(
                "feature `{name}`: the rank file holds {:?}, the manifest says {:?}",
                tensor.size(),
                entry.local_shape
            ),
        });
    }
    let meta = DTensorMeta {
        global_shape: entry.global_shape.clone(),
        stride: entry.global_stride.clone(),
        placements: t.placements.clone(),
    };
    Ok(LocalBlock { tensor, meta })
}

/// A block a rank file stores compact, checked by the executor (see
/// [`featshard_exec::compact::check_stored`]), with its dense block's shape `local`.
struct Checked<'a> {
    name: &'a str,
    t: &'a TensorPlan,
    local: &'a [usize],
    form: Form,
    packed: Array<'static>,
    stored: Tensor,
}

/// `stored`, feature `name`'s compact block, checked by the executor: refused by name
/// before any device sees it.
fn checked<'a>(
    name: &'a str,
    t: &'a TensorPlan,
    local: &'a [usize],
    stored: Tensor,
) -> Result<Checked<'a>, DistError> {
    let dtype = crate::kind::dtype_of(stored.kind()).ok_or_else(|| DistError::Protocol {
        message: format!("feature `{name}`: stored as {:?}", stored.kind()),
    })?;
    let shape = stored.size().iter().map(|&d| d as usize).collect();
    let packed = Array::owned(dtype, shape, files::tensor_bytes(name, &stored)?);
    let form = check_stored(name, t, local, &packed)?;
    Ok(Checked {
        name,
        t,
        local,
        form,
        packed,
        stored,
    })
}

/// Checked compact blocks as their dense blocks: by the executor on the host, or by
/// torch on a device, where they all arrive in one copy (many small copies would each
/// cost a transfer).
fn expanded(blocks: &[Checked], expand: Expansion) -> Result<Vec<Tensor>, DistError> {
    match expand {
        Expansion::Host => blocks
            .iter()
            .map(|c| {
                let kind = crate::kind::kind_of(c.t.dtype);
                crate::views::new_filled(c.name, c.local, kind, |out| {
                    c.form
                        .expand_into(c.packed.base_bytes(), c.t.dtype, c.local, out)
                })
                .map_err(DistError::from)
            })
            .collect(),
        Expansion::Torch(device) => {
            let stored: Vec<&Tensor> = blocks.iter().map(|c| &c.stored).collect();
            let there =
                on_device::moved_together(&stored, device).map_err(|e| DistError::Protocol {
                    message: format!("the compact blocks to {device:?}: {e}"),
                })?;
            blocks
                .iter()
                .zip(&there)
                .map(|(c, on)| {
                    on_device::expanded(on, &c.form.recipe(c.local), c.t.dtype, c.local)
                        .map_err(torch_error(c.name))
                })
                .collect()
        }
    }
}

/// A torch error as the error of feature `name`.
fn torch_error(name: &str) -> impl Fn(tch::TchError) -> DistError + '_ {
    move |e| DistError::Protocol {
        message: format!("feature `{name}`: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    const SPEC: &str = "\
version: 1
module: t
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true}
features:
  kind: {axes: [tokens, 5], dtype: int64, one_hot: 1}
  pad: {axes: [tokens], dtype: float32, mask: tokens}
  bond: {axes: [tokens, tokens], dtype: float32, sparse: true}
  ids: {axes: [tokens], dtype: int64, range: [0, 32]}
";

    /// Each compact form as a rank file stores it, for a block of 6 tokens.
    fn stored() -> Vec<(&'static str, Vec<usize>, Tensor)> {
        let entries: Vec<i64> = [(3i64, 2.5f32), (14, 1.0), (-1, 0.0)]
            .iter()
            .flat_map(|&(at, v)| [at, i64::from(v.to_bits())])
            .collect();
        vec![
            (
                "kind",
                vec![6, 5],
                Tensor::from_slice(&[0u8, 4, 5, 2, 1, 5]),
            ),
            ("pad", vec![6], Tensor::from_slice(&[0b0001_1011u8])),
            (
                "bond",
                vec![6, 6],
                Tensor::from_slice(&entries).view([3, 2]),
            ),
            ("ids", vec![6], Tensor::from_slice(&[0u8, 32, 7, 1, 0, 3])),
        ]
    }

    #[test]
    fn torch_on_a_device_expands_a_rank_files_blocks_as_the_executor_does() {
        let (_, plan) = featshard_spec::compile_str("t.yaml", SPEC).expect("spec");
        let stored = stored();
        let blocks: Vec<Checked> = stored
            .iter()
            .map(|(name, local, x)| {
                let t = plan.tensor(name).expect("feature");
                checked(name, t, local, x.shallow_clone()).expect("checked")
            })
            .collect();
        let host = expanded(&blocks, Expansion::Host).expect("host");
        // Every block in one copy, then each expanded by torch.
        let on = expanded(&blocks, Expansion::Torch(Device::Cpu)).expect("torch");
        for ((c, host), on) in blocks.iter().zip(&host).zip(&on) {
            let name = c.name;
            assert_eq!(host.kind(), on.kind(), "{name}");
            assert!(host.equal(on), "{name}: {host} against {on}");
            assert!(
                host.abs().sum(Kind::Double).double_value(&[]) > 0.0,
                "{name}"
            );
        }
    }

    #[test]
    fn a_bad_compact_block_is_refused_before_any_device_sees_it() {
        let (_, plan) = featshard_spec::compile_str("t.yaml", SPEC).expect("spec");
        let bad = [
            ("kind", Tensor::from_slice(&[0u8, 9, 5, 2, 1, 5])),
            ("ids", Tensor::from_slice(&[0u8, 40, 7, 1, 0, 3])),
        ];
        // Refused by the check, which comes before any copy to a device.
        for (name, x) in bad {
            let t = plan.tensor(name).expect("feature");
            let e = checked(name, t, &[6, 5][..t.axes.len()], x)
                .err()
                .expect("refused")
                .to_string();
            assert!(e.contains(&format!("feature `{name}`")), "{e}");
        }
    }
}
