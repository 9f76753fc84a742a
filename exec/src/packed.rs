//! The packed layout for windowed attention (`featshard_spec::pack`) executed on bytes:
//! the windowed semantic left-packed and end-padded to `W x cp0`, one-hot maps as id
//! vectors. Every length and position comes from the pack plan; an adapter gives a
//! validated feature's view and writes the packed tensor wherever it keeps it.

use std::io;

use featshard_spec::ir::DType;
use featshard_spec::pack::{PackPlan, PackedForm, PAD_ID};
use featshard_spec::plan::SampleLayout;

use crate::array::Array;
use crate::compact::map_indices;
use crate::dtype;
use crate::error::ExecError;
use crate::sink::Sink;
use crate::window::{write_window, AxisMap};

/// One feature in the packed layout, ready to write.
#[derive(Debug)]
pub struct PackedWrite<'a, 'l> {
    source: Array<'a>,
    pad: Vec<u8>,
    axes: Vec<AxisMap<'l>>,
}

impl PackedWrite<'_, '_> {
    /// The packed tensor's dtype (a one-hot map's ids are `int64`).
    pub fn dtype(&self) -> DType {
        self.source.dtype()
    }

    /// The packed tensor's shape.
    pub fn shape(&self) -> Vec<usize> {
        self.axes.iter().map(|a| a.padded).collect()
    }

    /// Writes the whole packed tensor into `sink`: source runs copied, pads filled.
    pub fn write(&self, sink: &mut impl Sink) -> io::Result<()> {
        let whole: Vec<(usize, usize)> = self.axes.iter().map(|a| (0, a.padded)).collect();
        write_window(&self.source, &self.pad, &self.axes, &whole, sink)
    }
}

/// Feature `name` (`x`, validated, at its serial shape) in the packed layout of `pack`
/// on `layout`, the packed axis `packed_len` long; `None` for a feature that does not
/// touch the packed semantic (it keeps the plan's layout).
pub fn packed<'a, 'l>(
    pack: &PackPlan,
    layout: &'l SampleLayout,
    packed_len: usize,
    name: &str,
    x: &Array<'a>,
) -> Result<Option<PackedWrite<'a, 'l>>, ExecError> {
    let Some(pf) = pack.features.get(name) else {
        return Ok(None);
    };
    let source = match &pf.form {
        PackedForm::Padded | PackedForm::SerialIds => x.clone(),
        PackedForm::Ids { axis, of } => ids(name, x, *axis, of, pack, layout)?,
    };
    let axes = pf
        .axes(&pack.semantic, layout, packed_len, &source.shape())
        .into_iter()
        .map(|(padded, positions)| AxisMap { padded, positions })
        .collect();
    let pad = dtype::pad_bytes(source.dtype(), pf.pad_value);
    Ok(Some(PackedWrite { source, pad, axes }))
}

/// A one-hot map along `axis` (its last) as ids: each row's one as its item's index in
/// `of`'s padded layout (serial ids where `of` is the packed semantic, which keeps its
/// serial order), [`PAD_ID`] for a row without one.
fn ids(
    name: &str,
    x: &Array,
    axis: usize,
    of: &str,
    pack: &PackPlan,
    layout: &SampleLayout,
) -> Result<Array<'static>, ExecError> {
    if axis + 1 != x.dim() {
        return Err(ExecError::Unsupported {
            message: format!(
                "feature `{name}`, axis {axis} (one-hot): a packed map's one-hot axis is its last"
            ),
        });
    }
    let positions = match of == pack.semantic {
        true => None,
        false => layout.positions.get(of).map(Vec::as_slice),
    };
    let found = map_indices(x, positions);
    let mut bytes = Vec::with_capacity(found.numel() * 8);
    for v in found.values() {
        let id = if v < 0.0 { PAD_ID } else { v as i64 };
        dtype::encode_i64(DType::Int64, id, &mut bytes);
    }
    Ok(Array::owned(DType::Int64, found.shape(), bytes))
}
