//! Times the Rust runtime producing every rank's blocks of one sample file.
//!
//! `time_blocks SPEC SAMPLE.safetensors CP0xCP1 [WORKFLOW [THREADS]]` prints one line:
//! `rust_seconds=<median of 3> padded_bytes=<n> peak_bytes=<n>`, the last the peak
//! resident set while making blocks above what the process held with the sample
//! loaded. Used by `benches/python_vs_rust.py`.

use std::time::Instant;

use featshard_runtime::{pad, Options};
use tch::Tensor;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, spec, sample, mesh, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: time_blocks SPEC SAMPLE.safetensors MESH (3x3, 8) [WORKFLOW [THREADS]]".into(),
        );
    };
    let threads: usize = rest.get(1).map_or(Ok(1), |t| t.parse())?;
    tch::set_num_threads(threads as i32);
    let (_, plan) = featshard_spec::compile_file(spec.as_ref()).map_err(|d| d.render_plain())?;
    let mesh = plan.mesh.parse(mesh)?.cp;
    let features = Tensor::read_safetensors(sample)?.into_iter().collect();
    let opts = Options {
        workflow: rest.first().cloned(),
        threads,
        ..Options::default()
    };
    // Resets the peak resident set, so that it tells the blocks, not the loading.
    std::fs::write("/proc/self/clear_refs", "5")?;
    let before = status("VmRSS")?;
    let mut times = Vec::new();
    let mut padded_bytes = 0;
    for _ in 0..3 {
        let start = Instant::now();
        let padded = pad(&plan, mesh, &features, &opts)?;
        let blocks: Vec<_> = (0..mesh.ranks())
            .map(|r| padded.rank_blocks(&plan, r))
            .collect::<Result<_, _>>()?;
        times.push(start.elapsed().as_secs_f64());
        padded_bytes = padded
            .tensors
            .values()
            .map(|t| t.numel() * t.kind().elt_size_in_bytes())
            .sum::<usize>();
        drop(blocks);
    }
    times.sort_by(f64::total_cmp);
    let peak = status("VmHWM")?.saturating_sub(before);
    println!(
        "rust_seconds={} padded_bytes={padded_bytes} peak_bytes={peak}",
        times[1]
    );
    Ok(())
}

/// A /proc/self/status figure, in bytes.
fn status(field: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string("/proc/self/status")?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .ok_or(format!("no {field} in /proc/self/status"))?;
    let kb: u64 = line.trim().trim_end_matches("kB").trim().parse()?;
    Ok(kb * 1024)
}
