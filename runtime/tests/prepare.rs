//! A source's prepared sample: every rank's send buffer holds exactly the runtime's
//! blocks for that rank, however many threads wrote it, whether written at once or
//! deferred to the distribution step, and whether one-hot features and masks travel
//! compact (expanded by the receiving rank) or dense.

mod common;

use std::sync::Arc;

use featshard_runtime::dist::{BufferPool, Preparer, Write};
use featshard_runtime::{pad, Options};

#[test]
fn rank_buffers_hold_the_runtime_blocks_on_any_number_of_threads_written_now_or_deferred() {
    let plan = common::boltz2_plan();
    let features = common::boltz_sample(&plan, &[3, 0, 2, 4, 1, 0, 2], 5);
    let cp = common::mesh(&[2, 3]);
    let mut opts = Options {
        workflow: Some("inference".into()),
        ..Options::default()
    };
    let padded = pad(&plan, cp, &features, &opts).expect("pad");
    let plan = Arc::new(plan);
    for (threads, write, compact) in [
        (1, Write::Now, true),
        (3, Write::Now, false),
        (1, Write::InStep, false),
        (2, Write::InStep, true),
    ] {
        opts.threads = threads;
        let pool = BufferPool::new(cp.ranks());
        let preparer = Preparer::new(Arc::clone(&plan), cp)
            .options(opts.clone())
            .pool(pool.clone())
            .write(write)
            .compact(compact);
        // Twice from one pool: the second sample is written over the first one's bytes,
        // which dropping (or distributing) the first frees.
        for round in 0..2 {
            assert_eq!(pool.free(), round * cp.ranks());
            let mut p = preparer.prepare(4, &features).expect("prepare");
            assert_eq!((pool.free(), pool.kept()), (0, cp.ranks()));
            for rank in 0..cp.ranks() {
                let local = p.local(rank).expect("rank buffer");
                assert_eq!((local.sample, &local.layout), (4, &padded.layout));
                assert_eq!(local.coord, cp.coord(rank));
                let want = padded.rank_blocks(&plan, rank).expect("blocks");
                assert_eq!(
                    local.blocks.keys().collect::<Vec<_>>(),
                    want.keys().collect::<Vec<_>>()
                );
                for (name, b) in &local.blocks {
                    assert!(
                        b.tensor.equal(&want[name].tensor),
                        "{threads} threads, written {write:?}, compact {compact}, rank {rank}, {name}"
                    );
                    assert_eq!(b.meta, want[name].meta, "{name}");
                }
                assert!(local.passthrough.is_empty());
            }
            let outside = p.local(cp.ranks()).map(|_| ()).unwrap_err();
            assert_eq!(
                outside.to_string(),
                "rank 6 is outside mesh 2x3 (cp_axis_0, cp_axis_1) of 6 ranks"
            );
        }
    }
}
