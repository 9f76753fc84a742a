//! Byte buffers kept from step to step, so that a loop of samples fills memory it
//! already touched instead of faulting new pages in for each.

use std::sync::{Arc, Mutex};

use tch::{Device, Kind, Tensor};

use super::ffi;

/// Byte buffers reused from step to step: the send buffers of a source, the receive
/// buffers of a rank. A kept buffer is lent out again once nothing refers to its memory
/// any more (the prepared sample, or every received block, was dropped), so a sample
/// still in use is never overwritten. Filling memory the process already touched costs
/// a fraction of first-touch memory (page faults; on a VM, backing by the host), and a
/// sample's buffers are as large as the sample.
#[derive(Clone, Debug, Default)]
pub struct BufferPool {
    kept: Arc<Mutex<Vec<Tensor>>>,
    /// Buffers kept at most; more are lent out and then freed.
    cap: usize,
}

impl BufferPool {
    /// A pool that keeps at most `cap` buffers.
    pub fn new(cap: usize) -> BufferPool {
        BufferPool {
            kept: Arc::default(),
            cap,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Tensor>> {
        // The list stays consistent whatever panicked while holding it.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Buffers kept, lent out or not.
    pub fn kept(&self) -> usize {
        self.lock().len()
    }

    /// Kept buffers that nothing refers to: ready to be lent out again.
    pub fn free(&self) -> usize {
        self.lock().iter().filter(|t| ffi::sole_owner(t)).count()
    }

    /// `bytes` bytes on `device`: a view of the smallest free kept buffer that fits,
    /// or of a new one (kept if there is room, making room by freeing the smallest
    /// free buffer). Its bytes are whatever was there.
    pub fn take(&self, bytes: usize, device: Device) -> Result<Tensor, tch::TchError> {
        self.lend(bytes, device).map(|(t, _)| t)
    }

    /// [`BufferPool::take`], and whether the buffer is new (its memory never touched).
    pub(super) fn lend(
        &self,
        bytes: usize,
        device: Device,
    ) -> Result<(Tensor, bool), tch::TchError> {
        let mut kept = self.lock();
        let free = |t: &&Tensor| ffi::sole_owner(t);
        let reuse = kept
            .iter()
            .filter(free)
            .filter(|t| t.device() == device && t.numel() >= bytes)
            .min_by_key(|t| t.numel());
        if let Some(t) = reuse {
            return Ok((t.f_narrow(0, 0, bytes as i64)?, false));
        }
        let (new, _) = buffer(None, bytes, device)?;
        let lent = new.f_narrow(0, 0, bytes as i64)?;
        if kept.len() >= self.cap {
            let smallest = kept
                .iter()
                .enumerate()
                .filter(|(_, t)| ffi::sole_owner(t))
                .min_by_key(|(_, t)| t.numel())
                .map(|(i, _)| i);
            if let Some(i) = smallest {
                drop(kept.swap_remove(i));
            }
        }
        if kept.len() < self.cap {
            kept.push(new);
        }
        Ok((lent, true))
    }
}

/// `bytes` bytes on `device` from `pool`, or new without one; `true` when new (its
/// memory never touched).
pub(super) fn buffer(
    pool: Option<&BufferPool>,
    bytes: usize,
    device: Device,
) -> Result<(Tensor, bool), tch::TchError> {
    match pool {
        Some(p) => p.lend(bytes, device),
        None => Tensor::f_empty([bytes as i64], (Kind::Uint8, device)).map(|t| (t, true)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_lends_a_buffer_again_only_once_nothing_refers_to_it() {
        let pool = BufferPool::new(2);
        let (a, fresh) = pool.lend(64, Device::Cpu).expect("buffer");
        assert!(fresh);
        assert_eq!((a.numel(), pool.kept(), pool.free()), (64, 1, 0));
        // A view of the lent view, or another handle on it, still holds the memory.
        let ptr = a.data_ptr();
        let (view, handle) = (a.narrow(0, 8, 8), a.shallow_clone());
        drop(a);
        assert_eq!(pool.free(), 0);
        let (b, fresh) = pool.lend(16, Device::Cpu).expect("buffer");
        assert!(fresh, "a buffer still referred to was lent out again");
        drop(view);
        assert_eq!(pool.free(), 0);
        drop(handle);
        assert_eq!(pool.free(), 1);
        let (a, fresh) = pool.lend(32, Device::Cpu).expect("buffer");
        assert_eq!((fresh, a.data_ptr()), (false, ptr));
        drop((a, b));
        // Both are free now; the smallest that fits is lent, as a view of the size asked.
        assert_eq!((pool.kept(), pool.free()), (2, 2));
        let (c, fresh) = pool.lend(10, Device::Cpu).expect("buffer");
        assert!(!fresh);
        assert_eq!((c.numel(), pool.free()), (10, 1));
        // Full: a larger buffer replaces the free one that is too small.
        let (d, fresh) = pool.lend(100, Device::Cpu).expect("buffer");
        assert!(fresh);
        assert_eq!((pool.kept(), pool.free()), (2, 0));
        // Full and all lent out: a new buffer is lent but not kept.
        let (e, fresh) = pool.lend(8, Device::Cpu).expect("buffer");
        assert!(fresh);
        assert_eq!(pool.kept(), 2);
        drop((c, d, e));
        assert_eq!(pool.free(), 2);
    }
}
