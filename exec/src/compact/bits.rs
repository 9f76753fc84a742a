//! Masks as bits: packed as a block is written, unpacked into the dense block.

use std::io;

use featshard_spec::ir::DType;

use super::{bits, one_and_negative_zero};
use crate::dtype;
use crate::window::Sink;

/// A sink packing a mask's elements into bits as its block is written: bit `i % 8` of
/// byte `i / 8` is element `i` (1 for any value but zero, either sign). Call
/// [`Bits::finish`] after the block to write the last, partial byte.
pub struct Bits<'o, S> {
    out: &'o mut S,
    es: usize,
    /// The bits that make an element nonzero (a float's sign bit left out).
    value: u64,
    /// Eight elements holding 1.
    ones: Vec<u8>,
    byte: u8,
    filled: u32,
    buf: Vec<u8>,
}

impl<'o, S: Sink> Bits<'o, S> {
    /// Packs elements of `dtype` into `out`.
    pub fn new(out: &'o mut S, dtype: DType) -> Self {
        let es = dtype::size(dtype);
        let all = if es == 8 {
            u64::MAX
        } else {
            (1u64 << (8 * es)) - 1
        };
        let mut one = Vec::new();
        dtype::encode_i64(dtype, 1, &mut one);
        Bits {
            out,
            es,
            ones: one.repeat(8),
            value: all & !one_and_negative_zero(dtype).1.unwrap_or(0),
            byte: 0,
            filled: 0,
            buf: Vec::new(),
        }
    }

    fn push(&mut self, bit: bool) {
        self.byte |= u8::from(bit) << self.filled;
        self.filled += 1;
        if self.filled == 8 {
            self.buf.push(self.byte);
            (self.byte, self.filled) = (0, 0);
        }
    }

    fn set(&self, e: &[u8]) -> bool {
        let v = match *e {
            [a] => u64::from(a),
            [a, b] => u64::from(u16::from_le_bytes([a, b])),
            [a, b, c, d] => u64::from(u32::from_le_bytes([a, b, c, d])),
            _ => bits(e),
        };
        v & self.value != 0
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.copy(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    /// Writes the last, partial byte (its unused bits 0).
    pub fn finish(mut self) -> io::Result<()> {
        if self.filled > 0 {
            self.buf.push(self.byte);
        }
        self.flush()
    }
}

impl<S: Sink> Sink for Bits<'_, S> {
    fn copy(&mut self, bytes: &[u8]) -> io::Result<()> {
        // The partial byte first, then whole bytes of eight elements at a time.
        let lead = (((8 - self.filled) % 8) as usize * self.es).min(bytes.len());
        for e in bytes[..lead].chunks_exact(self.es) {
            let bit = self.set(e);
            self.push(bit);
        }
        let mut octets = bytes[lead..].chunks_exact(8 * self.es);
        for octet in octets.by_ref() {
            // Masks are mostly long runs of 0 or of one value: those compare whole.
            let byte = if octet.iter().all(|&b| b == 0) {
                0
            } else if octet == self.ones.as_slice() {
                0xff
            } else {
                octet
                    .chunks_exact(self.es)
                    .enumerate()
                    .fold(0u8, |b, (j, e)| b | u8::from(self.set(e)) << j)
            };
            self.buf.push(byte);
        }
        for e in octets.remainder().chunks_exact(self.es) {
            let bit = self.set(e);
            self.push(bit);
        }
        self.flush()
    }

    fn fill(&mut self, pad: &[u8], count: usize) -> io::Result<()> {
        let bit = self.set(pad);
        let mut left = count;
        while left > 0 && self.filled != 0 {
            self.push(bit);
            left -= 1;
        }
        let whole = left / 8;
        self.buf
            .extend(std::iter::repeat_n(if bit { 0xff } else { 0 }, whole));
        (0..left % 8).for_each(|_| self.push(bit));
        self.flush()
    }
}

/// Bytes of a mask of `numel` elements packed into bits.
pub fn bits_len(numel: usize) -> usize {
    numel.div_ceil(8)
}

/// The dense bytes (`numel` elements of `dtype`, 0 or 1) of a mask packed by [`Bits`].
pub fn unpack_bits(packed: &[u8], numel: usize, dtype: DType) -> Vec<u8> {
    let mut out = vec![0u8; numel * dtype::size(dtype)];
    unpack_bits_into(packed, numel, dtype, &mut out);
    out
}

/// [`unpack_bits`] into `out` (zeroed, exactly the mask's bytes).
pub(super) fn unpack_bits_into(packed: &[u8], numel: usize, dtype: DType, out: &mut [u8]) {
    let es = dtype::size(dtype);
    let mut one = Vec::new();
    dtype::encode_i64(dtype, 1, &mut one);
    let ones = one.repeat(8);
    // Eight elements per packed byte: a byte of no bits is left zero, one of all bits
    // copied whole (masks are mostly long runs of either).
    for (octet, &b) in out[..numel * es].chunks_mut(8 * es).zip(packed) {
        match b {
            0 => {}
            0xff if octet.len() == ones.len() => octet.copy_from_slice(&ones),
            _ => octet
                .chunks_exact_mut(es)
                .enumerate()
                .filter(|(k, _)| b >> k & 1 == 1)
                .for_each(|(_, e)| e.copy_from_slice(&one)),
        }
    }
}
