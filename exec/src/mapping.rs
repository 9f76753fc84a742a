//! A file memory-mapped read-only, and its resident pages given back once read
//! (`madvise(MADV_DONTNEED)`), so that a large input leaves memory as its rank files
//! are written. The crate's one boundary with the OS's memory maps.

#![allow(unsafe_code)]

use std::fs::File;
use std::marker::PhantomData;

use memmap2::{Mmap, UncheckedAdvice};

/// One file mapped whole, read-only.
#[derive(Debug)]
pub struct Mapping {
    map: Mmap,
}

impl Mapping {
    /// Maps `file`.
    pub fn open(file: &File) -> std::io::Result<Mapping> {
        // SAFETY: the map is read-only and private to this process. A file changed or
        // truncated by another process while mapped is undefined behaviour, as for any
        // memory map (safetensors' own loaders map files the same way); featshard reads
        // its input files and never writes them.
        let map = unsafe { memmap2::MmapOptions::new().map(file)? };
        Ok(Mapping { map })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// A handle that gives pages back, for any thread, while the mapping lives.
    pub fn pages(&self) -> Pages<'_> {
        Pages {
            map: &self.map,
            _alive: PhantomData,
        }
    }
}

/// Gives back resident pages of a live [`Mapping`].
#[derive(Clone, Copy, Debug)]
pub struct Pages<'a> {
    map: &'a Mmap,
    _alive: PhantomData<&'a ()>,
}

impl Pages<'_> {
    /// Gives back the resident whole pages of `bytes`, when they lie inside the mapping
    /// (bytes of any other memory are left alone: giving them back would lose data).
    pub fn release(&self, bytes: &[u8]) {
        let base = self.map.as_ptr() as usize;
        let at = bytes.as_ptr() as usize;
        let end = at.saturating_add(bytes.len());
        if at < base || end > base + self.map.len() {
            return;
        }
        let page = page_size();
        let (start, end) = (
            (at - base).next_multiple_of(page),
            (end - base) / page * page,
        );
        if start >= end {
            return;
        }
        // SAFETY: the range lies inside the mapping, which `Pages` borrows. It is a
        // read-only mapping of a file, so its pages are never dirty: dropping them loses
        // nothing, and the next read maps the same bytes in again from the file. No
        // reference into the range is invalidated (the memory stays mapped).
        unsafe {
            let _ = self
                .map
                .unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start);
        }
    }
}

fn page_size() -> usize {
    // SAFETY: `sysconf` with a valid name has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096).max(1)
}
