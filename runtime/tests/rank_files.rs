//! Parity of the two executors: the rank files the byte executor (`featshard-exec`)
//! writes straight from a memory-mapped sample (pages given back as they go) hold,
//! byte for byte, the blocks of the tch runtime's padded global layout, on random
//! meshes, atom counts and thread counts; and the sample given with narrow masks and
//! ids writes the same files.

mod common;

use featshard_exec::assemble::dense_blocks;
use featshard_exec::files::Mapped;
use featshard_exec::shard_folder::write_rank_files;
use featshard_runtime::files::{self, Metadata};
use featshard_runtime::{pad, Features, Options};
use featshard_spec::ir::Role;
use featshard_spec::shards::Encoding;
use proptest::prelude::*;

fn inference() -> Options {
    Options {
        workflow: Some("inference".into()),
        ..Options::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn rank_files_hold_the_padded_layouts_blocks(
        mesh in (1usize..=3, 1usize..=3),
        counts in prop::collection::vec(0i64..5, 1..16),
        threads in 1usize..=3,
        seed in 0i64..1000,
    ) {
        let mut counts = counts;
        if counts.iter().all(|&c| c == 0) {
            counts[0] = 1;
        }
        check_rank_files(common::mesh(&[mesh.0, mesh.1]), &counts, threads, seed)?;
    }
}

/// Pair features of 120 tokens span many pages: rows are given back block row by
/// block row while later ranks still read the rest.
#[test]
fn pages_given_back_while_writing_leave_every_block_whole() {
    let counts: Vec<i64> = (0..120).map(|i| i % 4).collect();
    check_rank_files(common::mesh(&[3, 3]), &counts, 1, 7).unwrap();
    check_rank_files(common::mesh(&[2, 3]), &counts, 2, 8).unwrap();
}

fn check_rank_files(
    mesh: featshard_spec::Mesh,
    counts: &[i64],
    threads: usize,
    seed: i64,
) -> Result<(), TestCaseError> {
    let plan = common::boltz2_plan();
    let sample = common::boltz_sample(&plan, counts, seed);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("sample.safetensors");
    files::write(&input, &sample, &Metadata::new()).unwrap();
    let padded = pad(&plan, mesh, &sample, &inference()).unwrap();

    let mapped = Mapped::open(&input).unwrap();
    let placed = featshard_exec::place(&plan, mesh, &mapped.sample(), &inference()).unwrap();
    assert_eq!(placed.layout, padded.layout);
    let world = mesh.ranks();
    let headers: Vec<Metadata> = (0..world)
        .map(|r| [("rank".to_owned(), r.to_string())].into())
        .collect();
    let paths: Vec<_> = (0..world)
        .map(|r| dir.path().join(format!("rank-{r}.safetensors")))
        .collect();
    let sums =
        write_rank_files(&plan, &placed, &headers, &paths, threads, Encoding::Dense).unwrap();
    let compact: Vec<_> = (0..world)
        .map(|r| dir.path().join(format!("compact-{r}.safetensors")))
        .collect();
    write_rank_files(
        &plan,
        &placed,
        &headers,
        &compact,
        threads,
        Encoding::Compact,
    )
    .unwrap();

    for (rank, path) in paths.iter().enumerate() {
        let bytes = std::fs::read(path).unwrap();
        prop_assert_eq!(sums[rank].bytes, bytes.len() as u64);
        prop_assert_eq!(sums[rank].crc32, crc32fast::hash(&bytes));
        prop_assert_eq!(files::read_metadata(path).unwrap(), headers[rank].clone());
        let got = files::read_tensors(path).unwrap();
        let want = padded.rank_blocks(&plan, rank).unwrap();
        prop_assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>()
        );
        for (name, block) in &want {
            let x = &got[name];
            prop_assert_eq!(
                x.size(),
                block.tensor.size(),
                "rank {} {}: shape",
                rank,
                name
            );
            prop_assert!(
                x.equal(&block.tensor),
                "rank {} {}: values differ",
                rank,
                name
            );
        }
        // Compact rank files expand to the same blocks, byte for byte.
        let stored = Mapped::open(&compact[rank]).unwrap();
        let expanded = dense_blocks(
            &plan,
            &placed.layout,
            Encoding::Compact,
            vec![stored.sample()],
        )
        .unwrap();
        for (name, x) in &got {
            let y = &expanded[0][name];
            prop_assert_eq!(
                y.shape(),
                x.size().iter().map(|&d| d as usize).collect::<Vec<_>>()
            );
            prop_assert!(
                y.to_bytes() == files::tensor_bytes(name, x).unwrap(),
                "rank {} {}: the compact file expands to other bytes",
                rank,
                name
            );
        }
        // Byte for byte what serializing the padded path's blocks gives.
        let tensors = want.into_iter().map(|(n, b)| (n, b.tensor)).collect();
        prop_assert!(
            bytes == files::serialize(&tensors, &headers[rank]).unwrap(),
            "rank {}: bytes",
            rank
        );
    }
    // The same sample with its masks as bool and ranged ids as uint8 writes the same
    // rank files, in both encodings.
    let narrow = dir.path().join("narrow.safetensors");
    files::write(&narrow, &as_narrow(&plan, &sample), &Metadata::new()).unwrap();
    let mapped = Mapped::open(&narrow).unwrap();
    let given = featshard_exec::place(&plan, mesh, &mapped.sample(), &inference()).unwrap();
    for (encoding, want) in [(Encoding::Dense, &paths), (Encoding::Compact, &compact)] {
        let got: Vec<_> = (0..world)
            .map(|r| {
                dir.path()
                    .join(format!("narrow-{encoding:?}-{r}.safetensors"))
            })
            .collect();
        write_rank_files(&plan, &given, &headers, &got, threads, encoding).unwrap();
        for (g, w) in got.iter().zip(want) {
            prop_assert!(
                std::fs::read(g).unwrap() == std::fs::read(w).unwrap(),
                "{:?}: given narrow, {} differs",
                encoding,
                w.display()
            );
        }
    }
    Ok(())
}

/// `sample` with its masks (but derived ones) as bool and ranged ids as uint8.
fn as_narrow(plan: &featshard_spec::Plan, sample: &Features) -> Features {
    let mut out: Features = sample
        .iter()
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    for (name, t) in plan.tensors().filter(|(n, _)| sample.contains_key(*n)) {
        let kind = match (&t.role, t.range) {
            (Role::Mask { .. }, _) if t.derived.is_none() => tch::Kind::Bool,
            (Role::Data, Some(_)) => tch::Kind::Uint8,
            _ => continue,
        };
        out.insert(name.to_owned(), sample[name].to_kind(kind));
    }
    out
}
