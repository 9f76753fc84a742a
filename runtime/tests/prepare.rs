//! A source's prepared sample: every rank's send buffer holds exactly the runtime's
//! blocks for that rank, however many threads wrote it, and whether written at once or
//! deferred to the distribution step.

mod common;

use featshard_runtime::dist::{prepare_deferred, prepare_with, BufferPool};
use featshard_runtime::{pad, Options};

#[test]
fn rank_buffers_hold_the_runtime_blocks_on_any_number_of_threads_written_now_or_deferred() {
    let plan = common::boltz2_plan();
    let features = common::boltz_sample(&plan, &[3, 0, 2, 4, 1, 0, 2], 5);
    let cp = [2, 3];
    let mut opts = Options {
        workflow: Some("inference".into()),
        ..Options::default()
    };
    let padded = pad(&plan, cp, &features, &opts).expect("pad");
    for (threads, deferred) in [(1, false), (3, false), (1, true), (2, true)] {
        opts.threads = threads;
        let pool = BufferPool::new(cp[0] * cp[1]);
        // Twice from one pool: the second sample is written over the first one's bytes,
        // which dropping (or distributing) the first frees.
        for round in 0..2 {
            assert_eq!(pool.free(), round * cp[0] * cp[1]);
            let prepare = if deferred {
                prepare_deferred
            } else {
                prepare_with
            };
            let mut p = prepare(&plan, cp, &opts, 4, &features, Some(&pool)).expect("prepare");
            assert_eq!((pool.free(), pool.kept()), (0, cp[0] * cp[1]));
            for rank in 0..cp[0] * cp[1] {
                let local = p.local(rank).expect("rank buffer");
                assert_eq!((local.sample, &local.layout), (4, &padded.layout));
                assert_eq!(local.coord, featshard_runtime::coords(cp, rank));
                let want = padded.rank_blocks(&plan, rank).expect("blocks");
                assert_eq!(
                    local.blocks.keys().collect::<Vec<_>>(),
                    want.keys().collect::<Vec<_>>()
                );
                for (name, b) in &local.blocks {
                    assert!(
                        b.tensor.equal(&want[name].tensor),
                        "{threads} threads, deferred {deferred}, rank {rank}, {name}"
                    );
                    assert_eq!(b.meta, want[name].meta, "{name}");
                }
                assert!(local.passthrough.is_empty());
            }
            assert!(p.local(cp[0] * cp[1]).is_err(), "a rank outside the group");
        }
    }
}
