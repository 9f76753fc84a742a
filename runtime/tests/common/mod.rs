//! Boltz-shaped serial samples for runtime tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use featshard_runtime::Features;
use featshard_spec::plan::Plan;
use featshard_spec::DType;
use tch::{Device, Kind, Tensor};

pub fn boltz2_plan() -> Plan {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/boltz2.yaml");
    featshard_spec::compile_file(&path)
        .unwrap_or_else(|d| panic!("{}", d.render_plain()))
        .1
}

pub fn kind(d: DType) -> Kind {
    featshard_runtime::kind::kind_of(d)
}

/// A serial sample of the inference workflow with the given atoms per token.
/// R-set rows are every second token that has atoms; `frames_idx` points at random atoms.
pub fn boltz_sample(plan: &Plan, counts: &[i64], seed: i64) -> Features {
    tch::manual_seed(seed);
    let n = counts.len() as i64;
    let a: i64 = counts.iter().sum();
    let first_atom: Vec<i64> = counts
        .iter()
        .scan(0, |acc, &c| {
            let f = *acc;
            *acc += c;
            Some(f)
        })
        .collect();
    let rset_tokens: Vec<i64> = (0..n).filter(|&t| counts[t as usize] > 0).step_by(2).collect();
    let lengths: BTreeMap<&str, i64> = [
        ("tokens", n),
        ("atoms", a),
        ("rset", rset_tokens.len() as i64),
        ("msa", 5),
        ("ensemble", 2),
        ("disto_ensemble", 1),
        ("templates", 2),
    ]
    .into();
    let opts = |k| (k, Device::Cpu);
    let mut sample = Features::new();
    for name in &plan.workflows["inference"] {
        let featshard_spec::plan::FeaturePlan::Tensor(t) = &plan.features[name] else {
            continue;
        };
        let shape: Vec<i64> = t
            .axes
            .iter()
            .map(|ax| match (&ax.semantic, ax.size) {
                (Some(s), _) => lengths[s.as_str()],
                (None, Some(c)) => c as i64,
                _ => 0,
            })
            .collect();
        let k = kind(t.dtype);
        let x = match k {
            Kind::Bool => Tensor::rand(shape.as_slice(), opts(Kind::Float)).gt(0.5),
            Kind::Float | Kind::Double | Kind::Half | Kind::BFloat16 => {
                Tensor::rand(shape.as_slice(), opts(Kind::Float)).to_kind(k) + 0.5
            }
            _ => Tensor::randint_low(1, 7, shape.as_slice(), opts(k)),
        };
        sample.insert(name.clone(), x);
    }
    let token_of_atom: Vec<i64> = (0..n)
        .flat_map(|t| std::iter::repeat_n(t, counts[t as usize] as usize))
        .collect();
    sample.insert("atom_counts_per_token".into(), Tensor::from_slice(counts));
    sample.insert("token_index".into(), Tensor::arange(n, opts(Kind::Int64)));
    sample.insert(
        "residue_index".into(),
        Tensor::randint_low(0, n, [n], opts(Kind::Int64)),
    );
    let one_hot = |rows: i64, cols: i64, hot: &[(i64, i64)]| {
        let m = Tensor::zeros([rows, cols], opts(Kind::Int64));
        for &(r, c) in hot {
            let _ = m.get(r).get(c).fill_(1);
        }
        m
    };
    let hot: Vec<(i64, i64)> = token_of_atom.iter().enumerate().map(|(i, &t)| (i as i64, t)).collect();
    sample.insert("atom_to_token".into(), one_hot(a, n, &hot));
    let hot: Vec<(i64, i64)> = (0..n)
        .filter(|&t| counts[t as usize] > 0)
        .map(|t| (t, first_atom[t as usize]))
        .collect();
    sample.insert("token_to_rep_atom".into(), one_hot(n, a, &hot));
    let hot: Vec<(i64, i64)> = rset_tokens
        .iter()
        .enumerate()
        .map(|(r, &t)| (r as i64, first_atom[t as usize]))
        .collect();
    sample.insert("r_set_to_rep_atom".into(), one_hot(rset_tokens.len() as i64, a, &hot));
    sample.insert(
        "frames_idx".into(),
        Tensor::randint_low(0, a.max(1), [2, n, 3], opts(Kind::Int64)),
    );
    sample
}
