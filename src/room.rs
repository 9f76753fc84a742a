//! Whether a run's output fits before its first byte is written: the disk's free space,
//! and a bound on how much larger than its sample a sharded sample may grow (a tiny
//! sample on a huge mesh pads to terabytes; that is a mistake to name, not to write).

use std::path::Path;

use featshard_exec::assemble::Footprint;

use crate::commands::Failure;
use crate::text::human;

/// The default of `--max-growth`: rank files at most this many times the sample's
/// bytes. A real Boltz-2 sample (`prot60_smiles`) grows 2.1x on 3x3, 4.8x on 8x8 and
/// 10x on 16x16 (features replicated along one mesh axis are copied to each rank of
/// it), so this leaves room for the meshes CP runs on and catches a mesh mistyped by
/// orders of magnitude (the same sample on 2x32768: 60,000x).
pub const MAX_GROWTH: f64 = 64.0;

/// Outputs smaller than this are never refused for their growth alone.
const SMALL: u64 = 1 << 30;

/// `--max-growth`: a finite ratio of at least 1.
pub fn parse_growth(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 1.0 => Ok(r),
        _ => Err(format!("`{text}` is not a ratio of at least 1")),
    }
}

/// Refuses `need` bytes of rank files from an `input`-byte sample into `dir` when the
/// disk has not that much free, or when they are over `max_growth` times the sample.
pub fn check(dir: &Path, need: u64, input: u64, max_growth: f64) -> Result<(), Failure> {
    let b = |n: u64| human(u128::from(n));
    if need > SMALL && need as f64 > max_growth * input.max(1) as f64 {
        return Err(Failure::Other(format!(
            "the rank files would take {}, {:.0}x the sample's {} (over --max-growth {max_growth}): check --mesh, or raise --max-growth",
            b(need),
            need as f64 / input.max(1) as f64,
            b(input)
        )));
    }
    room_for(need, free_bytes(dir), dir)
}

/// `need` bytes of rank files against `free` bytes of `dir`, sizes said in the units
/// that show them (a nearly full disk has bytes free, not "0.0 GB").
fn room_for(need: u64, free: Option<u64>, dir: &Path) -> Result<(), Failure> {
    match free {
        Some(free) if need > free => Err(Failure::Other(format!(
            "the rank files would take {}, but {} has {} free",
            human(u128::from(need)),
            dir.display(),
            human(u128::from(free))
        ))),
        _ => Ok(()),
    }
}

/// Refuses to assemble features whose [`Footprint`]s need more memory than the machine
/// has (its memory and swap), or whose output (the padded layouts with `padded`, else
/// the serial features) needs more disk than `dir` has free: said before anything is
/// expanded, naming the largest feature.
pub fn check_assembly(dir: &Path, features: &[Footprint], padded: bool) -> Result<(), Failure> {
    let sum =
        |f: fn(&Footprint) -> u128| features.iter().fold(0u128, |a, x| a.saturating_add(f(x)));
    let (held, global) = match padded {
        true => (sum(|f| f.held), sum(|f| f.global)),
        false => (sum(|f| f.held_serial), sum(|f| f.serial)),
    };
    let alone = |f: &Footprint| if padded { f.held } else { f.held_serial };
    let largest = features
        .iter()
        .max_by_key(|f| alone(f))
        .map(|f| format!(" (feature `{}` alone {})", f.feature, human(alone(f))))
        .unwrap_or_default();
    if let Some(memory) = memory_bytes().filter(|&m| held > m as u128) {
        return Err(Failure::Other(format!(
            "assembling would hold {} in memory{largest}, more than this machine's {}",
            human(held),
            human(memory as u128)
        )));
    }
    match free_bytes(dir) {
        Some(free) if global > free as u128 => Err(Failure::Other(format!(
            "the assembled sample may take {}, but {} has {} free",
            human(global),
            dir.display(),
            human(free as u128)
        ))),
        _ => Ok(()),
    }
}

/// The machine's memory and swap, from `/proc/meminfo` (`None` where it cannot be read).
fn memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some(
        kib("MemTotal:")?
            .saturating_add(kib("SwapTotal:").unwrap_or(0))
            .saturating_mul(1024),
    )
}

/// Bytes an unprivileged writer may still use on `dir`'s file system.
fn free_bytes(dir: &Path) -> Option<u64> {
    let s = rustix::fs::statvfs(dir).ok()?;
    Some(s.f_bavail.saturating_mul(s.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_small_sizes_in_the_units_that_show_them() {
        let Err(Failure::Other(message)) = room_for(70_000, Some(4_096), Path::new("/full")) else {
            panic!("refused")
        };
        assert_eq!(
            message,
            "the rank files would take 70.00 KB, but /full has 4.10 KB free"
        );
        assert!(room_for(10, Some(10), Path::new("/x")).is_ok());
        assert!(room_for(10, None, Path::new("/x")).is_ok());
    }
}
