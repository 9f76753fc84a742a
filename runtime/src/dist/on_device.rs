//! Compact blocks expanded by torch on the device their buffer arrived on: on a CUDA
//! mesh NCCL scatters every rank's buffer into its GPU's memory, and the dense blocks
//! are made there, so neither they nor the compact blocks cross PCIe. On the host the
//! executor expands them instead (`featshard_exec::compact::Form::expand_into`, which
//! also checks them); this module interprets the executor's recipe of each block
//! (`featshard_exec::compact::Recipe`) with torch's own kernels, to the same bytes.

use featshard_exec::compact::{Recipe, Table};
use featshard_spec::ir::DType;
use tch::{Device, Kind, TchError, Tensor};

use crate::kind::kind_of;

/// `packed`, a compact block, expanded into `out` (its dense block, of `dtype`) on
/// `packed`'s device by torch, as `recipe` says (see `featshard_exec::compact::Recipe`).
pub fn expand_into(
    packed: &Tensor,
    recipe: &Recipe,
    dtype: DType,
    out: &Tensor,
) -> Result<(), TchError> {
    let kind = kind_of(dtype);
    let mut out = out.shallow_clone();
    match recipe {
        Recipe::Rows {
            table,
            clamp,
            numel,
            rows_shape,
            axis,
        } => {
            let mut idx = packed.f_to_kind(Kind::Int64)?;
            if let Some((lo, hi)) = *clamp {
                idx = idx.f_clamp(lo, hi)?;
                // -1 picks the last row: index_select takes no negative index.
                let last = table.rows() as i64 - 1;
                idx = idx.f_where_scalarother(&idx.f_ge(0)?, last)?;
            }
            let rows = rows_of(table, kind, packed.device())?
                .f_index_select(0, &idx.f_view([-1])?)?
                .f_view([-1])?
                .f_narrow(0, 0, *numel as i64)?
                .f_view(dims(rows_shape).as_slice())?;
            let last = rows_shape.len() as i64 - 1;
            out.f_copy_(&rows.f_movedim([last], [*axis as i64])?)?;
        }
        Recipe::Scatter { axis, classes } => {
            let idx = packed.f_to_kind(Kind::Int64)?;
            let real = idx.f_ge(0)?.f_logical_and(&idx.f_lt(*classes as i64)?)?;
            // An index naming no class scatters its zero to class 0.
            let at = idx.f_mul(&real)?.f_unsqueeze(*axis as i64)?;
            drop(out.f_zero_()?);
            let ones = real.f_unsqueeze(*axis as i64)?.f_to_kind(kind)?;
            drop(out.f_scatter_(*axis as i64, &at, &ones)?);
        }
        Recipe::Entries {
            row_bytes,
            value_at,
            numel,
        } => {
            let row_bytes = *row_bytes as i64;
            let rows = packed
                .f_contiguous()?
                .f_view_dtype(Kind::Uint8)?
                .f_view([-1, row_bytes])?;
            let at = rows
                .f_narrow(1, 0, 8)?
                .f_contiguous()?
                .f_view_dtype(Kind::Int64)?
                .f_view([-1])?;
            let numel = *numel as i64;
            let at = at.f_where_scalarother(&at.f_ge(0)?, numel)?;
            let values = rows
                .f_narrow(1, *value_at as i64, kind.elt_size_in_bytes() as i64)?
                .f_contiguous()?
                .f_view_dtype(kind)?
                .f_view([-1])?;
            let mut spare = Tensor::f_zeros([numel + 1], (kind, out.device()))?;
            drop(spare.f_index_put_(&[Some(at)], &values, false)?);
            out.f_copy_(&spare.f_narrow(0, 0, numel)?.f_view_as(&out)?)?;
        }
        Recipe::Cast => out.f_copy_(packed)?,
    }
    Ok(())
}

/// `table`'s rows as `kind` on `device`.
fn rows_of(table: &Table, kind: Kind, device: Device) -> Result<Tensor, TchError> {
    Tensor::from_slice(&table.elements())
        .f_view([table.rows() as i64, table.width() as i64])?
        .f_to_kind(kind)?
        .f_to_device(device)
}

fn dims(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

/// `packed`, a compact block, as its dense block of `dtype` and `shape` in a new tensor
/// on `packed`'s device (see [`expand_into`]).
pub fn expanded(
    packed: &Tensor,
    recipe: &Recipe,
    dtype: DType,
    shape: &[usize],
) -> Result<Tensor, TchError> {
    let out = Tensor::f_empty(dims(shape).as_slice(), (kind_of(dtype), packed.device()))?;
    expand_into(packed, recipe, dtype, &out)?;
    Ok(out)
}

/// `tensors` on `device` by one copy: their bytes packed into one host buffer first,
/// laid out as a rank buffer is (`featshard_exec::buffer::packed`), so that many small
/// blocks cost one transfer, not one each; each comes back as a view of the copy, of
/// its kind and shape.
pub fn moved_together(tensors: &[&Tensor], device: Device) -> Result<Vec<Tensor>, TchError> {
    let sizes: Vec<usize> = tensors.iter().map(|t| byte_len(t) as usize).collect();
    let (at, total) = featshard_exec::buffer::packed(&sizes);
    let at: Vec<i64> = at.into_iter().map(|a| a as i64).collect();
    let host = Tensor::f_empty([total as i64], (Kind::Uint8, Device::Cpu))?;
    for (t, &a) in tensors.iter().zip(&at) {
        bytes_at(&host, a, t)?.f_copy_(t)?;
    }
    let there = host.f_to_device(device)?;
    tensors
        .iter()
        .zip(&at)
        .map(|(t, &a)| bytes_at(&there, a, t))
        .collect()
}

fn byte_len(t: &Tensor) -> i64 {
    (t.numel() * t.kind().elt_size_in_bytes()) as i64
}

/// The bytes of `buffer` from `at` as a tensor of `like`'s kind and shape.
fn bytes_at(buffer: &Tensor, at: i64, like: &Tensor) -> Result<Tensor, TchError> {
    buffer
        .f_narrow(0, at, byte_len(like))?
        .f_view_dtype(like.kind())?
        .f_view(like.size().as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;
    use featshard_exec::compact::Form;
    use featshard_exec::dtype;

    /// A dense block of `shape` and `dtype` from its executor's expansion of `packed`,
    /// and from torch's, as bytes.
    fn both(
        form: Form,
        stored: (DType, &[usize], &[u8]),
        dtype: DType,
        shape: &[usize],
    ) -> (Vec<u8>, Vec<u8>) {
        let mut want = vec![0xAB; shape.iter().product::<usize>() * dtype::size(dtype)];
        form.expand_into(stored.2, dtype, shape, &mut want);
        let dims: Vec<i64> = stored.1.iter().map(|&d| d as i64).collect();
        let packed = Tensor::from_slice(stored.2)
            .view_dtype(kind_of(stored.0))
            .view(dims.as_slice());
        let dense: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let out = Tensor::full(dense.as_slice(), 7, (kind_of(dtype), Device::Cpu));
        expand_into(&packed, &form.recipe(shape), dtype, &out).expect("expanded");
        let mut got = vec![0u8; want.len()];
        out.view_dtype(Kind::Uint8)
            .view([-1])
            .copy_data_u8(&mut got, want.len());
        (want, got)
    }

    /// `values` as elements of `d`.
    fn ints(d: DType, values: &[i64]) -> Vec<u8> {
        let mut out = vec![0; values.len() * dtype::size(d)];
        dtype::write_ints(d, values, &mut out);
        out
    }

    const DENSE: [DType; 6] = [
        DType::Bool,
        DType::Uint8,
        DType::Int64,
        DType::Float16,
        DType::Bfloat16,
        DType::Float32,
    ];

    #[test]
    fn one_hot_rows_and_map_rows_with_none_match_the_executor_on_any_axis() {
        // Indices of 5 classes; 5 (a feature's pad row) and -1 (a map's none) name none.
        let idx: Vec<i64> = vec![0, 4, 5, 2, -1, 1, 3, 3];
        for (axis, compact) in [(1, vec![8]), (1, vec![2, 4]), (2, vec![2, 4]), (0, vec![8])] {
            for index in [DType::Int16, DType::Int32] {
                let packed = ints(index, &idx);
                let mut dense = compact.clone();
                dense.insert(axis, 5);
                for d in DENSE {
                    let form = Form::OneHot {
                        axis,
                        classes: 5,
                        index,
                        map: index == DType::Int32,
                    };
                    let (want, got) = both(form, (index, &compact, &packed), d, &dense);
                    assert!(got == want, "axis {axis}, {index:?} indices, {d:?}");
                }
            }
        }
    }

    #[test]
    fn bits_match_the_executor_to_the_last_partial_byte() {
        let packed: Vec<u8> = vec![0b1010_0101, 0xFF, 0, 0b0000_0110];
        for d in DENSE {
            let (want, got) = both(Form::Bits, (DType::Uint8, &[4], &packed), d, &[3, 9]);
            assert!(got == want, "{d:?}");
        }
    }

    #[test]
    fn sparse_entries_match_the_executor_past_the_last() {
        for d in [DType::Int64, DType::Float32, DType::Bfloat16, DType::Uint8] {
            let mut packed = Vec::new();
            for (position, value) in [(3i64, 1), (0, 7), (10, 3), (-1, 5)] {
                packed.extend_from_slice(&position.to_le_bytes());
                let mut bits = Vec::new();
                dtype::encode_i64(d, value, &mut bits);
                bits.resize(8, 0);
                packed.extend_from_slice(&bits);
            }
            let (want, got) = both(Form::Sparse, (DType::Int64, &[4, 2], &packed), d, &[3, 4]);
            assert!(got == want, "{d:?}");
            assert!(want.iter().any(|&b| b != 0), "{d:?}: some element is set");
        }
    }

    #[test]
    fn narrowed_integers_widen_as_the_executor_widens_them() {
        let values: Vec<i64> = vec![0, 1, 127, -128, -1, 42];
        for (index, d) in [
            (DType::Int8, DType::Int64),
            (DType::Uint8, DType::Int32),
            (DType::Int16, DType::Int64),
        ] {
            let kept: Vec<i64> = values
                .iter()
                .map(|&v| if index == DType::Uint8 { v & 0xFF } else { v })
                .collect();
            let packed = ints(index, &kept);
            let (want, got) = both(
                Form::Narrow { index },
                (index, &[2, 3], &packed),
                d,
                &[2, 3],
            );
            assert!(got == want, "{index:?} to {d:?}");
        }
    }

    /// The executor's shared expansion vectors (every form, every dense dtype, the
    /// edge rows): torch's expansion gives each vector's dense bytes exactly.
    #[test]
    fn torch_expands_every_shared_vector_as_the_executor_does() {
        let all = featshard_exec::vectors::expansion_vectors();
        assert!(all.len() > 40);
        for v in &all {
            let s = &v.slot;
            let e = s.compact.as_ref().expect("a compact slot");
            let dims: Vec<i64> = s.shape.iter().map(|&d| d as i64).collect();
            let packed = Tensor::from_slice(&v.packed)
                .view_dtype(kind_of(s.dtype))
                .view(dims.as_slice());
            let out = expanded(&packed, &e.recipe(), e.dtype, &e.shape).expect("expanded");
            let mut got = vec![0u8; v.dense.len()];
            out.contiguous()
                .view_dtype(Kind::Uint8)
                .view([-1])
                .copy_data_u8(&mut got, v.dense.len());
            assert!(got == v.dense, "vector {}", s.name);
        }
    }

    #[test]
    fn blocks_moved_together_keep_their_bytes_kinds_and_shapes() {
        let blocks = [
            Tensor::from_slice(&[1u8, 2, 3]),
            Tensor::from_slice(&[-1i64, 7, 1 << 40, 0, 5, 6]).view([3, 2]),
            Tensor::from_slice(&[0.5f32, -0.0, 3.0, 1e-30]).view([2, 2]),
            Tensor::from_slice(&[true, false, true, true, false]),
            Tensor::zeros([0, 4], (Kind::Int, Device::Cpu)),
            Tensor::from_slice(&[9i16]),
        ];
        let refs: Vec<&Tensor> = blocks.iter().collect();
        let moved = moved_together(&refs, Device::Cpu).expect("moved");
        for (a, b) in blocks.iter().zip(&moved) {
            assert_eq!((a.kind(), a.size()), (b.kind(), b.size()));
            assert!(a.equal(b), "{a} against {b}");
        }
    }
}
