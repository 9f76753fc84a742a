//! Recycled block memory. A rank's dense blocks are hundreds of megabytes per sample,
//! and memory a process touches for the first time costs a page fault per page (on
//! some virtual machines several times the copy itself). Buffers whose tensors are all
//! gone come back here, and the next sample's buffers of about the same size reuse
//! them: a training loop distributes sample after sample into memory already mapped.

use std::sync::Mutex;

use memmap2::{Advice, MmapMut};

/// How many freed buffers are kept for reuse: a rank holds at most two per sample (the
/// buffer it received or wrote, and the one its compact blocks expand into; the source
/// writes the other ranks' buffers one at a time, each freed before the next is
/// written), so two cover a loop of samples, and at most two buffers' memory stays
/// held between calls.
const KEPT: usize = 2;

/// Freed buffers, awaiting reuse.
static POOL: Mutex<Vec<MmapMut>> = Mutex::new(Vec::new());

/// Anonymous memory of at least `len` bytes, and whether it was used before (then it
/// holds old bytes; new memory is zeroed by the kernel). A kept buffer is reused when
/// it wastes at most half of itself.
pub(crate) fn take(len: usize) -> std::io::Result<(MmapMut, bool)> {
    let len = len.max(1);
    if let Ok(mut pool) = POOL.lock() {
        let fit = (0..pool.len())
            .filter(|&i| (len..=len.saturating_mul(2)).contains(&pool[i].len()))
            .min_by_key(|&i| pool[i].len());
        if let Some(i) = fit {
            return Ok((pool.swap_remove(i), true));
        }
    }
    let map = MmapMut::map_anon(len)?;
    // Advice only: without transparent huge pages the buffer works as well.
    let _ = map.advise(Advice::HugePage);
    Ok((map, false))
}

/// Keeps a buffer whose tensors are gone for reuse, the largest [`KEPT`] of them.
pub(crate) fn give_back(map: MmapMut) {
    if let Ok(mut pool) = POOL.lock() {
        pool.push(map);
        pool.sort_by_key(|m| std::cmp::Reverse(m.len()));
        pool.truncate(KEPT);
    }
}

/// Unmaps every kept buffer (their memory goes back to the system).
pub(crate) fn release() -> usize {
    POOL.lock().map(|mut p| p.drain(..).count()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_buffer_of_about_the_size_is_reused_and_others_are_not() {
        release();
        let (mut a, used) = take(3 << 20).unwrap();
        assert!(!used);
        a[0] = 7;
        let at = a.as_ptr();
        give_back(a);
        let (small, used) = take(1 << 20).unwrap(); // would waste over half of it
        assert!(!used);
        let (b, used) = take(2 << 20).unwrap();
        assert!(used && b.as_ptr() == at && b[0] == 7);
        give_back(b);
        give_back(small);
        assert_eq!(release(), 2);
    }
}
