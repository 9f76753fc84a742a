//! c10d collectives through the shim: one gloo rank per thread over a shared HashStore.

#![cfg(feature = "c10d")]

use std::thread;
use std::time::{Duration, Instant};

use featshard_runtime::dist::{DistError, GroupOptions, ReduceOp, Rendezvous};
use tch::{Kind, Tensor};

/// Runs `f(rendezvous)` on `n` threads and returns their results in rank order.
fn on_threads<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    f: impl Fn(Rendezvous) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let opts = GroupOptions {
        timeout,
        ..GroupOptions::default()
    };
    let ranks = Rendezvous::in_process(n, opts).expect("hash store");
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|r| {
            let f = f.clone();
            thread::spawn(move || f(r))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

#[test]
fn collectives_on_three_ranks() {
    let out = on_threads(3, Duration::from_secs(30), |rdv| {
        let world = rdv.world().unwrap();
        let r = world.rank() as i64;
        // broadcast from rank 2
        let mut b = Tensor::from_slice(&[r * 10, r * 10 + 1]);
        world.broadcast(&mut b, 2).unwrap();
        // scatter from rank 1: member i gets [i, i, i] * 7
        let inputs: Vec<Tensor> = (0..3)
            .map(|i| Tensor::full([3], i * 7, (Kind::Int64, tch::Device::Cpu)))
            .collect();
        let mut s = Tensor::zeros([3], (Kind::Int64, tch::Device::Cpu));
        world
            .scatter(&mut s, (r == 1).then_some(inputs.as_slice()), 1)
            .unwrap();
        // all_gather of the rank
        let g = world.all_gather(&Tensor::from_slice(&[r as f32])).unwrap();
        // all_reduce sum and max
        let mut sum = Tensor::from_slice(&[r + 1]);
        world.all_reduce(&mut sum, ReduceOp::Sum).unwrap();
        let mut max = Tensor::from_slice(&[(r - 1).abs()]);
        world.all_reduce(&mut max, ReduceOp::Max).unwrap();
        world.barrier().unwrap();
        let bytes = world
            .broadcast_bytes((r == 0).then_some(b"hello ranks".as_slice()), 0)
            .unwrap();
        (
            Vec::<i64>::try_from(&b).unwrap(),
            Vec::<i64>::try_from(&s).unwrap(),
            g.iter().map(|t| t.double_value(&[0])).collect::<Vec<_>>(),
            sum.int64_value(&[0]),
            max.int64_value(&[0]),
            bytes,
        )
    });
    for (r, (b, s, g, sum, max, bytes)) in out.into_iter().enumerate() {
        assert_eq!(b, vec![20, 21], "rank {r}");
        assert_eq!(s, vec![7 * r as i64; 3], "rank {r}");
        assert_eq!(g, vec![0.0, 1.0, 2.0], "rank {r}");
        assert_eq!(sum, 6);
        assert_eq!(max, 1);
        assert_eq!(bytes, b"hello ranks");
    }
}

#[test]
fn sub_groups_hold_their_members_only() {
    // Ranks {0, 2} and {1, 3}: sums stay within each group.
    let out = on_threads(4, Duration::from_secs(30), |rdv| {
        let r = rdv.rank();
        let even = rdv.group("even", &[0, 2]).unwrap();
        let odd = rdv.group("odd", &[1, 3]).unwrap();
        assert_eq!(even.is_some(), r % 2 == 0);
        assert_eq!(odd.is_some(), r % 2 == 1);
        let g = even.or(odd).unwrap();
        assert_eq!(g.rank(), r / 2);
        let mut t = Tensor::from_slice(&[r as i64]);
        g.all_reduce(&mut t, ReduceOp::Sum).unwrap();
        t.int64_value(&[0])
    });
    assert_eq!(out, vec![2, 4, 2, 4]);
}

#[test]
fn a_missing_member_times_out_with_an_error() {
    // Rank 1 never joins the collective: rank 0 must fail within the timeout, not hang.
    let out = on_threads(2, Duration::from_secs(2), |rdv| {
        let world = rdv.world().unwrap();
        if world.rank() == 1 {
            return Ok(Duration::ZERO);
        }
        let start = Instant::now();
        let mut t = Tensor::from_slice(&[1i64]);
        world
            .all_reduce(&mut t, ReduceOp::Sum)
            .map(|_| start.elapsed())
    });
    match &out[0] {
        Err(DistError::Collective { op, group, .. }) => {
            assert_eq!(*op, "all_reduce");
            assert_eq!(group, "world");
        }
        other => panic!("expected a collective error, got {other:?}"),
    }
}

#[test]
fn bad_arguments_are_errors() {
    let out = on_threads(2, Duration::from_secs(10), |rdv| {
        let bad = rdv.group("bad", &[1, 0]).err();
        let world = rdv.world().unwrap();
        let mut t = Tensor::from_slice(&[1i64]);
        let root = world.broadcast(&mut t, 5).err();
        (bad, root)
    });
    for (bad, root) in out {
        assert!(matches!(bad, Some(DistError::Setup { .. })), "{bad:?}");
        assert!(root.unwrap().to_string().contains("root 5"));
    }
}

/// The `nccl` feature builds the runtime's NCCL groups.
#[cfg(feature = "nccl")]
#[test]
fn nccl_is_compiled_with_the_feature() {
    assert!(featshard_runtime::dist::nccl_compiled());
}

/// NCCL on every GPU of the machine, a rank each: an all-reduce and a scatter of CUDA
/// tensors. It needs a GPU, so the test runner skips it unless asked
/// (`--ignored`, as `scripts/gpu-check` does); asked on a machine without one, it fails.
#[cfg(feature = "nccl")]
#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check runs it with --ignored"]
fn nccl_collectives_on_a_gpu() {
    use featshard_runtime::dist::Backend;
    assert!(
        tch::Cuda::is_available(),
        "no CUDA device on this machine: this test runs on a GPU machine"
    );
    let n = tch::Cuda::device_count() as usize;
    let opts = GroupOptions {
        backend: Backend::Nccl { device: 0 },
        timeout: Duration::from_secs(60),
    };
    let ranks = Rendezvous::in_process(n, opts).expect("hash store");
    let handles: Vec<_> = ranks
        .into_iter()
        .enumerate()
        .map(|(r, mut rdv)| {
            rdv.set_device(r);
            thread::spawn(move || {
                let world = rdv.world().unwrap();
                let dev = world.device();
                let mut t = Tensor::from_slice(&[r as i64 + 1]).to_device(dev);
                world.all_reduce(&mut t, ReduceOp::Sum).unwrap();
                let ins: Vec<Tensor> = (0..n as i64)
                    .map(|i| Tensor::from_slice(&[i * 3]).to_device(dev))
                    .collect();
                let mut out = Tensor::zeros([1], (Kind::Int64, dev));
                world
                    .scatter(&mut out, (r == 0).then_some(ins.as_slice()), 0)
                    .unwrap();
                (t.int64_value(&[0]), out.int64_value(&[0]))
            })
        })
        .collect();
    let total = (n * (n + 1) / 2) as i64;
    for (r, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), (total, 3 * r as i64));
    }
}

#[cfg(not(feature = "nccl"))]
#[test]
fn nccl_is_an_error_without_the_feature() {
    use featshard_runtime::dist::Backend;
    assert!(!featshard_runtime::dist::nccl_compiled());
    let opts = GroupOptions {
        backend: Backend::Nccl { device: 0 },
        timeout: Duration::from_secs(5),
    };
    let rdv = Rendezvous::in_process(1, opts).unwrap().pop().unwrap();
    let e = rdv.world().unwrap_err();
    assert!(e.to_string().contains("without the `nccl` feature"), "{e}");
}

#[test]
fn a_mesh_that_does_not_hold_the_world_is_an_error() {
    use featshard_runtime::dist::Mesh;
    use featshard_spec::{DeviceMesh, Mesh as CpMesh};
    let out = on_threads(4, Duration::from_secs(10), |rdv| {
        let shape = DeviceMesh::new(1, CpMesh::new(&[3, 3]).unwrap()).unwrap();
        Mesh::new(&rdv, shape).err().map(|e| e.to_string())
    });
    for e in out {
        assert_eq!(
            e.as_deref(),
            Some("distributed setup: mesh dp=1 x cp=3x3 holds 9 ranks, but the world has 4")
        );
    }
}

/// A one-axis mesh makes one CP axis group (all of a replica's ranks), never a second
/// of size 1; a tile makes one group per axis, each a row or column of the tile.
#[test]
fn each_cp_axis_has_one_group_and_a_one_axis_mesh_has_one_axis() {
    use featshard_runtime::dist::Mesh;
    use featshard_spec::{DeviceMesh, Mesh as CpMesh};
    for (dp, sizes) in [(2, vec![2]), (1, vec![2, 2])] {
        let shape = DeviceMesh::new(dp, CpMesh::new(&sizes).unwrap()).unwrap();
        let out = on_threads(4, Duration::from_secs(30), move |rdv| {
            let mesh = Mesh::new(&rdv, shape).unwrap();
            let axes: Vec<usize> = (0..3)
                .map_while(|m| mesh.cp_axis(m).map(|g| g.size()))
                .collect();
            (
                axes,
                mesh.cp().size(),
                mesh.dp().size(),
                mesh.cp_coord().as_slice().to_vec(),
            )
        });
        for (rank, (axes, cp, dp_size, coord)) in out.into_iter().enumerate() {
            assert_eq!(axes, sizes, "rank {rank}: one group per axis, of its size");
            assert_eq!((cp, dp_size), (sizes.iter().product(), dp));
            assert_eq!(coord, shape.position(rank).1.as_slice());
        }
    }
}
