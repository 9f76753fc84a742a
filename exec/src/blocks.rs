//! Any rank's block of a placed sample's feature, written into any [`Sink`]: a rank
//! file, or the memory of a tensor the caller allocated. Shard-local ids are shifted as
//! they are copied; a feature carried along whole is written as it is.

use std::io;

use featshard_spec::ir::{DType, Role};
use featshard_spec::plan::{FeatureShapes, Plan, Remap, SampleLayout, TensorPlan};
use featshard_spec::Coord;

use crate::array::Array;
use crate::compact::OneHot;
use crate::compact::{
    expand, given_as_indices, given_narrow, narrowed, stored_form, Bits, Cast, Entries, Form,
};
use crate::dtype;
use crate::error::ExecError;
use crate::feature::tensor_plan;
use crate::placed::{axis_maps, Placed};
use crate::sink::Sink;
use crate::window::{write_entries_window, write_window, AxisMap};

/// One feature of a placed sample, ready to have any rank's block written.
#[derive(Debug)]
pub struct FeatureBlocks<'p, 'a> {
    /// The feature's name.
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// Every rank's block shape (a passthrough feature's whole shape).
    pub shape: Vec<usize>,
    x: &'p Array<'a>,
    /// `None` for a feature carried along whole.
    placed: Option<(&'p TensorPlan, Vec<AxisMap<'p>>)>,
    pad: Vec<u8>,
    plan: &'p Plan,
    layout: &'p SampleLayout,
    /// A one-hot feature's compact form and its indices at the serial shape.
    compact: Option<(OneHot, &'p Array<'static>)>,
    /// The sample gave the feature as its one-hot indices: `x` holds them, and dense
    /// blocks are expanded from them window by window.
    given: bool,
    /// A sparse feature's room for entries: the most any rank's block holds.
    entries: Option<usize>,
    /// The sample gave the feature narrower than declared (`given_narrow`): `x` and
    /// `pad` are of `x`'s dtype, widened as blocks are written.
    narrow: bool,
}

/// Every feature of `placed`, placed ones then passthrough ones, each sorted by name.
pub fn feature_blocks<'p, 'a>(
    plan: &'p Plan,
    placed: &'p Placed<'a>,
) -> Result<Vec<FeatureBlocks<'p, 'a>>, ExecError> {
    let names = placed.arrays.keys().chain(placed.passthrough.keys());
    names.map(|name| placed.blocks(plan, name)).collect()
}

impl<'a> Placed<'a> {
    /// The writer of feature `name`'s blocks: a placed feature's, or a passthrough
    /// feature's (written whole).
    pub fn blocks<'p>(
        &'p self,
        plan: &'p Plan,
        name: &str,
    ) -> Result<FeatureBlocks<'p, 'a>, ExecError> {
        let missing = || ExecError::Missing {
            feature: name.to_owned(),
        };
        if let Some(x) = self.passthrough.get(name) {
            return Ok(FeatureBlocks {
                name: name.to_owned(),
                dtype: x.dtype(),
                shape: x.shape(),
                x,
                placed: None,
                pad: Vec::new(),
                plan,
                layout: &self.layout,
                compact: None,
                given: false,
                entries: None,
                narrow: false,
            });
        }
        let x = self.arrays.get(name).ok_or_else(missing)?;
        let shapes = self.shapes.get(name).ok_or_else(missing)?;
        let blocks = FeatureBlocks::placed(plan, name, x, shapes, &self.layout)?;
        Ok(blocks
            .with_compact(self.compact.get(name))
            .with_entries(self.entries.get(name).copied()))
    }
}

impl<'p, 'a> FeatureBlocks<'p, 'a> {
    /// One placed feature: `x` at its serial shape, index values in the padded layout
    /// (as [`Placed::arrays`] holds it), laid out by `layout`.
    pub fn placed(
        plan: &'p Plan,
        name: &str,
        x: &'p Array<'a>,
        shapes: &FeatureShapes,
        layout: &'p SampleLayout,
    ) -> Result<Self, ExecError> {
        let t = tensor_plan(plan, name)?;
        let narrow = given_narrow(t, x.dtype());
        Ok(FeatureBlocks {
            name: name.to_owned(),
            dtype: t.dtype,
            shape: shapes.local_shape.clone(),
            x,
            placed: Some((t, axis_maps(t, shapes, layout))),
            pad: dtype::pad_bytes(if narrow { x.dtype() } else { t.dtype }, t.pad_value),
            plan,
            layout,
            compact: None,
            given: given_as_indices(t, x.dtype(), &x.shape()),
            entries: None,
            narrow,
        })
    }

    /// The same, able to write compact blocks of a one-hot feature from its `indices`
    /// (as [`Placed::compact`] holds them); other features ignore them.
    pub(crate) fn with_compact(mut self, indices: Option<&'p Array<'static>>) -> Self {
        let one_hot = self
            .placed
            .as_ref()
            .and_then(|(t, _)| OneHot::of(t, &self.shape));
        self.compact = one_hot.zip(indices);
        self
    }

    /// The same, a sparse feature able to write compact blocks of `entries` rows (as
    /// [`Placed::entries`] holds it); other features ignore it.
    pub(crate) fn with_entries(mut self, entries: Option<usize>) -> Self {
        self.entries = entries;
        self
    }

    /// How the feature's compact block expands (`None`: it travels as its block).
    pub fn form(&self) -> Option<Form> {
        self.stored().map(|(form, _, _)| form)
    }

    /// The compact form, dtype and shape of the feature's blocks, where it has one and
    /// can write it (a one-hot feature's indices were given, a sparse feature's room
    /// for entries counted, a mask, a ranged feature).
    fn stored(&self) -> Option<(Form, DType, Vec<usize>)> {
        let (t, _) = self.placed.as_ref()?;
        let can = self.compact.is_some()
            || self.is_mask()
            || narrowed(t).is_some()
            || (t.sparse && self.entries.is_some());
        can.then(|| stored_form(t, &self.shape, self.entries.unwrap_or(0)))
            .flatten()
    }

    /// The entries of a sparse feature's block on the rank at `coord` (of any
    /// feature: its nonzero elements).
    pub(crate) fn count_entries(&self, coord: Coord) -> io::Result<usize> {
        let mut count = Entries::counter(self.dtype);
        self.write(coord, &mut count)?;
        Ok(count.count())
    }

    /// Whether the feature is a mask, which travels compact as bits.
    pub(crate) fn is_mask(&self) -> bool {
        matches!(&self.placed, Some((t, _)) if matches!(t.role, Role::Mask { .. }))
    }

    /// The shape of a rank's compact block (`None` without a compact form): a one-hot
    /// feature's indices, or a mask's bytes of bits.
    pub fn compact_shape(&self) -> Option<Vec<usize>> {
        self.stored().map(|(_, _, shape)| shape)
    }

    /// Writes the compact block of the rank at `coord` into `sink` (see
    /// [`crate::compact`]): a one-hot feature's indices, a mask's bits, a sparse
    /// feature's entries, a ranged feature narrowed, any other feature's block.
    pub fn write_compact(&self, coord: Coord, sink: &mut impl Sink) -> io::Result<()> {
        if self.compact.is_some() {
            return self.write_indices(coord, sink);
        }
        match self.form() {
            Some(Form::Bits) => {
                let mut bits = Bits::new(sink, self.given_dtype());
                self.write_given(coord, &mut bits)?;
                bits.finish()
            }
            Some(Form::Sparse) => {
                let mut entries = Entries::new(self.dtype);
                self.write(coord, &mut entries)?;
                sink.copy(&entries.finish(self.entries.unwrap_or(0))?)
            }
            Some(Form::Narrow { index }) => {
                self.write_given(coord, &mut Cast::new(sink, self.given_dtype(), index))
            }
            _ => self.write(coord, sink),
        }
    }

    /// The dtype the sample gave the feature in: narrower than declared, or declared.
    fn given_dtype(&self) -> DType {
        if self.narrow {
            self.x.dtype()
        } else {
            self.dtype
        }
    }

    /// Writes the block of the rank at `coord` in [`Self::given_dtype`]: a block given
    /// narrow goes to a compact form unwidened (masks and ranged data, never remapped).
    fn write_given(&self, coord: Coord, sink: &mut impl Sink) -> io::Result<()> {
        match (&self.placed, self.window(coord)) {
            (Some((_, axes)), Some(window)) if self.narrow => {
                write_window(self.x, &self.pad, axes, &window, sink)
            }
            _ => self.write(coord, sink),
        }
    }

    /// A one-hot feature's compact block, row-major: the indices land in the window of
    /// the dense block, the one-hot axis left out, pads the index of no class.
    fn write_indices(&self, coord: Coord, sink: &mut impl Sink) -> io::Result<()> {
        let window = self.window(coord).ok_or_else(|| {
            io::Error::other(format!(
                "feature `{}`: no block at coordinate {coord:?} of mesh {:?}",
                self.name, self.layout.mesh
            ))
        })?;
        self.write_indices_window(&window, sink).map(|_| ())
    }

    /// The indices of `window` (of the dense padded layout) into `sink`, a map's as
    /// positions within the window; returns the one-hot form they expand by (a map's
    /// classes are the window's length of its one-hot axis).
    fn write_indices_window(
        &self,
        window: &[(usize, usize)],
        sink: &mut impl Sink,
    ) -> io::Result<Form> {
        let (Some((oh, idx)), Some((_, axes))) = (&self.compact, &self.placed) else {
            return Err(io::Error::other(format!(
                "feature `{}` has no compact form",
                self.name
            )));
        };
        let (mut axes, mut window) = (axes.clone(), window.to_vec());
        let (start, len) = window.remove(oh.axis);
        axes.remove(oh.axis);
        if !oh.map {
            write_window(idx, &oh.none_bytes(), &axes, &window, sink)?;
            return Ok(oh.form());
        }
        let mut local = InWindow {
            out: sink,
            start: start as i64,
            len: len as i64,
            buf: Vec::new(),
        };
        write_window(idx, &oh.none_bytes(), &axes, &window, &mut local)?;
        Ok(OneHot {
            classes: len,
            ..*oh
        }
        .form())
    }
}

impl FeatureBlocks<'_, '_> {
    /// Whether the feature is placed (else it is carried along whole).
    pub fn is_placed(&self) -> bool {
        self.placed.is_some()
    }

    /// Bytes of one block.
    pub fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * dtype::size(self.dtype)
    }

    /// The dtype of `part` of the feature: its compact form's indices, or its own.
    pub fn dtype_of(&self, part: Part) -> DType {
        match part {
            Part::Compact(_) => self.compact_dtype(),
            _ => self.dtype,
        }
    }

    /// The dtype of its compact blocks (its own where it has no compact form).
    pub fn compact_dtype(&self) -> DType {
        self.stored().map_or(self.dtype, |(_, dtype, _)| dtype)
    }

    /// The shape of `part` of the feature: a rank's block (on a domain plan, that
    /// rank's window: empty off the mesh), the whole padded layout, or the serial
    /// sample after intake.
    pub fn shape_of(&self, placed: &Placed, part: Part) -> Vec<usize> {
        match (part, &self.placed) {
            (Part::Compact(coord), _) => match self.compact_shape() {
                Some(shape) => shape,
                None => self.shape_of(placed, Part::Block(coord)),
            },
            (Part::Block(coord), Some(_)) if self.plan.mesh.is_domain() => self
                .window(coord)
                .map_or_else(Vec::new, |w| w.iter().map(|&(_, n)| n).collect()),
            (Part::Block(_), _) | (_, None) => self.shape.clone(),
            (Part::Padded, Some((_, axes))) => axes.iter().map(|a| a.padded).collect(),
            (Part::Serial, Some(_)) => match (self.given, self.compact) {
                (true, Some((oh, idx))) => oh.dense_shape(&idx.shape()),
                _ => placed.taken[&self.name].shape(),
            },
        }
    }

    /// Writes `part` of the feature into `sink`, row-major. A feature carried along
    /// whole is written whole whatever the part.
    pub fn write_part(&self, placed: &Placed, part: Part, sink: &mut impl Sink) -> io::Result<()> {
        match (part, &self.placed) {
            (Part::Compact(coord), _) => self.write_compact(coord, sink),
            (_, None) => write_whole(self.x, sink),
            (Part::Block(coord), Some(_)) => self.write(coord, sink),
            (Part::Padded, Some((_, axes))) => {
                let window: Vec<(usize, usize)> = axes.iter().map(|a| (0, a.padded)).collect();
                self.write_dense(axes, &window, sink)
            }
            (Part::Serial, Some(_)) if self.given => self.write_serial_given(sink),
            (Part::Serial, Some(_)) => {
                let x = &placed.taken[&self.name];
                match self.narrow {
                    true => write_whole(x, &mut Cast::new(sink, x.dtype(), self.dtype)),
                    false => write_whole(x, sink),
                }
            }
        }
    }

    /// [`FeatureBlocks::write_part`] into `out`, which must be exactly its size.
    pub fn write_part_into(&self, placed: &Placed, part: Part, out: &mut [u8]) -> io::Result<()> {
        let want = out.len();
        let mut sink = crate::sink::SliceSink::new(out);
        self.write_part(placed, part, &mut sink)?;
        if sink.written() != want {
            return Err(io::Error::other(format!(
                "feature `{}`: {} of its {want} bytes written",
                self.name,
                sink.written(),
            )));
        }
        Ok(())
    }

    /// Writes the block of the rank at CP coordinate `coord` into `sink`, row-major.
    pub fn write(&self, coord: Coord, sink: &mut impl Sink) -> io::Result<()> {
        let Some((t, axes)) = &self.placed else {
            return write_whole(self.x, sink);
        };
        let window = self.window(coord).ok_or_else(|| {
            io::Error::other(format!(
                "feature `{}`: no block at coordinate {coord:?} of mesh {:?}",
                self.name, self.layout.mesh
            ))
        })?;
        match &t.remap {
            Remap::ShardLocal { of, mesh_axis } => {
                let start = self.layout.shard_start(of, *mesh_axis, coord).unwrap_or(0);
                let mut shifted = Shift {
                    out: sink,
                    dtype: self.dtype,
                    by: start as i64,
                    none: crate::placed::index_none(t),
                    buf: Vec::new(),
                };
                self.write_dense(axes, &window, &mut shifted)
            }
            _ => self.write_dense(axes, &window, sink),
        }
    }

    /// Writes `window` of the padded layout from `x`; for a feature given as its
    /// indices (or a map known by its rows), from its indices, expanded one window at a
    /// time.
    fn write_dense(
        &self,
        axes: &[AxisMap],
        window: &[(usize, usize)],
        sink: &mut impl Sink,
    ) -> io::Result<()> {
        if self.x.entry_list().is_some() {
            return write_entries_window(self.x, axes, window, sink);
        }
        if self.narrow {
            let mut wide = Cast::new(sink, self.x.dtype(), self.dtype);
            return write_window(self.x, &self.pad, axes, window, &mut wide);
        }
        if !self.given && !self.x.is_rows_only() {
            return write_window(self.x, &self.pad, axes, window, sink);
        }
        let mut packed = Vec::new();
        let form = self.write_indices_window(window, &mut packed)?;
        let dense: Vec<usize> = window.iter().map(|&(_, n)| n).collect();
        let mut out = vec![0u8; dense.iter().product::<usize>() * dtype::size(self.dtype)];
        form.expand_into(&packed, self.dtype, &dense, &mut out);
        sink.copy(&out)
    }

    /// The serial form of a feature given as its indices: its dense expansion.
    fn write_serial_given(&self, sink: &mut impl Sink) -> io::Result<()> {
        let Some((oh, idx)) = self.compact else {
            let name = &self.name;
            return Err(io::Error::other(format!(
                "feature `{name}`: given as indices, none made"
            )));
        };
        sink.copy(&expand(&oh, &idx.contiguous().to_bytes(), &idx.shape()))
    }

    /// Writes the region `window` (`(start, len)` per axis) of the feature's padded
    /// layout into `sink`, row-major, index values in the padded layout. A window
    /// reaching past the padded shape is refused.
    pub fn write_region(&self, window: &[(usize, usize)], sink: &mut impl Sink) -> io::Result<()> {
        let Some((_, axes)) = &self.placed else {
            return Err(io::Error::other(format!(
                "feature `{}` is carried along whole: it has no padded layout",
                self.name
            )));
        };
        let fits = window.len() == axes.len()
            && window
                .iter()
                .zip(axes)
                .all(|(&(start, len), a)| start.checked_add(len).is_some_and(|e| e <= a.padded));
        if !fits {
            let padded: Vec<usize> = axes.iter().map(|a| a.padded).collect();
            return Err(io::Error::other(format!(
                "feature `{}`: window {window:?} is not inside its padded shape {padded:?}",
                self.name
            )));
        }
        self.write_dense(axes, window, sink)
    }

    /// The window of the padded layout the rank at `coord` holds: its equal block on a
    /// CP plan, its `torch.chunk` piece or equal block per axis on a domain plan.
    pub fn window(&self, coord: Coord) -> Option<Vec<(usize, usize)>> {
        let (t, axes) = self.placed.as_ref()?;
        if !self.plan.mesh.is_domain() {
            return Some(t.block_window(&self.shape, coord));
        }
        let global: Vec<usize> = axes.iter().map(|a| a.padded).collect();
        self.plan.domain_window(t, &global, self.layout.mesh, coord)
    }
}

/// Which part of a placed feature to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The block of the rank at this CP coordinate (shard-local ids shifted).
    Block(Coord),
    /// The whole padded layout: every rank's block together, index values in the
    /// padded layout, shard-local ids not yet shifted.
    Padded,
    /// The sample as intake made it: real items only, index values serial.
    Serial,
    /// The block of the rank at this CP coordinate in its compact form: a one-hot
    /// feature's indices ([`crate::compact`]); any other feature its block.
    Compact(Coord),
}

/// All of `x`, as it is.
fn write_whole(x: &Array, sink: &mut impl Sink) -> io::Result<()> {
    let shape = x.shape();
    let whole: Vec<AxisMap> = shape
        .iter()
        .map(|&padded| AxisMap {
            padded,
            positions: None,
        })
        .collect();
    let window: Vec<(usize, usize)> = shape.iter().map(|&n| (0, n)).collect();
    write_window(x, &[], &whole, &window, sink)
}

/// Shard-local ids: every real entry (each copied one; pads are filled) moved by the
/// start of its shard, but the none value, which names no item.
struct Shift<'o, S> {
    out: &'o mut S,
    dtype: DType,
    by: i64,
    none: Option<i64>,
    buf: Vec<u8>,
}

impl<S: Sink> Sink for Shift<'_, S> {
    fn copy(&mut self, bytes: &[u8]) -> io::Result<()> {
        let es = dtype::size(self.dtype);
        self.buf.clear();
        for v in bytes.chunks_exact(es) {
            let v = dtype::read_i64(self.dtype, v);
            let id = if Some(v) == self.none { v } else { v - self.by };
            dtype::encode_i64(self.dtype, id, &mut self.buf);
        }
        self.out.copy(&self.buf)
    }

    fn fill(&mut self, pad: &[u8], count: usize) -> io::Result<()> {
        self.out.fill(pad, count)
    }
}

/// A one-hot map's positions (int32) made local to a window `start..start + len` of its
/// one-hot axis; a position outside it (or none, -1) is none.
struct InWindow<'o, S> {
    out: &'o mut S,
    start: i64,
    len: i64,
    buf: Vec<u8>,
}

impl<S: Sink> Sink for InWindow<'_, S> {
    fn copy(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.buf.clear();
        for v in bytes.chunks_exact(4) {
            let p = i64::from(i32::from_le_bytes([v[0], v[1], v[2], v[3]]));
            let local = p - self.start;
            let at = if p >= 0 && (0..self.len).contains(&local) {
                local
            } else {
                -1
            };
            self.buf.extend((at as i32).to_le_bytes());
        }
        self.out.copy(&self.buf)
    }

    fn fill(&mut self, pad: &[u8], count: usize) -> io::Result<()> {
        self.out.fill(pad, count)
    }
}
