//! Where written bytes go: a [`Sink`] takes a block's bytes as runs, fills and sparse
//! entries; memory (`Vec<u8>`, [`SliceSink`]) and files implement it.

use std::io;

/// Where a window's bytes go.
pub trait Sink {
    /// Appends bytes of whole elements.
    fn copy(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Appends `count` copies of the element `pad`.
    fn fill(&mut self, pad: &[u8], count: usize) -> io::Result<()>;
    /// Appends `len` elements of `es` bytes, zero but for `entries`: each an element's
    /// position among them and its bits, in ascending position. A sink that keeps
    /// entries, or zeroes memory it owns, takes them without the dense bytes.
    fn sparse(&mut self, len: usize, es: usize, entries: &[(usize, u64)]) -> io::Result<()> {
        let mut out = vec![0u8; len * es];
        put_entries(&mut out, es, entries);
        self.copy(&out)
    }
}

/// Each of `entries` (position, bits) written into `out`, elements of `es` bytes.
pub(crate) fn put_entries(out: &mut [u8], es: usize, entries: &[(usize, u64)]) {
    for &(p, v) in entries {
        out[p * es..(p + 1) * es].copy_from_slice(&v.to_le_bytes()[..es]);
    }
}

impl Sink for Vec<u8> {
    fn copy(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.extend_from_slice(bytes);
        Ok(())
    }

    fn fill(&mut self, pad: &[u8], count: usize) -> io::Result<()> {
        self.reserve(pad.len() * count);
        for _ in 0..count {
            self.extend_from_slice(pad);
        }
        Ok(())
    }
}

/// A block written into memory the caller owns, exactly filled.
#[derive(Debug)]
pub struct SliceSink<'b> {
    out: &'b mut [u8],
    at: usize,
}

impl<'b> SliceSink<'b> {
    /// Writes into `out` from its start.
    pub fn new(out: &'b mut [u8]) -> Self {
        SliceSink { out, at: 0 }
    }

    /// Bytes written so far.
    pub fn written(&self) -> usize {
        self.at
    }

    fn next(&mut self, n: usize) -> io::Result<&mut [u8]> {
        let end = self.at + n;
        if end > self.out.len() {
            return Err(io::Error::other(format!(
                "a block of {} bytes does not hold {end}",
                self.out.len()
            )));
        }
        let part = &mut self.out[self.at..end];
        self.at = end;
        Ok(part)
    }
}

impl Sink for SliceSink<'_> {
    fn copy(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.next(bytes.len())?.copy_from_slice(bytes);
        Ok(())
    }

    fn fill(&mut self, pad: &[u8], count: usize) -> io::Result<()> {
        let part = self.next(pad.len() * count)?;
        if pad.iter().all(|&b| b == pad[0]) {
            part.fill(pad.first().copied().unwrap_or(0));
        } else {
            part.chunks_exact_mut(pad.len())
                .for_each(|c| c.copy_from_slice(pad));
        }
        Ok(())
    }

    fn sparse(&mut self, len: usize, es: usize, entries: &[(usize, u64)]) -> io::Result<()> {
        let part = self.next(len * es)?;
        part.fill(0);
        put_entries(part, es, entries);
        Ok(())
    }
}
