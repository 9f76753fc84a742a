//! Pre-sharded real samples read by each rank from its own files equal what the online
//! `distribute` hands it, on gloo ranks for cp = 3x3 and dp 2 x cp 2x2 (collated too).
#![cfg(feature = "runtime")]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use featshard::runtime::dist::{
    collate, Distributor, GroupOptions, LocalSample, Mesh, PreshardedDataset, Rendezvous,
};
use featshard::runtime::{Features, Options};
use featshard::spec::{DeviceMesh, Mesh as CpMesh, Plan};

const REAL: [&str; 4] = [
    "prot60_nomsa",
    "prot60_smiles",
    "boltz_cp/prot60_nomsa",
    "boltz_cp/prot60_smiles",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn plan() -> Plan {
    featshard::spec::compile_file(&root().join("examples/boltz2.yaml"))
        .unwrap()
        .1
}

fn inference() -> Options {
    Options {
        workflow: Some("inference".into()),
        ..Options::default()
    }
}

/// The four real samples as s0..s3 in a folder, sharded for `mesh` into `out`, rank
/// files stored `encoding` (`compact` or `dense`).
fn presharded(dir: &Path, mesh: &str, encoding: &str) -> (PathBuf, Vec<Features>) {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut samples = Vec::new();
    for (i, name) in REAL.iter().enumerate() {
        let src = root().join(format!("tests/data/real/{name}.safetensors"));
        std::fs::copy(&src, data.join(format!("s{i}.safetensors"))).unwrap();
        samples.push(featshard::files::read_tensors(&src).unwrap());
    }
    let out = dir.join(format!("sharded-{mesh}"));
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_featshard"))
        .args(["shard", "examples/boltz2.yaml", "--features"])
        .arg(&data)
        .args([
            "--mesh",
            mesh,
            "--workflow",
            "inference",
            "--encoding",
            encoding,
        ])
        .arg("--out")
        .arg(&out)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    (out, samples)
}

fn same(a: &LocalSample, b: &LocalSample) {
    assert_eq!(a.layout, b.layout);
    assert_eq!(a.coord, b.coord);
    assert_eq!(
        a.blocks.keys().collect::<Vec<_>>(),
        b.blocks.keys().collect::<Vec<_>>()
    );
    for (n, x) in &a.blocks {
        let y = &b.blocks[n];
        assert_eq!(x.meta, y.meta, "{n}: DTensor metadata");
        assert!(x.tensor.equal(&y.tensor), "{n}: blocks differ");
    }
}

fn on_ranks(world: usize, dp: usize, cp: CpMesh, out: &Path, samples: &[Features]) {
    let plan = Arc::new(plan());
    let opts = GroupOptions {
        timeout: Duration::from_secs(60),
        ..GroupOptions::default()
    };
    let handles: Vec<_> = Rendezvous::in_process(world, opts)
        .unwrap()
        .into_iter()
        .map(|rdv| {
            let (plan, out) = (Arc::clone(&plan), out.to_path_buf());
            let samples: Vec<Features> = samples
                .iter()
                .map(|s| {
                    s.iter()
                        .map(|(n, t)| (n.clone(), t.shallow_clone()))
                        .collect()
                })
                .collect();
            std::thread::spawn(move || {
                let mesh = Mesh::new(&rdv, DeviceMesh::new(dp, cp).unwrap()).unwrap();
                let ds = PreshardedDataset::open(&out, &plan, cp).unwrap();
                assert_eq!(ds.len(), 4);
                // Replica d reads samples d, d + dp, ... as a distributed sampler splits them.
                let mut offline = Vec::new();
                let mut online = Vec::new();
                let d = Distributor::new(&mesh, Arc::clone(&plan)).options(inference());
                for i in (mesh.dp_index()..ds.len()).step_by(dp) {
                    offline.push(ds.read(&plan, i, mesh.cp_rank()).unwrap());
                    let source = mesh.is_source().then(|| (i, &samples[i]));
                    online.push(d.send(source).unwrap());
                }
                for (a, b) in offline.iter().zip(&online) {
                    same(a, b);
                }
                if dp > 1 {
                    // One sample a step, as collate stacks replicas' samples of one kind.
                    for (a, b) in offline.into_iter().zip(online) {
                        let (x, y) = (
                            collate(&mesh, &plan, vec![a]).unwrap(),
                            collate(&mesh, &plan, vec![b]).unwrap(),
                        );
                        for (n, bx) in &x.blocks {
                            assert_eq!(bx.meta, y.blocks[n].meta, "{n}");
                            assert!(
                                bx.tensor.equal(&y.blocks[n].tensor),
                                "{n}: collated blocks differ"
                            );
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn each_of_nine_ranks_reads_its_own_files_and_gets_the_online_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (out, samples) = presharded(dir.path(), "3x3", "compact");
    on_ranks(9, 1, mesh(&[3, 3]), &out, &samples);
}

#[test]
fn dp_replicas_read_their_samples_and_collate_as_online() {
    let dir = tempfile::tempdir().unwrap();
    let (out, samples) = presharded(dir.path(), "2x2", "dense");
    on_ranks(8, 2, mesh(&[2, 2]), &out, &samples);
}

#[test]
fn a_folder_of_another_mesh_or_a_swapped_rank_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = presharded(dir.path(), "2x2", "compact");
    let plan = plan();
    let e = PreshardedDataset::open(&out, &plan, mesh(&[3, 3]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "sharded for mesh 2x2 (cp_axis_0, cp_axis_1), this mesh is 3x3 (cp_axis_0, cp_axis_1)"
        ),
        "{e}"
    );
    let s0 = out.join("s0");
    std::fs::copy(s0.join("rank-0.safetensors"), s0.join("rank-1.safetensors")).unwrap();
    let ds = PreshardedDataset::open(&out, &plan, mesh(&[2, 2])).unwrap();
    let e = ds.read(&plan, 0, 1).unwrap_err().to_string();
    assert!(
        e.contains("rank-1.safetensors: holds rank 0, not rank 1 (rank files swapped?)"),
        "{e}"
    );
    assert!(ds.read(&plan, 0, 0).is_ok());
    // A bit flipped in rank 2's last byte: its CRC-32 catches it, unless opted out.
    let path = s0.join("rank-2.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let e = ds.read(&plan, 0, 2).unwrap_err().to_string();
    assert!(
        e.contains("rank-2.safetensors: its CRC-32 is not the one recorded"),
        "{e}"
    );
    let unverified = PreshardedDataset::open(&out, &plan, mesh(&[2, 2]))
        .unwrap()
        .with_verify(false);
    assert!(unverified.read(&plan, 0, 2).is_ok());
}

fn mesh(sizes: &[usize]) -> CpMesh {
    CpMesh::new(sizes).unwrap()
}
