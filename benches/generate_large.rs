//! Benchmark: generating every output for a 10,000-feature spec (goal: under 1 s).
//!
//! Run with `cargo bench --bench generate_large`. The baseline, measured in the same
//! run, is a plain YAML parse of the same text into a generic value (no spans, no
//! validation): the ratio says what featshard costs on top of reading the file.

use std::time::{Duration, Instant};

use featshard::codegen;
use featshard::spec::{parse_str, plan};

const FEATURES: usize = 10_000;
const RUNS: usize = 5;

fn large_spec(n: usize) -> String {
    let mut s = String::from(
        "version: 1\nmodule: large\nmesh: {cp: [cp0, cp1], dp: dp}\nsemantics:\n  tokens: {shard: true}\n  atoms: {shard: true, owner: tokens, counts: atom_counts}\n  msa: {shard: true}\n  ensemble: {shard: false}\nworkflows: [training, inference]\nfeatures:\n  atom_counts: {axes: [tokens], dtype: int64}\n",
    );
    let shapes = [
        "axes: [tokens, 8], dtype: float32",
        "axes: [tokens, tokens, 4], dtype: float32",
        "axes: [atoms, 3], dtype: float32",
        "axes: [msa, tokens], dtype: int64, pad: 1",
        "axes: [ensemble, tokens, 3], dtype: float32",
        "axes: [atoms, tokens], dtype: int64, coshard: [{axis: 1, follows: 0}], index: {of: tokens, scope: shard_local, one_hot: 1}",
        "axes: [tokens], dtype: float32, mask: tokens",
        "axes: [ensemble, tokens], dtype: int64, index: {of: atoms, scope: padded_global}, only: [training]",
    ];
    for i in 1..n {
        s.push_str(&format!(
            "  feature_{i:05}: {{{}}}\n",
            shapes[i % shapes.len()]
        ));
    }
    s
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time<T>(f: impl Fn() -> T) -> (Duration, T) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..RUNS {
        let start = Instant::now();
        let out = f();
        times.push(start.elapsed());
        last = Some(out);
    }
    (median(times), last.expect("RUNS > 0"))
}

fn main() {
    let text = large_spec(FEATURES);
    println!(
        "spec: {FEATURES} features, {} bytes; median of {RUNS} runs",
        text.len()
    );

    let (baseline, _) = time(|| {
        serde_saphyr::from_str::<serde_json::Value>(&text).expect("large spec parses as YAML")
    });
    let (t_parse, spec) = time(|| parse_str("large.yaml", &text).expect("large spec is valid"));
    let (t_plan, plan) = time(|| plan::plan(&spec).expect("large spec plans"));
    let (t_py, py) = time(|| codegen::python_module(&plan).expect("python"));
    let (t_pyi, pyi) = time(|| codegen::python_stub(&plan).expect("stub"));
    let (t_rs, rs) = time(|| codegen::rust_module(&plan).expect("rust"));
    let (t_json, json) = time(|| codegen::plan_json(&plan).expect("json"));
    let total = t_parse + t_plan + t_py + t_pyi + t_rs + t_json;

    let row = |name: &str, t: Duration, bytes: Option<usize>| {
        let b = bytes.map(|b| format!("{b:>10} bytes")).unwrap_or_default();
        println!(
            "{name:<28} {:>9.1} ms  {:>6.2}x baseline  {b}",
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() / baseline.as_secs_f64()
        );
    };
    row("baseline: YAML parse only", baseline, Some(text.len()));
    row("parse + lower (spans)", t_parse, None);
    row("check + infer + plan", t_plan, None);
    row("emit .py", t_py, Some(py.len()));
    row("emit .pyi", t_pyi, Some(pyi.len()));
    row("emit .rs", t_rs, Some(rs.len()));
    row("emit .plan.json", t_json, Some(json.len()));
    row(
        "total",
        total,
        Some(py.len() + pyi.len() + rs.len() + json.len()),
    );
    println!(
        "goal: total < 1 s: {}",
        if total < Duration::from_secs(1) {
            "met"
        } else {
            "NOT met"
        }
    );
}
