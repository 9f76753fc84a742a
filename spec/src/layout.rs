//! Owner-partitioned layouts in numbers: how items (atoms, R rows) owned by tokens are
//! laid out in equal padded blocks.
//!
//! The owner axis (padded) is split into `blocks` equal ranges; block `b` holds the
//! items of its owners, in order, followed by pad items up to `per_block`, the largest
//! block's count. With `blocks` a multiple of every mesh axis that shards the items,
//! each shard is a whole number of blocks on any mesh, square or not.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The equal-block layout of one owned semantic for one sample.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BlockLayout {
    /// How many equal blocks the root axis is cut into (the lcm of the mesh axes' sizes).
    pub blocks: usize,
    /// Padded items per block (the largest block's item count).
    pub per_block: usize,
    /// Real items in each block.
    pub block_counts: Vec<usize>,
}

impl BlockLayout {
    /// Builds the layout from the block of every item.
    pub fn from_item_blocks(item_blocks: &[usize], blocks: usize) -> BlockLayout {
        let blocks = blocks.max(1);
        let mut block_counts = vec![0usize; blocks];
        for &b in item_blocks {
            block_counts[b.min(blocks - 1)] += 1;
        }
        let per_block = block_counts.iter().copied().max().unwrap_or(0);
        BlockLayout {
            blocks,
            per_block,
            block_counts,
        }
    }

    /// Padded length of the owned axis.
    pub fn padded(&self) -> usize {
        self.blocks * self.per_block
    }

    /// Position of every item in the padded layout, given the block of each item's
    /// owner. Items keep their relative order within a block.
    pub fn positions(&self, item_blocks: &[usize]) -> Vec<usize> {
        let mut filled = vec![0usize; self.blocks];
        item_blocks
            .iter()
            .map(|&b| {
                let b = b.min(self.blocks - 1);
                let p = b * self.per_block + filled[b];
                filled[b] += 1;
                p
            })
            .collect()
    }
}

/// The block of each owner, for `owner_padded` owners split into `blocks` blocks.
pub fn owner_block(owner: usize, owner_padded: usize, blocks: usize) -> usize {
    let per = (owner_padded / blocks.max(1)).max(1);
    (owner / per).min(blocks.max(1) - 1)
}

/// The collate re-pad of an index into an owner-partitioned layout whose per-block
/// stride grows from `old` to `new`: `(idx // old) * new + idx % old`; `None` past
/// `usize`.
pub fn repad_index(idx: usize, old: usize, new: usize) -> Option<usize> {
    if old == 0 {
        return Some(idx);
    }
    (idx / old).checked_mul(new)?.checked_add(idx % old)
}

/// [`repad_index`] over index values in place; negative values (the pads of index
/// lists) stay as they are. `Err` with the first value whose re-padded position passes
/// `i64` (nothing is changed then).
pub fn repad_indices(values: &mut [i64], old: usize, new: usize) -> Result<(), i64> {
    let moved = |v: i64| match usize::try_from(v) {
        Ok(idx) => repad_index(idx, old, new)
            .and_then(|p| i64::try_from(p).ok())
            .ok_or(v),
        Err(_) => Ok(v),
    };
    let out = values
        .iter()
        .map(|&v| moved(v))
        .collect::<Result<Vec<i64>, i64>>()?;
    values.copy_from_slice(&out);
    Ok(())
}

/// Why owner counts have no total: a negative count, or a sum past `usize` (counts
/// such as `[2^63-1, 2^63-1, 485]` wrap to a plausible total in 64-bit arithmetic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountError {
    /// The count at position `at` is negative.
    Negative {
        /// Its position.
        at: usize,
        /// Its value.
        value: i64,
    },
    /// The counts sum past the largest length.
    Overflow,
}

impl std::fmt::Display for CountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CountError::Negative { at, value } => {
                write!(f, "negative count {value} at position {at}")
            }
            CountError::Overflow => {
                f.write_str("the counts sum past the largest length (they overflow 64 bits)")
            }
        }
    }
}

/// The total of owner counts as a sample gives them, each checked non-negative and the
/// sum checked, never wrapped.
pub fn count_total(counts: impl IntoIterator<Item = i64>) -> Result<usize, CountError> {
    counts
        .into_iter()
        .enumerate()
        .try_fold(0usize, |sum, (at, value)| {
            let c = usize::try_from(value).map_err(|_| CountError::Negative { at, value })?;
            sum.checked_add(c).ok_or(CountError::Overflow)
        })
}

/// The checked sum of lengths: `None` past `usize`.
pub fn checked_sum(lengths: impl IntoIterator<Item = usize>) -> Option<usize> {
    lengths.into_iter().try_fold(0usize, usize::checked_add)
}

/// Least common multiple of mesh axis sizes (1 for none).
pub fn lcm_of(sizes: impl IntoIterator<Item = usize>) -> usize {
    sizes
        .into_iter()
        .fold(1, |acc, s| if s == 0 { acc } else { acc / gcd(acc, s) * s })
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `n` rounded up to a multiple of `m`.
pub fn round_up(n: usize, m: usize) -> usize {
    if m <= 1 {
        n
    } else {
        n.div_ceil(m) * m
    }
}

/// The row-major multi-index of element `flat` of a tensor of `shape` (an axis of length
/// 0 counts as 1, so that any `flat` has an index).
pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d].max(1);
        idx[d] = flat % n;
        flat /= n;
    }
    idx
}

/// The strides (in elements) of a row-major tensor of `shape`: what a DTensor's
/// global stride is.
pub fn contiguous_stride(shape: &[usize]) -> Vec<usize> {
    let mut stride = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        stride[d] = stride[d + 1] * shape[d + 1];
    }
    stride
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uneven_owners_pad_every_block_to_the_largest() {
        // 6 tokens in 3 blocks of 2: atoms 1+2 | 0+4 | 3+1.
        let owners = [0, 1, 1, 3, 3, 3, 3, 4, 4, 4, 5];
        let blocks: Vec<usize> = owners.iter().map(|&o| owner_block(o, 6, 3)).collect();
        assert_eq!(blocks, vec![0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
        let l = BlockLayout::from_item_blocks(&blocks, 3);
        assert_eq!(l.block_counts, vec![3, 4, 4]);
        assert_eq!(l.per_block, 4);
        assert_eq!(l.padded(), 12);
        assert_eq!(
            l.positions(&blocks),
            vec![0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11]
        );
    }

    #[test]
    fn repad_moves_each_block_to_its_new_stride() {
        assert_eq!(repad_index(9, 4, 6), Some(13));
        assert_eq!(repad_index(3, 4, 6), Some(3));
        assert_eq!(repad_index(usize::MAX, 1, 2), None);
        let mut ids = [9, -1, 3, 0, 4];
        repad_indices(&mut ids, 4, 6).unwrap();
        assert_eq!(ids, [13, -1, 3, 0, 6]);
    }

    #[test]
    fn lcm_and_round_up() {
        assert_eq!(lcm_of([2, 3]), 6);
        assert_eq!(lcm_of([3, 3]), 3);
        assert_eq!(lcm_of([]), 1);
        assert_eq!(round_up(7, 3), 9);
        assert_eq!(round_up(0, 3), 0);
    }
}
