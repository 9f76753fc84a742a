//! Multi-process distribution through gloo: each case starts one process per rank (the
//! torchrun environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) running the
//! `distribute_boltz` example, then reads every rank's summary line.
//!
//! The binary is its own worker: with FEATSHARD_RANK_WORKER set it runs one rank.

use std::io::Read;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;

#[path = "../examples/distribute_boltz/run.rs"]
#[allow(dead_code)]
mod example;

const WORKER: &str = "FEATSHARD_RANK_WORKER";

struct Rank {
    code: Option<i32>,
    line: String,
}

fn spec() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/boltz2.yaml")
        .display()
        .to_string()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Starts `world` ranks with `args` and waits (at most `deadline`) for all of them.
fn launch(world: usize, args: &[&str], deadline: Duration) -> Result<Vec<Rank>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let port = free_port().to_string();
    let spec = spec();
    let mut children: Vec<Child> = Vec::new();
    for rank in 0..world {
        let child = Command::new(&exe)
            .arg("--spec")
            .arg(&spec)
            .args(args)
            .env(WORKER, "1")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &port)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn rank {rank}: {e}"))?;
        children.push(child);
    }
    let start = Instant::now();
    let mut codes: Vec<Option<Option<i32>>> = vec![None; world];
    while codes.iter().any(Option::is_none) {
        for (c, code) in children.iter_mut().zip(codes.iter_mut()) {
            if code.is_none() {
                if let Ok(Some(status)) = c.try_wait() {
                    *code = Some(status.code());
                }
            }
        }
        if start.elapsed() > deadline {
            let left: Vec<usize> = (0..world).filter(|&r| codes[r].is_none()).collect();
            for c in &mut children {
                let _ = c.kill();
                let _ = c.wait();
            }
            return Err(format!(
                "ranks {left:?} still running after {deadline:?} (killed)"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(children
        .into_iter()
        .zip(codes)
        .map(|(mut c, code)| {
            let mut out = String::new();
            if let Some(mut s) = c.stdout.take() {
                let _ = s.read_to_string(&mut out);
            }
            Rank {
                code: code.flatten(),
                line: out.lines().last().unwrap_or("").to_owned(),
            }
        })
        .collect())
}

fn all_ok(ranks: &[Rank]) -> Result<(), String> {
    for (r, x) in ranks.iter().enumerate() {
        if x.code != Some(0) || !x.line.contains(" ok ") {
            return Err(format!("rank {r} (exit {:?}): {}", x.code, x.line));
        }
    }
    Ok(())
}

fn samples_of(line: &str) -> String {
    line.split("samples=")
        .nth(1)
        .and_then(|s| s.split(" local_bytes").next())
        .unwrap_or("")
        .to_owned()
}

/// Every listed rank failed with a message containing each of `needles`. Needles that
/// name the cause show it arrived through the step's status agreement: a collective
/// that timed out waiting for the failed rank would name only the collective.
fn all_failed(
    ranks: &[Rank],
    which: impl Fn(usize) -> bool,
    needles: &[&str],
) -> Result<(), String> {
    for (r, x) in ranks.iter().enumerate().filter(|(r, _)| which(*r)) {
        if x.code != Some(1) || !x.line.contains(" error ") {
            return Err(format!(
                "rank {r} should have failed (exit {:?}): {}",
                x.code, x.line
            ));
        }
        for n in needles {
            if !x.line.contains(n) {
                return Err(format!(
                    "rank {r}: the error does not name `{n}`: {}",
                    x.line
                ));
            }
        }
    }
    Ok(())
}

const MINUTE: Duration = Duration::from_secs(60);

type Case = Box<dyn Fn() -> Result<(), String>>;

fn cases() -> Vec<(&'static str, Case)> {
    vec![
        (
            "cp_3x3_nine_ranks",
            Box::new(|| {
                let ranks = launch(
                    9,
                    &["--mesh", "3x3", "--samples", "2", "--shuffle", "7"],
                    3 * MINUTE,
                )?;
                all_ok(&ranks)?;
                // Every rank of the one replica saw the same (shuffled) samples.
                let first = samples_of(&ranks[0].line);
                if ranks.iter().any(|r| samples_of(&r.line) != first) {
                    return Err("ranks disagree on the samples".into());
                }
                Ok(())
            }),
        ),
        (
            "dp2_cp_2x2_eight_ranks",
            Box::new(|| {
                let ranks = launch(8, &["--mesh", "2x2x2", "--samples", "4"], 3 * MINUTE)?;
                all_ok(&ranks)?;
                // Replicas split the dataset like a distributed sampler: 0, 2 and 1, 3.
                for (r, x) in ranks.iter().enumerate() {
                    let want = if r < 4 { "[0, 2]" } else { "[1, 3]" };
                    if samples_of(&x.line) != want {
                        return Err(format!(
                            "rank {r} read {}, expected {want}",
                            samples_of(&x.line)
                        ));
                    }
                }
                Ok(())
            }),
        ),
        (
            "cp_2x3_six_ranks",
            Box::new(|| {
                all_ok(&launch(
                    6,
                    &["--mesh", "2x3", "--samples", "2"],
                    3 * MINUTE,
                )?)
            }),
        ),
        (
            "cp_1x1_one_rank",
            Box::new(|| all_ok(&launch(1, &["--mesh", "1x1", "--samples", "2"], MINUTE)?)),
        ),
        (
            "source_failure_mid_epoch",
            Box::new(|| {
                // Replica 0 reads samples 0, 2; its source fails on 2 (its second step).
                // The other replica, whose samples are fine, must stop with the same error.
                let ranks = launch(
                    4,
                    &["--mesh", "2x1x2", "--samples", "4", "--fail-sample", "2"],
                    2 * MINUTE,
                )?;
                all_failed(
                    &ranks,
                    |_| true,
                    &["source rank 0 failed on sample 2", "injected failure"],
                )
            }),
        ),
        (
            "non_source_failure_mid_epoch",
            Box::new(|| {
                let ranks = launch(
                    4,
                    &[
                        "--mesh",
                        "2x2",
                        "--samples",
                        "3",
                        "--fail-rank",
                        "3",
                        "--fail-step",
                        "2",
                    ],
                    2 * MINUTE,
                )?;
                all_failed(
                    &ranks,
                    |_| true,
                    &["rank 3 failed", "injected failure in step 2"],
                )
            }),
        ),
        (
            "retry_skips_a_failing_sample",
            Box::new(|| {
                let ranks = launch(
                    4,
                    &[
                        "--mesh",
                        "2x2",
                        "--samples",
                        "3",
                        "--fail-sample",
                        "1",
                        "--retries",
                        "1",
                    ],
                    2 * MINUTE,
                )?;
                all_ok(&ranks)?;
                match samples_of(&ranks[3].line).as_str() {
                    "[0, 2, 2]" => Ok(()),
                    other => Err(format!(
                        "expected samples [0, 2, 2] (1 replaced by 2), got {other}"
                    )),
                }
            }),
        ),
        (
            "crashed_rank_mid_epoch",
            Box::new(|| {
                // Rank 2 exits without a word in step 2: the others must not hang.
                let ranks = launch(
                    4,
                    &[
                        "--mesh",
                        "2x2",
                        "--samples",
                        "3",
                        "--crash-rank",
                        "2",
                        "--fail-step",
                        "2",
                        "--timeout",
                        "5",
                    ],
                    2 * MINUTE,
                )?;
                if ranks[2].code != Some(3) {
                    return Err(format!(
                        "rank 2 should have exited with 3: {:?}",
                        ranks[2].code
                    ));
                }
                all_failed(&ranks, |r| r != 2, &["failed"])
            }),
        ),
    ]
}

fn main() -> ExitCode {
    if std::env::var_os(WORKER).is_some() {
        tch::set_num_threads(1);
        return example::main_with(&example::Args::parse());
    }
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let mut failed = 0;
    for (name, case) in cases() {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let start = Instant::now();
        match case() {
            Ok(()) => println!(
                "test {name} ... ok ({:.1} s)",
                start.elapsed().as_secs_f64()
            ),
            Err(e) => {
                failed += 1;
                println!(
                    "test {name} ... FAILED ({:.1} s)\n  {e}",
                    start.elapsed().as_secs_f64()
                );
            }
        }
    }
    if failed > 0 {
        println!("{failed} distributed case(s) failed");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
