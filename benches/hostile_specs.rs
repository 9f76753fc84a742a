//! Benchmark: how fast hostile specs are refused. The tests in `tests/malformed.rs`
//! assert that each is refused with the right message; how long that takes is
//! measured here, never asserted by a test.
//!
//! Run with `cargo bench --bench hostile_specs`. The baseline, measured in the same
//! run, is parsing and validating an ordinary spec of the same size in bytes: the
//! ratio says what refusing the hostile text costs against reading honest text.

use std::time::{Duration, Instant};

use featshard::spec::{compile_str, limits::MAX_FEATURES};

const RUNS: usize = 5;

const BASE: &str = "\
version: 1
module: demo
mesh: {cp: [cp0, cp1], dp: dp}
semantics:
  tokens: {shard: true}
  atoms: {shard: true, owner: tokens, counts: atom_counts}
workflows: [training, inference]
features:
  atom_counts: {axes: [tokens], dtype: int64}
";

/// Ten aliases deep, each ten wide: 10^9 nodes once expanded.
fn alias_bomb() -> String {
    let mut bomb = String::from("[&a0 [x, x, x, x, x, x, x, x, x, x]");
    for i in 1..9 {
        let p = i - 1;
        bomb.push_str(&format!(
            ", &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]"
        ));
    }
    bomb.push(']');
    format!("{BASE}  x: {{axes: [tokens], dtype: int64, pad: {bomb}}}\n")
}

fn many_features(n: usize) -> String {
    let mut text = String::from(BASE);
    for i in 0..n {
        text.push_str(&format!("  f{i}: {{axes: [tokens], dtype: int64}}\n"));
    }
    text
}

/// An ordinary valid spec of at least `bytes` bytes.
fn honest_of_size(bytes: usize) -> String {
    let mut text = String::from(BASE);
    let mut i = 0;
    while text.len() < bytes {
        text.push_str(&format!("  g{i}: {{axes: [tokens, 4], dtype: float32}}\n"));
        i += 1;
    }
    text
}

fn median_time(text: &str, expect_ok: bool) -> Duration {
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            let out = compile_str("bench.yaml", text);
            let took = start.elapsed();
            assert_eq!(out.is_ok(), expect_ok, "unexpected outcome");
            took
        })
        .collect();
    times.sort();
    times[RUNS / 2]
}

fn row(name: &str, text: &str, expect_ok: bool) {
    let baseline = median_time(&honest_of_size(text.len()), true);
    let t = median_time(text, expect_ok);
    println!(
        "{name:<34} {:>9} bytes {:>9.1} ms  baseline {:>8.1} ms  {:>6.2}x",
        text.len(),
        t.as_secs_f64() * 1e3,
        baseline.as_secs_f64() * 1e3,
        t.as_secs_f64() / baseline.as_secs_f64()
    );
}

fn main() {
    println!("median of {RUNS} runs; baseline: a valid spec of the same size");
    row("alias bomb (refused)", &alias_bomb(), false);
    row(
        "limit + 1 features (refused)",
        &many_features(MAX_FEATURES + 1),
        false,
    );
}
