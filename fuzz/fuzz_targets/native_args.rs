//! The argument checks of the Python package's native entry points (`featshard._native`:
//! `coords`, `chunk_sizes`, `repad_indices`, `Plan.collate_join`, `replica_indices`, `Plan.layout`,
//! `Plan.padded_length`, `Plan.block_window`, `Plan.domain_window`), which live in the
//! spec crate: any arguments are answered or refused with a message naming the
//! argument, never a panic.
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use featshard::spec::plan::{Ownership, Plan};
use featshard::spec::replicas::{checked_replica_indices, Order};
use featshard::spec::{layout, plan::chunk_sizes, Mesh};
use libfuzzer_sys::fuzz_target;

fn plans() -> &'static [Plan; 2] {
    static PLANS: OnceLock<[Plan; 2]> = OnceLock::new();
    PLANS.get_or_init(|| {
        let compile = |name, text| featshard::spec::compile_str(name, text).expect("example").1;
        [
            compile("boltz2.yaml", include_str!("../../examples/boltz2.yaml")),
            compile("weather.yaml", include_str!("../../examples/weather.yaml")),
        ]
    })
}

/// The input as machine words, each from up to 8 bytes.
fn words(data: &[u8]) -> Vec<usize> {
    data.chunks(8)
        .map(|c| {
            let mut a = [0u8; 8];
            a[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(a) as usize
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Some((&op, rest)) = data.split_first() else {
        return;
    };
    let w = words(rest);
    let at = |i: usize| w.get(i).copied().unwrap_or(0);
    // Small values stay small, so that work stays bounded where Python would wait too.
    let small = |i: usize| at(i) % 4096;
    let plan = &plans()[usize::from(op >> 7)];
    match op % 8 {
        0 => {
            if let Ok(mesh) =
                Mesh::new(&w.iter().take(op as usize % 4).copied().collect::<Vec<_>>())
            {
                let _ = mesh.checked_coord(at(2));
            }
        }
        1 => drop(chunk_sizes(small(0), at(1))),
        2 => {
            let mut values: Vec<i64> = w.iter().skip(2).map(|&v| v as i64).collect();
            let _ = layout::repad_indices(&mut values, at(0), at(1));
            // `Plan.collate_join` with any blocks' and batch's shapes: a join (its
            // re-pad and whole axes re-laid out) or a refusal by name.
            let shapes = |skip: usize| -> BTreeMap<String, Vec<usize>> {
                plan.tensors()
                    .enumerate()
                    .map(|(k, (n, t))| {
                        let dims = (0..t.axes.len()).map(|d| at(skip + k + d) % 5000);
                        (n.to_owned(), dims.collect())
                    })
                    .collect()
            };
            let (local, targets) = (shapes(0), shapes(1));
            for (name, _) in plan.tensors() {
                let _ = featshard::exec::collate::join(plan, name, &local, &targets);
            }
        }
        3 => {
            let order = if at(3) % 2 == 0 {
                Order::Sequential
            } else {
                Order::Shuffled { seed: at(4) as u64 }
            };
            let _ = checked_replica_indices(
                small(0),
                order,
                at(5) as u64,
                at(1),
                at(2),
                at(6) % 2 == 0,
            );
        }
        4 => {
            let mesh: Vec<usize> = w.iter().take(op as usize % 4).map(|&v| v % 70).collect();
            let sizes: BTreeMap<String, usize> = plan
                .semantics
                .keys()
                .zip(w.iter().skip(3))
                .map(|(s, &n)| (s.clone(), if n % 3 == 0 { n } else { n % 64 }))
                .collect();
            let ownership: BTreeMap<String, Ownership> = plan
                .semantics
                .keys()
                .zip(w.iter().skip(1))
                .map(|(s, &n)| (s.clone(), Ownership::Counts(vec![n % 8; n % 50])))
                .collect();
            let _ = plan.checked_layout(&mesh, &sizes, &ownership);
        }
        5 => {
            if let Ok(mesh) = plan
                .mesh
                .matched(&w.iter().take(2).copied().collect::<Vec<_>>())
            {
                for s in plan.semantics.keys() {
                    let _ = plan.padded_length(s, small(2), mesh);
                }
            }
        }
        6 => {
            let Ok(mesh) = Mesh::new(&[at(0) % 70 + 1, at(1) % 70 + 1]) else {
                return;
            };
            let coord = mesh.coord(at(2));
            for (_, t) in plan.tensors() {
                let local: Vec<usize> = (0..t.axes.len()).map(|d| at(d + 3)).collect();
                let _ = t.checked_block_window(&local, coord);
            }
        }
        _ => {
            let sizes: Vec<usize> = [at(0) % 70, at(1) % 70][..plan.mesh.axes().len()].to_vec();
            let Ok(mesh) = plan.mesh.matched(&sizes) else {
                return;
            };
            let coord = mesh.coord(at(2));
            for (_, t) in plan.tensors() {
                let global: Vec<usize> = (0..t.axes.len()).map(|d| small(d + 4)).collect();
                let _ = plan.domain_window(t, &global, mesh, coord);
            }
        }
    }
});
