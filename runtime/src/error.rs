//! Runtime errors: the executors' shared [`RuntimeError`], and libtorch's errors
//! attached to the feature they happened on.

pub use featshard_exec::ExecError as RuntimeError;

/// Attaches the feature name to a libtorch error.
pub(crate) trait TorchContext<T> {
    fn feature(self, name: &str) -> Result<T, RuntimeError>;
}

impl<T> TorchContext<T> for Result<T, tch::TchError> {
    fn feature(self, name: &str) -> Result<T, RuntimeError> {
        self.map_err(|e| torch(name, &e))
    }
}

/// A libtorch error on feature `name`.
pub(crate) fn torch(name: &str, e: &tch::TchError) -> RuntimeError {
    RuntimeError::Torch {
        feature: name.to_owned(),
        message: e.to_string(),
    }
}
