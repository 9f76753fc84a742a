//! Compact input as a hostile or careless featurizer gives it: a one-hot feature and a
//! one-hot map as indices of any dtype (floats and bools among them) and any values, a
//! sparse feature as `NAME.indices`/`NAME.values` (any index dtype, coordinates and
//! values, an optional `NAME.shape`) or dense, on any small mesh. Placing it succeeds or
//! fails with a message naming a feature, never a panic; when it succeeds, every rank's
//! compact block expands to exactly its dense block.
#![no_main]

use std::sync::OnceLock;

use featshard::exec::array::Array;
use featshard::exec::blocks::feature_blocks;
use featshard::exec::files::Sample;
use featshard::exec::sink::SliceSink;
use featshard::exec::{dtype, place, Options};
use featshard::spec::ir::DType;
use featshard::spec::plan::Plan;
use libfuzzer_sys::fuzz_target;

const SPEC: &str = "\
version: 1
module: fuzzed
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true}
  atoms: {shard: true, owner: tokens, map: atom_to_token}
features:
  mask: {axes: [tokens], dtype: float32, mask: tokens}
  kind: {axes: [tokens, 5], dtype: int64, one_hot: 1}
  bonds: {axes: [tokens, tokens, 1], dtype: float32, sparse: true}
  flags: {axes: [tokens, tokens], dtype: bool, sparse: true, optional: true}
  atom_to_token:
    axes: [atoms, tokens]
    dtype: int64
    coshard: [{axis: 1, follows: 0}]
    index: {of: tokens, scope: shard_local, one_hot: 1}
";

fn plan() -> &'static Plan {
    static PLAN: OnceLock<Plan> = OnceLock::new();
    PLAN.get_or_init(|| {
        featshard::spec::compile_str("fuzzed.yaml", SPEC)
            .expect("spec")
            .1
    })
}

/// Reads the fuzzer's bytes as small numbers.
struct Bytes<I: Iterator<Item = u8>>(I);

impl<I: Iterator<Item = u8>> Bytes<I> {
    fn byte(&mut self) -> u8 {
        self.0.next().unwrap_or(0)
    }

    /// A value for an index: mostly a class of the 5 or -1, sometimes past them or
    /// extreme.
    fn index(&mut self) -> i64 {
        match self.byte() {
            b @ 0..=180 => i64::from(b % 6) - 1,
            b @ 181..=200 => i64::from(b),
            201..=220 => i64::MAX,
            221..=240 => i64::MIN,
            _ => (1 << 53) + 1,
        }
    }

    fn dtype(&mut self) -> DType {
        DType::ALL[usize::from(self.byte()) % DType::ALL.len()]
    }
}

/// `values` as an array of `d` and `shape` (each value cast as the dtype holds it).
fn array(d: DType, shape: Vec<usize>, values: &[i64]) -> Array<'static> {
    let mut bytes = Vec::with_capacity(values.len() * dtype::size(d));
    for &v in values {
        dtype::encode_f64(d, v as f64, &mut bytes);
    }
    Array::owned(d, shape, bytes)
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data.iter().copied());
    let (n, atoms) = (
        1 + usize::from(b.byte() % 12),
        1 + usize::from(b.byte() % 24),
    );
    let sizes = [1 + usize::from(b.byte() % 3), 1 + usize::from(b.byte() % 3)];
    let mesh = featshard::spec::Mesh::new(&sizes).expect("a mesh of at most 3x3");
    let mut sample = Sample::new();
    sample.insert("mask".into(), array(DType::Float32, vec![n], &vec![1; n]));
    let kind: Vec<i64> = (0..n).map(|_| b.index()).collect();
    sample.insert("kind".into(), array(b.dtype(), vec![n], &kind));
    // Atoms owned in order: each token's atoms follow the previous token's.
    let map: Vec<i64> = (0..atoms)
        .map(|a| match b.byte() {
            0..=230 => (a * n / atoms) as i64,
            _ => b.index(),
        })
        .collect();
    sample.insert("atom_to_token".into(), array(b.dtype(), vec![atoms], &map));
    let k = usize::from(b.byte() % 8);
    let index_dtype = b.dtype();
    let coords: Vec<i64> = (0..3 * k)
        .map(|i| match (i / k.max(1), b.byte()) {
            (2, c) if c < 240 => 0,
            (_, c) if c < 230 => i64::from(c) % n as i64,
            _ => b.index(),
        })
        .collect();
    let values: Vec<i64> = (0..k).map(|_| i64::from(b.byte() % 4)).collect();
    sample.insert(
        "bonds.indices".into(),
        array(index_dtype, vec![3, k], &coords),
    );
    sample.insert(
        "bonds.values".into(),
        array(DType::Float32, vec![k], &values),
    );
    if b.byte() % 4 == 0 {
        let shape = [n as i64 + i64::from(b.byte() % 2), n as i64, 1];
        sample.insert("bonds.shape".into(), array(DType::Int64, vec![3], &shape));
    }
    if b.byte() % 2 == 0 {
        let flags: Vec<i64> = (0..n * n).map(|_| i64::from(b.byte() % 3 / 2)).collect();
        let bytes: Vec<u8> = flags
            .iter()
            .map(|&v| v as u8 + u8::from(b.byte() == 255))
            .collect();
        sample.insert("flags".into(), Array::owned(DType::Bool, vec![n, n], bytes));
    }
    let placed = match place(plan(), mesh, &sample, &Options::default()) {
        Ok(p) => p,
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("feature `"), "{text}");
            return;
        }
    };
    // Every compact block expands to exactly its dense block.
    let all = feature_blocks(plan(), &placed).expect("blocks of a placed sample");
    for f in all.iter().filter(|f| f.is_placed()) {
        let Some(form) = f.form() else { continue };
        for coord in mesh.coords() {
            let dense_shape = placed.shapes[&f.name].local_shape.clone();
            let mut dense = vec![0u8; f.nbytes()];
            f.write(coord, &mut SliceSink::new(&mut dense))
                .expect("dense block");
            let compact_shape = f.compact_shape().expect("compact shape");
            let stored = f.compact_dtype();
            let len = compact_shape.iter().product::<usize>() * dtype::size(stored);
            let mut packed = vec![0u8; len];
            f.write_compact(coord, &mut SliceSink::new(&mut packed))
                .expect("compact block");
            let mut back = vec![0xA5u8; dense.len()];
            form.expand_into(&packed, f.dtype, &dense_shape, &mut back);
            assert_eq!(back, dense, "feature `{}` at {coord:?}", f.name);
        }
    }
});
