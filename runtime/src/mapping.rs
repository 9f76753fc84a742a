//! Files memory-mapped through libtorch (`from_file`: the file opened read-only and
//! mapped copy-on-write), and this crate's one direct call into the OS: giving back the
//! resident pages of a range already read (`madvise(MADV_DONTNEED)`), so that a large
//! input leaves memory as its rank files are written. The FFI boundary for memory maps.

#![allow(unsafe_code)]

use std::marker::PhantomData;

use tch::{Device, Kind, TchError, Tensor};

/// One file mapped whole; tensors over it are views of [`Mapping::bytes`].
#[derive(Debug)]
pub struct Mapping {
    bytes: Tensor,
    base: usize,
    len: usize,
}

impl Mapping {
    /// Maps the first `len` bytes of `file` (at least 1).
    pub(crate) fn open(file: &str, len: u64) -> Result<Mapping, TchError> {
        let bytes = Tensor::f_from_file(file, false, Some(len as i64), (Kind::Uint8, Device::Cpu))?;
        let base = bytes.data_ptr() as usize;
        Ok(Mapping {
            bytes,
            base,
            len: len as usize,
        })
    }

    /// Bytes `start..start + len` of the file, as a view.
    pub(crate) fn bytes(&self, start: u64, len: u64) -> Result<Tensor, TchError> {
        self.bytes.f_narrow(0, start as i64, len as i64)
    }

    /// The mapping's address range, to give pages back from any thread while the
    /// mapping lives.
    pub(crate) fn pages(&self) -> Pages<'_> {
        Pages {
            base: self.base,
            len: self.len,
            _alive: PhantomData,
        }
    }
}

/// The address range of a live [`Mapping`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pages<'a> {
    base: usize,
    len: usize,
    _alive: PhantomData<&'a ()>,
}

impl Pages<'_> {
    /// Gives back the resident pages of the whole mapping.
    pub(crate) fn release_all(&self) {
        self.release(self.base, self.len);
    }

    /// Gives back the resident whole pages of `len` bytes at address `at`. Nothing is
    /// done unless the range lies inside this mapping: for memory that is not a view
    /// of it (a tensor made by the pipeline), giving pages back would lose data.
    pub(crate) fn release(&self, at: usize, len: usize) {
        let end = at.saturating_add(len);
        if at < self.base || end > self.base + self.len {
            return;
        }
        let page = page_size();
        let (start, end) = (at.next_multiple_of(page), end / page * page);
        if start >= end {
            return;
        }
        // SAFETY: `start..end` lies inside the mapping whose lifetime `Pages` borrows. It
        // is a private mapping of a file opened read-only, and the pipeline only reads
        // it (every tensor it makes is new memory), so dropping its resident pages
        // loses nothing: the next read maps the same bytes in again from the file.
        // `madvise` fails only on bad arguments, and then leaves the pages as they are.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}

fn page_size() -> usize {
    // SAFETY: `sysconf` with a valid name has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096).max(1)
}
