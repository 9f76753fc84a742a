//! The one scheduler of per-feature, per-block and per-rank work on a sample.
//!
//! Values that are `Send` but not `Sync` (tch tensors) cannot be shared by threads:
//! every thread gets its own handles (`make`, called on the calling thread) on the same
//! storage. Work items are taken in order by whichever thread is free; items that own
//! what they write (`&mut` slices of one buffer) are handed out whole ([`try_each`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// `f` on each of `items` (each taken whole, in order, by whichever of up to `threads`
/// threads is free); the first failing item's error, as on one thread.
pub fn try_each<I, E>(
    items: Vec<I>,
    threads: usize,
    f: impl Fn(I) -> Result<(), E> + Sync,
) -> Result<(), E>
where
    I: Send,
    E: Send,
{
    let n = items.len();
    let queue = Mutex::new(items.into_iter().enumerate());
    let take = || queue.lock().unwrap_or_else(|p| p.into_inner()).next();
    let results = map(
        &vec![(); threads.clamp(1, n.max(1))],
        threads,
        || (),
        |_, _| {
            let mut failed: Option<(usize, E)> = None;
            while let Some((k, item)) = take() {
                if let Err(e) = f(item) {
                    if failed.as_ref().is_none_or(|(j, _)| k < *j) {
                        failed = Some((k, e));
                    }
                }
            }
            failed
        },
    );
    match results.into_iter().flatten().min_by_key(|(k, _)| *k) {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

/// `f` over `items` with up to `threads` threads; results in item order. Every item
/// is run, so that the error returned is the one of the first failing item, as on one
/// thread.
pub(crate) fn try_map<I, C, R, E>(
    items: &[I],
    threads: usize,
    make: impl Fn() -> C,
    f: impl Fn(&C, &I) -> Result<R, E> + Sync,
) -> Result<Vec<R>, E>
where
    I: Sync,
    C: Send,
    R: Send,
    E: Send,
{
    map(items, threads, make, f).into_iter().collect()
}

/// `f` over `items` with up to `threads` threads, each taking the next item as it is
/// free; every result, in item order.
pub fn map<I, C, R>(
    items: &[I],
    threads: usize,
    make: impl Fn() -> C,
    f: impl Fn(&C, &I) -> R + Sync,
) -> Vec<R>
where
    I: Sync,
    C: Send,
    R: Send,
{
    let threads = threads.clamp(1, items.len().max(1));
    if threads == 1 {
        let ctx = make();
        return items.iter().map(|i| f(&ctx, i)).collect();
    }
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let ctx = make();
                let (next, f) = (&next, &f);
                scope.spawn(move || {
                    let mut out = Vec::new();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(k) else {
                            return out;
                        };
                        out.push((k, f(&ctx, item)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            // A panic in `f` is a bug, not an input error: it propagates.
            .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    done.sort_by_key(|(k, _)| *k);
    done.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::try_map;

    #[test]
    fn owned_items_are_each_run_once_and_the_first_error_wins() {
        for threads in [1, 2, 7] {
            let mut out = [0u8; 100];
            let items: Vec<(usize, &mut u8)> = out.iter_mut().enumerate().collect();
            let r = super::try_each(items, threads, |(i, b)| {
                *b += 1;
                if i % 30 == 29 {
                    Err(i)
                } else {
                    Ok(())
                }
            });
            assert_eq!(r, Err(29), "{threads} threads");
            assert!(out.iter().all(|&b| b == 1), "{threads} threads");
        }
    }

    #[test]
    fn results_keep_item_order_and_the_first_error_wins() {
        let items: Vec<usize> = (0..100).collect();
        for threads in [1, 2, 7] {
            let out = try_map(&items, threads, || 10, |c, &i| Ok::<_, String>(i * c));
            assert_eq!(out, Ok(items.iter().map(|i| i * 10).collect()));
            let err = try_map(
                &items,
                threads,
                || (),
                |_, &i| {
                    if i % 30 == 29 {
                        Err(format!("item {i}"))
                    } else {
                        Ok(i)
                    }
                },
            );
            assert_eq!(err, Err("item 29".to_owned()), "{threads} threads");
        }
        let none: Vec<u8> = Vec::new();
        assert_eq!(try_map(&none, 4, || (), |_, &i| Ok::<_, ()>(i)), Ok(vec![]));
    }
}
