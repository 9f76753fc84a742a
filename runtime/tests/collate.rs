//! DP collate over gloo (one rank per thread): replicas with samples of different
//! lengths agree on the largest local shape, pad to it, re-pad owner-layout indices,
//! and prepend the DP placement.

#![cfg(feature = "c10d")]

mod common;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use featshard_runtime::dist::{collate, Distributor, GroupOptions, Mesh, Rendezvous};
use featshard_runtime::kind::scalar;
use featshard_runtime::Options;
use featshard_spec::plan::{FeaturePlan, Remap};
use tch::Tensor;

#[test]
fn replicas_of_different_lengths_collate_to_one_shape() {
    let plan = Arc::new(common::boltz2_plan());
    let repadded: Vec<String> = plan
        .workflows["inference"]
        .iter()
        .filter(|n| matches!(&plan.features[*n], FeaturePlan::Tensor(t) if matches!(t.remap, Remap::ToPaddedLayout { repad: true, .. })))
        .cloned()
        .collect();
    assert!(
        !repadded.is_empty(),
        "the inference workflow has an index into an owner layout"
    );
    // Replica 0: 9 tokens with few atoms; replica 1: 14 tokens with many.
    let counts = [vec![1i64; 9], vec![6i64; 14]];
    let shape = featshard_spec::DeviceMesh::new(2, common::mesh(&[2, 1])).unwrap();
    let opts = GroupOptions {
        timeout: Duration::from_secs(30),
        ..GroupOptions::default()
    };
    let handles: Vec<_> = Rendezvous::in_process(4, opts)
        .unwrap()
        .into_iter()
        .map(|rdv| {
            let plan = Arc::clone(&plan);
            let counts = counts.clone();
            thread::spawn(move || {
                let mesh = Mesh::new(&rdv, shape).unwrap();
                let sopts = Options {
                    workflow: Some("inference".into()),
                    ..Options::default()
                };
                let replica = mesh.dp_index();
                let s = mesh
                    .is_source()
                    .then(|| common::boltz_sample(&plan, &counts[replica], replica as i64));
                let d = Distributor::new(&mesh, Arc::clone(&plan)).options(sopts);
                let local = d.send(s.as_ref().map(|s| (replica, s))).unwrap();
                let before = local.tensors();
                let batch = collate(&mesh, &plan, vec![local]).unwrap();
                (mesh.rank(), replica, before, batch)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut moved = 0;
    for (rank, replica, before, batch) in &results {
        assert_eq!(batch.samples, vec![*replica]);
        // The peer at the same CP coordinate on the other replica.
        let peer = &results[(rank + 2) % 4].2;
        for (name, b) in &batch.blocks {
            let FeaturePlan::Tensor(t) = &plan.features[name] else {
                unreachable!()
            };
            let x = &before[name];
            let y = b.tensor.get(0);
            // The local shape is the larger of the two replicas' shapes.
            let want: Vec<i64> = x
                .size()
                .iter()
                .zip(peer[name].size())
                .map(|(a, b)| (*a).max(b))
                .collect();
            assert_eq!(y.size(), want, "{name}: collated shape");
            assert_eq!(b.meta.global_shape[0], 2, "{name}: batch axis over dp");
            assert_eq!(b.meta.placements, t.placements_dp, "{name}");
            let mut region = y.shallow_clone();
            for (d, &n) in x.size().iter().enumerate() {
                region = region.narrow(d as i64, 0, n);
            }
            if repadded.contains(name) {
                // Values moved to the larger per-block stride: map them back.
                let (old, new) = (
                    atoms_local(before),
                    atoms_local(
                        &batch
                            .blocks
                            .iter()
                            .map(|(n, b)| (n.clone(), b.tensor.get(0)))
                            .collect(),
                    ),
                );
                assert!(new >= old);
                let back = region.floor_divide_scalar(new) * old + region.remainder(new);
                assert!(back.equal(x), "{name}: re-padded indices");
                if new > old && x.numel() > 0 && x.max().int64_value(&[]) >= old {
                    assert!(
                        !region.equal(x),
                        "{name}: indices past the first block must move"
                    );
                    moved += 1;
                }
            } else {
                assert!(region.equal(x), "{name}: values kept in place");
            }
            // Everything outside the sample's own block is the pad value.
            let pads = y.numel() - x.numel();
            let filled = Tensor::full(
                y.size().as_slice(),
                scalar(t.pad_value),
                (y.kind(), y.device()),
            );
            let mask = Tensor::ones(y.size().as_slice(), (tch::Kind::Bool, y.device()));
            let mut inner = mask.shallow_clone();
            for (d, &n) in x.size().iter().enumerate() {
                inner = inner.narrow(d as i64, 0, n);
            }
            let _ = inner.fill_(0);
            let outside = y.masked_select(&mask);
            assert_eq!(outside.numel(), pads, "{name}");
            assert!(
                outside.equal(&filled.masked_select(&mask)),
                "{name}: pads hold the pad value"
            );
        }
    }
    assert!(
        moved > 0,
        "some rank re-padded indices that point past its first atom block"
    );
}

/// The local length of the atoms axis (the owner-partitioned layout) on this rank.
fn atoms_local(features: &featshard_runtime::Features) -> i64 {
    features["atom_pad_mask"].size()[0]
}

#[test]
fn replicas_whose_samples_hold_different_features_fail_collate_by_name() {
    // Replica 1's sample lacks an optional feature: every rank's collate says which,
    // instead of a collective of mismatched sizes.
    let plan = Arc::new(common::boltz2_plan());
    let opts = GroupOptions {
        timeout: Duration::from_secs(30),
        ..GroupOptions::default()
    };
    let handles: Vec<_> = Rendezvous::in_process(4, opts)
        .unwrap()
        .into_iter()
        .map(|rdv| {
            let plan = Arc::clone(&plan);
            thread::spawn(move || {
                let shape = featshard_spec::DeviceMesh::new(2, common::mesh(&[2, 1])).unwrap();
                let mesh = Mesh::new(&rdv, shape).unwrap();
                let sopts = Options {
                    workflow: Some("inference".into()),
                    ..Options::default()
                };
                let replica = mesh.dp_index();
                let s = mesh.is_source().then(|| {
                    let mut s = common::boltz_sample(&plan, &[2, 1, 3, 1], replica as i64);
                    if replica == 1 {
                        s.remove("pair_mask");
                    }
                    s
                });
                let d = Distributor::new(&mesh, Arc::clone(&plan)).options(sopts);
                let local = d.send(s.as_ref().map(|s| (replica, s))).unwrap();
                collate(&mesh, &plan, vec![local])
                    .map(|_| ())
                    .unwrap_err()
                    .to_string()
            })
        })
        .collect();
    for h in handles {
        let e = h.join().unwrap();
        assert!(
            e.contains("DP replicas hold different features: `pair_mask` absent on some replicas"),
            "{e}"
        );
    }
}
