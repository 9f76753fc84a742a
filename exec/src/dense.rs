//! One feature's values owned whole: what the way back gives and a map's given form
//! is rewritten into. A leaf: it imports nothing of the crate.

use featshard_spec::ir::DType;

/// One feature's values, owned: dtype, shape and row-major bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dense {
    /// The dtype.
    pub dtype: DType,
    /// The shape.
    pub shape: Vec<usize>,
    /// The row-major bytes.
    pub bytes: Vec<u8>,
}
