//! Masks as bits: packed as a block is written, unpacked into the dense block.

use std::io;

use featshard_spec::ir::DType;

use super::{bits, one_and_negative_zero};
use crate::dtype;
use crate::sink::Sink;

/// A sink packing a mask's elements into bits as its block is written: bit `i % 8` of
/// byte `i / 8` is element `i` (1 for any value but zero, either sign). Call
/// [`Bits::finish`] after the block to write the last, partial byte.
pub struct Bits<'o, S> {
    out: &'o mut S,
    es: usize,
    /// The bits that make an element nonzero (a float's sign bit left out).
    value: u64,
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
        Bits {
            out,
            es,
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
        // One loop per element size, each a tight loop over whole octets.
        let value = self.value;
        self.buf
            .extend(octets.by_ref().map(|octet| match octet.len() {
                8 => byte_bits(u64::from_le_bytes(octet.try_into().unwrap_or([0; 8]))),
                16 => octet_bits::<2>(octet, value),
                32 => octet_bits::<4>(octet, value),
                _ => octet_bits::<8>(octet, value),
            }));
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

/// The bits of eight one-byte elements (`word`, little-endian): bit `k` is set when
/// byte `k` is nonzero. Each byte is folded onto its low bit, then the eight low bits
/// are gathered into the top byte by one multiplication.
fn byte_bits(word: u64) -> u8 {
    const LOW: u64 = 0x0101_0101_0101_0101;
    let mut t = (word | word >> 4) & 0x0f0f_0f0f_0f0f_0f0f;
    t = (t | t >> 2) & 0x0303_0303_0303_0303;
    t = (t | t >> 1) & LOW;
    (t.wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8
}

/// The bits of eight `N`-byte elements (`octet`): bit `k` is set when element `k` has
/// any bit of `value` set.
fn octet_bits<const N: usize>(octet: &[u8], value: u64) -> u8 {
    octet.chunks_exact(N).enumerate().fold(0, |byte, (k, e)| {
        let mut word = [0u8; 8];
        word[..N].copy_from_slice(e);
        byte | u8::from(u64::from_le_bytes(word) & value != 0) << k
    })
}

/// Bytes of a mask of `numel` elements packed into bits.
pub(crate) fn bits_len(numel: usize) -> usize {
    numel.div_ceil(8)
}

/// The dense bytes (`numel` elements of `dtype`, 0 or 1) of a mask packed by [`Bits`].
#[cfg(test)]
pub(crate) fn unpack_bits(packed: &[u8], numel: usize, dtype: DType) -> Vec<u8> {
    let mut out = vec![0u8; numel * dtype::size(dtype)];
    unpack_bits_into(packed, numel, dtype, &mut out);
    out
}

/// A mask packed by [`Bits`] unpacked into `out` (exactly the mask's bytes, each written).
pub(super) fn unpack_bits_into(packed: &[u8], numel: usize, dtype: DType, out: &mut [u8]) {
    match dtype::size(dtype) {
        1 => unpack::<1>(packed, numel, dtype, out),
        2 => unpack::<2>(packed, numel, dtype, out),
        4 => unpack::<4>(packed, numel, dtype, out),
        _ => unpack::<8>(packed, numel, dtype, out),
    }
}

/// [`unpack_bits_into`] for elements of `N` bytes: the eight elements of every packed
/// byte looked up in a table, one copy of a constant length (a few stores) per byte.
fn unpack<const N: usize>(packed: &[u8], numel: usize, dtype: DType, out: &mut [u8]) {
    let one = dtype::one_as::<N>(dtype);
    let mut table = [[[0u8; N]; 8]; 256];
    for (b, octet) in table.iter_mut().enumerate() {
        for (k, e) in octet.iter_mut().enumerate() {
            if b >> k & 1 == 1 {
                *e = one;
            }
        }
    }
    let mut octets = out[..numel * N].chunks_exact_mut(8 * N);
    for (octet, &b) in octets.by_ref().zip(packed) {
        octet.copy_from_slice(table[usize::from(b)].as_flattened());
    }
    let rest = octets.into_remainder();
    if let Some(&b) = packed.get(numel / 8) {
        rest.copy_from_slice(&table[usize::from(b)].as_flattened()[..rest.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_bytes_give_one_bit_each_for_any_nonzero_value() {
        for k in 0..8 {
            for v in [1u64, 2, 0x10, 0x80, 0xff] {
                assert_eq!(byte_bits(v << (8 * k)), 1 << k, "byte {k} = {v}");
            }
        }
        assert_eq!(byte_bits(0), 0);
        assert_eq!(byte_bits(u64::MAX), 0xff);
        assert_eq!(byte_bits(0x0001_0000_0300_0001), 0b0100_1001);
    }

    #[test]
    fn long_masks_of_mixed_bits_round_trip_in_every_dtype() {
        // A pseudo-random mask (no runs to shortcut), written in pieces of odd lengths.
        let mut state = 7u32;
        let values: Vec<i64> = (0..1001)
            .map(|_| {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                i64::from(state >> 16 & 1)
            })
            .collect();
        for d in DType::ALL {
            let mut dense = Vec::new();
            values
                .iter()
                .for_each(|&v| dtype::encode_i64(d, v, &mut dense));
            let es = dtype::size(d);
            let mut packed = Vec::new();
            let mut bits = Bits::new(&mut packed, d);
            for piece in dense.chunks(37 * es) {
                bits.copy(piece).expect("copy");
            }
            bits.finish().expect("finish");
            assert_eq!(packed.len(), bits_len(values.len()), "{d}");
            let mut out = vec![0xAA; dense.len()];
            unpack_bits_into(&packed, values.len(), d, &mut out);
            assert_eq!(out, dense, "{d}");
        }
    }
}
