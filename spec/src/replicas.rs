//! Data parallelism in numbers: which samples each DP replica reads in an epoch (where
//! a global rank sits is [`crate::mesh::DeviceMesh`]'s). The Rust loader and the Python
//! package's sampler both call these, so the two visit the same samples in the same
//! order.

/// The order samples are visited in, each epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Dataset order (inference).
    Sequential,
    /// A permutation drawn from `seed` and the epoch (training); the same on every rank.
    Shuffled {
        /// The shuffle's seed.
        seed: u64,
    },
}

/// SplitMix64: a small, fixed generator, so permutations never change between builds
/// or languages.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The dataset's `n` samples in `order` for `epoch` (a Fisher-Yates shuffle drawn from
/// the seed and the epoch).
fn epoch_order(n: usize, order: Order, epoch: u64) -> Vec<usize> {
    let mut out: Vec<usize> = (0..n).collect();
    if let Order::Shuffled { seed } = order {
        let mut state = seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03);
        for i in (1..n).rev() {
            let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
            out.swap(i, j);
        }
    }
    out
}

/// The most samples (or replicas) a dataset is split over: each gets a position in
/// memory, and the tail's wrap-around must not overflow.
pub const MAX_SAMPLES: usize = 1 << 32;

/// [`replica_indices`] of arguments from outside: `Err` naming the argument unless
/// `replica` is below `dp` and neither `n` nor `dp` is past [`MAX_SAMPLES`].
pub fn checked_replica_indices(
    n: usize,
    order: Order,
    epoch: u64,
    dp: usize,
    replica: usize,
    drop_last: bool,
) -> Result<Vec<usize>, String> {
    if replica >= dp.max(1) {
        return Err(format!(
            "replica {replica} of {dp}: expected a replica below the DP size"
        ));
    }
    if n > MAX_SAMPLES || dp > MAX_SAMPLES {
        return Err(format!(
            "n: {n} samples over {dp} replicas; at most {MAX_SAMPLES} of either"
        ));
    }
    Ok(replica_indices(n, order, epoch, dp, replica, drop_last))
}

/// The samples replica `replica` of `dp` reads in `epoch`, in order: the epoch's order
/// dealt round-robin over the replicas. With `drop_last` the tail that does not fill
/// every replica is dropped; otherwise the order wraps around to its start, so every
/// replica reads the same number of samples.
pub fn replica_indices(
    n: usize,
    order: Order,
    epoch: u64,
    dp: usize,
    replica: usize,
    drop_last: bool,
) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let order = epoch_order(n, order, epoch);
    let dp = dp.max(1);
    let total = if drop_last {
        n / dp * dp
    } else {
        n.div_ceil(dp) * dp
    };
    (0..total)
        .skip(replica)
        .step_by(dp)
        .map(|k| order[k % n])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_read_every_sample_once_per_epoch_wrapping_to_equal_counts() {
        for order in [Order::Sequential, Order::Shuffled { seed: 7 }] {
            for (n, dp) in [(10, 3), (9, 3), (1, 4), (5, 1)] {
                let parts: Vec<Vec<usize>> = (0..dp)
                    .map(|r| replica_indices(n, order, 2, dp, r, false))
                    .collect();
                let lens: Vec<usize> = parts.iter().map(Vec::len).collect();
                assert!(lens.iter().all(|&l| l == n.div_ceil(dp)), "{lens:?}");
                let mut seen: Vec<usize> = parts.concat();
                seen.sort_unstable();
                seen.dedup();
                assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n={n} dp={dp}");
                let dropped: usize = (0..dp)
                    .map(|r| replica_indices(n, order, 2, dp, r, true).len())
                    .sum();
                assert_eq!(dropped, n / dp * dp);
            }
        }
    }

    #[test]
    fn a_shuffle_depends_on_seed_and_epoch_only() {
        let a = replica_indices(50, Order::Shuffled { seed: 1 }, 0, 1, 0, false);
        assert_eq!(
            a,
            replica_indices(50, Order::Shuffled { seed: 1 }, 0, 1, 0, false)
        );
        assert_ne!(
            a,
            replica_indices(50, Order::Shuffled { seed: 1 }, 1, 1, 0, false)
        );
        assert_ne!(
            a,
            replica_indices(50, Order::Shuffled { seed: 2 }, 0, 1, 0, false)
        );
        assert_eq!(
            replica_indices(4, Order::Sequential, 3, 2, 1, false),
            vec![1, 3]
        );
    }
}
