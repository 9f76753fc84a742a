//! Files memory-mapped through libtorch (`from_file`: the file opened read-only and
//! mapped copy-on-write); tensors over a mapping are views of its bytes, and keep it
//! alive. (The byte executor, `featshard-exec`, maps files itself and gives pages back
//! as it writes; this runtime reads samples whole.)

use tch::{Device, Kind, TchError, Tensor};

/// One file mapped whole; tensors over it are views of [`Mapping::bytes`].
#[derive(Debug)]
pub struct Mapping {
    bytes: Tensor,
}

impl Mapping {
    /// Maps the first `len` bytes of `file` (at least 1).
    pub(crate) fn open(file: &str, len: u64) -> Result<Mapping, TchError> {
        let bytes = Tensor::f_from_file(file, false, Some(len as i64), (Kind::Uint8, Device::Cpu))?;
        Ok(Mapping { bytes })
    }

    /// Bytes `start..start + len` of the file, as a view.
    pub(crate) fn bytes(&self, start: u64, len: u64) -> Result<Tensor, TchError> {
        self.bytes.f_narrow(0, start as i64, len as i64)
    }
}
