//! Memory whose size comes from user data, allocated so that a size past what the
//! machine can give fails as an error naming what it was for (an allocation failure
//! in Rust's ordinary collections aborts the process instead).

use crate::error::ExecError;

/// `bytes` zeroed bytes for `what` (say "feature `res_type`'s dense block").
pub(crate) fn zeroed(what: &str, bytes: usize) -> Result<Vec<u8>, ExecError> {
    let mut out = with_capacity(what, bytes, 1)?;
    out.resize(bytes, 0);
    Ok(out)
}

/// An empty vector with room for `n` items of `item_bytes` each, for `what`.
pub(crate) fn with_capacity<T>(
    what: &str,
    n: usize,
    item_bytes: usize,
) -> Result<Vec<T>, ExecError> {
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|e| ExecError::Alloc {
        what: what.to_owned(),
        bytes: n.saturating_mul(item_bytes),
        message: e.to_string(),
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_past_memory_is_an_error_naming_what_and_how_much() {
        let e = zeroed("feature `x`'s dense block", usize::MAX / 2).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("feature `x`'s dense block"), "{text}");
        assert!(text.contains(&(usize::MAX / 2).to_string()), "{text}");
        assert_eq!(zeroed("small", 5).unwrap(), vec![0; 5]);
        let v: Vec<u64> = with_capacity("entries", 3, 8).unwrap();
        assert!(v.capacity() >= 3);
    }
}
