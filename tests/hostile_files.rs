//! Hostile input on the file system: what `featshard shard` and `assemble` write, and
//! where. Nothing featshard did not write is deleted; nothing is written through a
//! link, over a device, or past the disk's free space; a run stopped by a signal leaves
//! nothing behind; owner counts that wrap are refused. Every case checks that nothing
//! outside its target changed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod support;

use support::cli::{featshard, root, shard, shard_command, shard_encoded, spec, within};

fn real(name: &str) -> PathBuf {
    root().join("tests/data/real").join(name)
}

/// Exit 1 (not a panic's 101 or a signal) with every needle in stderr.
fn refused(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "expected exit 1, got: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` not in: {err}");
    }
}

/// Every path under `dir` (links not followed) with its bytes, or `None` for folders
/// and links: a snapshot to compare before and after.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
                out.insert(e.path(), None);
            } else if t.is_file() {
                out.insert(e.path(), Some(std::fs::read(e.path()).unwrap()));
            } else {
                out.insert(e.path(), None);
            }
        }
    }
    out
}

fn staging_left(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

#[test]
fn a_dataset_run_never_deletes_a_sample_folder_it_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::copy(real("prot60_nomsa.safetensors"), data.join("a.safetensors")).unwrap();
    let out = dir.path().join("out");
    // The user's own folder where the sample's shards would go, no manifest in it.
    std::fs::create_dir_all(out.join("a")).unwrap();
    std::fs::write(out.join("a/notes.txt"), b"mine").unwrap();
    let before = snapshot(&out.join("a"));
    let run = shard(&data, "2x2", &out);
    refused(
        &run,
        &[
            "a: ",
            "notes.txt",
            "featshard removes only folders it wrote",
        ],
    );
    assert_eq!(
        snapshot(&out.join("a")),
        before,
        "the user's folder changed"
    );
    // A folder featshard did write (its own files only) is redone as before.
    std::fs::remove_file(out.join("a/notes.txt")).unwrap();
    std::fs::write(out.join("a/rank-0.safetensors"), b"half-written").unwrap();
    let run = shard(&data, "2x2", &out);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(out.join("a/manifest.json").is_file());
}

#[test]
fn assemble_never_replaces_a_device_a_link_or_a_folder() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    let run = shard(&real("prot60_nomsa.safetensors"), "1x1", &shards);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, b"keep me").unwrap();
    let link = dir.path().join("out.safetensors");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let folder = dir.path().join("folder.safetensors");
    std::fs::create_dir(&folder).unwrap();
    // A FIFO stands in for a device node (`--out /dev/null`): a test that replaced the
    // machine's own would break it for everything after.
    let fifo = dir.path().join("fifo.safetensors");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let before = snapshot(dir.path());
    for (out, why) in [
        (fifo.as_path(), "not a regular file"),
        (link.as_path(), "a symbolic link"),
        (folder.as_path(), "not a regular file"),
    ] {
        let run = featshard(&[
            "assemble",
            &spec(),
            "--shards",
            &shards.display().to_string(),
            "--out",
            &out.display().to_string(),
        ]);
        refused(&run, &[&out.display().to_string(), why]);
    }
    assert_eq!(snapshot(dir.path()), before);
    let fifo = std::fs::symlink_metadata(&fifo).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fifo.file_type()));
}

#[test]
fn shard_never_writes_through_a_link_at_its_staging_or_output_name() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("data"), b"keep me").unwrap();
    // A link at a staging name of a dead process, and one at --out.
    let out = dir.path().join("shards");
    std::os::unix::fs::symlink(&victim, dir.path().join(".shards.tmp-4000000000")).unwrap();
    let before = snapshot(&victim);
    let run = shard(&real("prot60_nomsa.safetensors"), "2x2", &out);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(std::fs::symlink_metadata(&out).unwrap().is_dir());
    assert_eq!(
        snapshot(&victim),
        before,
        "written through the planted link"
    );
    let link_out = dir.path().join("linked");
    std::os::unix::fs::symlink(&victim, &link_out).unwrap();
    let run = shard(&real("prot60_nomsa.safetensors"), "2x2", &link_out);
    refused(&run, &["linked", "a symbolic link"]);
    assert_eq!(snapshot(&victim), before, "written through --out's link");
}

#[test]
fn an_output_larger_than_the_disk_or_sane_is_refused_before_the_first_byte() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("shards");
    // 4.5 MB on a 2x32768 mesh would be hundreds of gigabytes.
    let run = shard(&real("prot60_nomsa.safetensors"), "2x32768", &out);
    refused(&run, &["the rank files would take", "--max-growth"]);
    assert!(!out.exists());
    assert!(staging_left(dir.path()).is_empty());
    // Past the growth bound on purpose, the free space still holds.
    let run = featshard(&[
        "shard",
        &spec(),
        "--features",
        &real("prot60_nomsa.safetensors").display().to_string(),
        "--mesh",
        "2x32768",
        "--workflow",
        "inference",
        "--max-growth",
        "1e300",
        "--out",
        &out.display().to_string(),
    ]);
    refused(&run, &["the rank files would take", "GB free"]);
    assert!(!out.exists());
    assert!(staging_left(dir.path()).is_empty());
}

/// Sends `signal` to a `shard` run once its staging folder exists; `None` when the run
/// finished first (too fast to catch on this machine).
fn interrupt_shard(signal: i32, dir: &Path, input: &Path) -> Option<Output> {
    let out = dir.join("shards");
    let mut child = shard_command(&input.display().to_string(), "12x12", &out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            let _ = std::fs::remove_dir_all(&out);
            return None;
        }
        if !staging_left(dir).is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "no staging folder appeared");
        std::thread::sleep(Duration::from_millis(1));
    }
    let pid = child.id().to_string();
    Command::new("kill")
        .args([format!("-{signal}"), pid])
        .status()
        .unwrap();
    let run = child.wait_with_output().unwrap();
    if run.status.success() {
        // It finished between the look and the signal: not a case of interruption.
        let _ = std::fs::remove_dir_all(&out);
        return None;
    }
    Some(run)
}

#[test]
fn sigterm_and_sigint_leave_no_staging_folder() {
    let dir = tempfile::tempdir().unwrap();
    for signal in [15, 2] {
        let caught = (0..20)
            .find_map(|_| interrupt_shard(signal, dir.path(), &real("prot60_smiles.safetensors")));
        let Some(run) = caught else {
            panic!("every run finished before its staging folder was seen");
        };
        assert_eq!(
            run.status.code(),
            Some(128 + signal),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(
            staging_left(dir.path()).is_empty(),
            "{:?}",
            staging_left(dir.path())
        );
        assert!(!dir.path().join("shards").exists());
    }
}

/// `real`'s sample with `name` replaced by `values` (int64, same shape).
fn with_int64(sample: &Path, name: &str, values: &[i64], out: &Path) {
    use safetensors::tensor::{Dtype, SafeTensors, TensorView};
    let bytes = std::fs::read(sample).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut views = Vec::new();
    for (n, t) in st.tensors() {
        let view = if n == name {
            assert_eq!(t.shape().iter().product::<usize>(), values.len());
            TensorView::new(Dtype::I64, t.shape().to_vec(), &raw).unwrap()
        } else {
            t
        };
        views.push((n, view));
    }
    let info = meta.metadata().clone();
    safetensors::serialize_to_file(views, info, out).unwrap();
}

#[test]
fn owner_counts_whose_sum_wraps_to_the_real_count_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("wrapped.safetensors");
    // 2 * (2^63 - 1) + 483 wraps to 481 in 64-bit arithmetic: the real atom count.
    let mut counts = vec![0i64; 73];
    counts[0] = i64::MAX;
    counts[1] = i64::MAX;
    counts[2] = 483;
    with_int64(
        &real("boltz_cp/prot60_smiles.safetensors"),
        "atom_counts_per_token",
        &counts,
        &input,
    );
    let out = dir.path().join("shards");
    let run = shard(&input, "2x2", &out);
    refused(&run, &["atom_counts_per_token", "overflow"]);
    assert!(!out.exists());
    assert!(staging_left(dir.path()).is_empty());
}

fn assemble(shards: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "assemble".to_owned(),
        spec(),
        "--shards".into(),
        shards.display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    featshard(&args)
}

/// `prot60_smiles` sharded on 2x2 (compact rank files) into `dir/shards`.
fn sharded_on_2x2(dir: &Path) -> PathBuf {
    let shards = dir.join("shards");
    let run = shard(&real("prot60_smiles.safetensors"), "2x2", &shards);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    shards
}

#[test]
fn a_flipped_bit_in_a_rank_file_is_caught_by_its_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let shards = sharded_on_2x2(dir.path());
    // A bit of rank 3's own block of the pair mask (sharded on both mesh axes: no other
    // rank holds a copy to compare it with), still a valid bool.
    let path = shards.join("rank-3.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let at = header["token_pair_pad_mask"]["data_offsets"][0]
        .as_u64()
        .unwrap() as usize;
    bytes[8 + n + at] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let back = dir.path().join("back.safetensors");
    refused(
        &assemble(&shards, &back, &[]),
        &["rank-3.safetensors", "CRC-32"],
    );
    assert!(!back.exists());
    // Opted out, the flip goes through: the checksum is what catches it.
    let run = assemble(&shards, &back, &["--no-verify"]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn a_manifest_entry_or_metadata_edited_after_the_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("with_record.safetensors");
    with_metadata(
        &real("prot60_smiles.safetensors"),
        &[("record", "{\"id\": \"a\"}")],
        &input,
    );
    let shards = dir.path().join("shards");
    let run = shard(&input, "2x2", &shards);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let path = shards.join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let back = dir.path().join("back.safetensors");
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    // A DTensor global shape and the metadata, each edited alone.
    let mut shape = doc.clone();
    shape["features"]["res_type"]["global_shape"][0] = serde_json::json!(75);
    let mut meta = doc.clone();
    meta["metadata"]["record"] = serde_json::json!("{\"id\": \"b\"}");
    for (edited, needles) in [
        (shape, ["res_type", "its entry is not what the spec makes"]),
        (meta, ["metadata", "differs from the rank files'"]),
    ] {
        std::fs::write(&path, serde_json::to_string_pretty(&edited).unwrap()).unwrap();
        refused(&assemble(&shards, &back, &[]), &needles);
        assert!(!back.exists());
    }
    std::fs::write(&path, text).unwrap();
    let run = assemble(&shards, &back, &[]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// `sample` with `pairs` added to its header's metadata.
fn with_metadata(sample: &Path, pairs: &[(&str, &str)], out: &Path) {
    use safetensors::tensor::SafeTensors;
    let bytes = std::fs::read(sample).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let mut info = meta.metadata().clone().unwrap_or_default();
    info.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    safetensors::serialize_to_file(st.tensors(), Some(info), out).unwrap();
}

/// `sample` rewritten with `edit` applied to every tensor's (name, shape, bytes).
fn rewrite(sample: &Path, out: &Path, edit: impl Fn(&str, &mut Vec<usize>, &mut Vec<u8>)) {
    use safetensors::tensor::{SafeTensors, TensorView};
    let bytes = std::fs::read(sample).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            let (mut shape, mut data) = (t.shape().to_vec(), t.data().to_vec());
            edit(&n, &mut shape, &mut data);
            (n, t.dtype(), shape, data)
        })
        .collect();
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, meta.metadata().clone(), out).unwrap();
}

fn shard_cmd(features: &str, out: &Path) -> Command {
    shard_command(features, "2x2", out)
}

#[test]
fn axes_of_one_semantic_that_arrive_with_different_lengths_are_refused_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("shifted.safetensors");
    // A spurious token row prepended to res_type: 74 rows against the 73-token mask.
    rewrite(
        &real("prot60_smiles.safetensors"),
        &input,
        |n, shape, data| {
            if n == "res_type" {
                shape[0] += 1;
                let row = data[..shape[1] * 8].to_vec();
                data.splice(0..0, row);
            }
        },
    );
    let out = dir.path().join("shards");
    refused(
        &shard(&input, "2x2", &out),
        &[
            "feature `res_type`",
            "axis 0 (tokens",
            "length 74",
            "`token_pad_mask` arrived with 73",
        ],
    );
    // 600 atoms of ref_pos against a 512-atom mask.
    rewrite(
        &real("prot60_smiles.safetensors"),
        &input,
        |n, shape, data| {
            if n == "ref_pos" {
                shape[0] = 600;
                data.resize(600 * 3 * 4, 0);
            }
        },
    );
    refused(
        &shard(&input, "2x2", &out),
        &[
            "feature `ref_pos`",
            "axis 0 (atoms",
            "length 600",
            "`atom_pad_mask` arrived with 512",
        ],
    );
    assert!(!out.exists());
}

#[test]
fn a_bool_mask_holding_a_byte_other_than_0_or_1_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("byte2.safetensors");
    rewrite(&real("prot60_smiles.safetensors"), &input, |n, _, data| {
        if n == "atom_resolved_mask" {
            data[5] = 2;
        }
    });
    let out = dir.path().join("shards");
    refused(
        &shard(&input, "2x2", &out),
        &["feature `atom_resolved_mask`", "found 2 at flat index 5"],
    );
    assert!(!out.exists());
}

#[test]
fn fifos_and_endless_files_are_refused_never_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("sample.safetensors");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let out = dir.path().join("shards");
    let run = within(60, shard_cmd(&fifo.display().to_string(), &out));
    refused(&run, &["sample.safetensors", "not a regular file"]);
    // A FIFO as the @LIST, and /dev/zero as one (endless).
    let list = dir.path().join("list.txt");
    assert!(Command::new("mkfifo")
        .arg(&list)
        .status()
        .unwrap()
        .success());
    for l in [list.display().to_string(), "/dev/zero".into()] {
        let run = within(60, shard_cmd(&format!("@{l}"), &out));
        refused(&run, &[&l, "not a regular file"]);
    }
    // A FIFO among a dataset's samples fails alone, by name.
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::copy(real("prot60_nomsa.safetensors"), data.join("a.safetensors")).unwrap();
    assert!(Command::new("mkfifo")
        .arg(data.join("b.safetensors"))
        .status()
        .unwrap()
        .success());
    let run = within(120, shard_cmd(&data.display().to_string(), &out));
    refused(
        &run,
        &["1 sharded", "1 failed", "b: ", "not a regular file"],
    );
    assert!(out.join("a/manifest.json").is_file());
}

#[test]
fn resume_reads_only_the_rank_files_of_a_manifest_s_own_folder() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::copy(real("prot60_nomsa.safetensors"), data.join("a.safetensors")).unwrap();
    let out = dir.path().join("out");
    let run = within(120, shard_cmd(&data.display().to_string(), &out));
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let path = out.join("a/manifest.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let sum = doc["files"]["rank-0.safetensors"].clone();
    let files = doc["files"].as_object_mut().unwrap();
    files.remove("rank-0.safetensors");
    files.insert("/dev/zero".into(), sum);
    std::fs::write(&path, serde_json::to_string(&doc).unwrap()).unwrap();
    // Not verified (it names a file outside its folder): redone, and never hangs.
    let run = within(120, shard_cmd(&data.display().to_string(), &out));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&run.stdout).contains("1 sharded, 0 already done"));
}

#[test]
fn metadata_too_large_for_a_rank_file_header_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("big_record.safetensors");
    // The sample's header fits safetensors' 100 MB, a few bytes short; every dense
    // rank file's, with its identity added, would not.
    let bytes = std::fs::read(real("prot60_smiles.safetensors")).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let record = "x".repeat(100_000_000 - header - 64);
    with_metadata(
        &real("prot60_smiles.safetensors"),
        &[("record", &record)],
        &input,
    );
    let out = dir.path().join("shards");
    refused(
        &shard_encoded(&input, "2x2", &out, "dense"),
        &["past safetensors' limit"],
    );
    assert!(!out.exists());
    assert!(staging_left(dir.path()).is_empty());
}

#[test]
fn a_sample_file_name_that_is_not_utf8_is_refused_up_front_by_name() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::copy(real("prot60_nomsa.safetensors"), data.join("a.safetensors")).unwrap();
    let name = std::ffi::OsStr::from_bytes(b"b\xff.safetensors");
    std::fs::copy(real("prot60_nomsa.safetensors"), data.join(name)).unwrap();
    let out = dir.path().join("out");
    let run = within(120, shard_cmd(&data.display().to_string(), &out));
    refused(&run, &["b\u{fffd}.safetensors", "not UTF-8"]);
    assert!(!out.join("a").exists(), "sharded before the refusal");
}

#[test]
fn a_sample_featurized_again_between_dataset_runs_is_sharded_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let sample = data.join("a.safetensors");
    std::fs::copy(real("prot60_nomsa.safetensors"), &sample).unwrap();
    let out = dir.path().join("out");
    let features = data.display().to_string();
    let run = within(120, shard_cmd(&features, &out));
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let rerun = within(120, shard_cmd(&features, &out));
    assert!(String::from_utf8_lossy(&rerun.stdout).contains("0 sharded, 1 already done"));
    // Featurized again: other values (coordinates moved), same names and shapes.
    rewrite(&real("prot60_nomsa.safetensors"), &sample, |n, _, data| {
        if n == "ref_pos" {
            data[0] ^= 1;
        }
    });
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    let file = std::fs::File::options().write(true).open(&sample).unwrap();
    file.set_modified(later).unwrap();
    let before = std::fs::read(out.join("a/rank-0.safetensors")).unwrap();
    let rerun = within(120, shard_cmd(&features, &out));
    let said = String::from_utf8_lossy(&rerun.stdout);
    assert!(said.contains("1 sharded, 0 already done"), "{said}");
    assert_ne!(
        std::fs::read(out.join("a/rank-0.safetensors")).unwrap(),
        before
    );
}

#[test]
fn a_feature_of_another_workflow_is_named_so_and_many_unknown_keys_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("shards");
    let run = featshard(&[
        "shard",
        &spec(),
        "--features",
        &real("prot60_smiles.safetensors").display().to_string(),
        "--mesh",
        "2x2",
        "--workflow",
        "training",
        "--out",
        &out.display().to_string(),
    ]);
    refused(
        &run,
        &[
            "workflow `training` does not have",
            "`affinity_token_mask` (workflow inference)",
        ],
    );
    // 2,000 keys the spec does not know: the first ten named, the rest counted.
    let input = dir.path().join("many.safetensors");
    {
        use safetensors::tensor::{SafeTensors, TensorView};
        let bytes = std::fs::read(real("prot60_smiles.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let one = [0u8; 1];
        let mut views: Vec<(String, TensorView)> = st.tensors();
        for k in 0..2000 {
            let v = TensorView::new(safetensors::Dtype::U8, vec![1], &one).unwrap();
            views.push((format!("extra_{k:04}"), v));
        }
        std::fs::write(&input, safetensors::serialize(views, None).unwrap()).unwrap();
    }
    let run = shard(&input, "2x2", &out);
    refused(
        &run,
        &["features not in the spec: `extra_0000`", "and 1990 more"],
    );
    assert!(
        run.stderr.len() < 2000,
        "{} bytes of error",
        run.stderr.len()
    );
}

#[test]
fn headers_that_safetensors_refuses_are_refused_too() {
    let dir = tempfile::tempdir().unwrap();
    let u8s = |a: u32, b: u32| {
        format!(
            "{{\"dtype\":\"U8\",\"shape\":[{}],\"data_offsets\":[{a},{b}]}}",
            b - a
        )
    };
    for (case, header) in [
        (
            "overlapping",
            format!("{{\"a\":{},\"b\":{}}}", u8s(0, 8), u8s(4, 12)),
        ),
        (
            "with a gap",
            format!("{{\"a\":{},\"b\":{}}}", u8s(0, 4), u8s(8, 12)),
        ),
        (
            "a key twice",
            format!("{{\"a\":{},\"a\":{}}}", u8s(0, 8), u8s(8, 16)),
        ),
    ] {
        let mut h = header.into_bytes();
        h.resize(h.len().next_multiple_of(8), b' ');
        let mut file = (h.len() as u64).to_le_bytes().to_vec();
        file.extend(h);
        file.extend([0u8; 16]);
        let input = dir.path().join("bad.safetensors");
        std::fs::write(&input, file).unwrap();
        let out = dir.path().join("shards");
        let run = shard(&input, "1x1", &out);
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{case}: {err}");
        assert!(
            err.contains("safetensors refuses its header: InvalidOffset"),
            "{case}: {err}"
        );
        assert!(!out.exists());
    }
}

#[test]
fn compact_rank_files_with_a_bad_index_or_an_edited_encoding_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let shards = sharded_on_2x2(dir.path());
    // The manifest says dense, the rank files say compact.
    let manifest = shards.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let edited = text.replace("\"encoding\": \"compact\"", "\"encoding\": \"dense\"");
    assert_ne!(edited, text);
    std::fs::write(&manifest, &edited).unwrap();
    refused(
        &assemble(&shards, &dir.path().join("a.safetensors"), &[]),
        &[
            "rank-0.safetensors",
            "stores its blocks compact, the manifest says dense",
        ],
    );
    std::fs::write(&manifest, &text).unwrap();
    // A residue index past the 33 classes, the checksum not checked.
    support::cli::corrupt_first_byte(&shards.join("rank-0.safetensors"), "res_type", 200);
    let out = dir.path().join("b.safetensors");
    refused(
        &assemble(&shards, &out, &["--no-verify"]),
        &[
            "feature `res_type`",
            "a stored index 200 names no class of 33",
        ],
    );
    assert!(!out.exists());
    refused(
        &assemble(&shards, &out, &[]),
        &["rank-0.safetensors", "CRC-32"],
    );
}

/// `explain` at the largest length the CLI takes, every semantic at once, under a
/// 512 MB address-space limit: it prints every row without materialising a position
/// per item (before, 6.3 GB and 26 s: it aborted under a 6 GB limit).
#[test]
fn explain_at_the_length_limit_is_bounded_by_its_output() {
    let n = featshard::spec::limits::MAX_LENGTH;
    let lengths =
        format!("tokens={n},atoms={n},rset={n},msa={n},ensemble=1,disto_ensemble=1,templates=4");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "ulimit -v 524288 && exec \"$0\" explain examples/boltz2.yaml --mesh 3x3 --workflow inference --lengths {lengths}"
        ))
        .arg(env!("CARGO_BIN_EXE_featshard"))
        .current_dir(root());
    let out = within(60, cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Atoms spread evenly over as many tokens, one a token: tokens pad to a multiple
    // of 3, and so do the atoms' three owner blocks.
    assert!(stdout.contains("atoms: padded to 134217729"), "{stdout}");
}

#[test]
fn rank_files_of_any_mesh_the_writer_accepts_are_read_back() {
    // Past 256 rank files (what a reader once held mapped at once): 257 on one axis,
    // 17x17 and a real sample on 16x17.
    let dir = tempfile::tempdir().unwrap();
    let sample = real("prot60_nomsa.safetensors");
    for mesh in ["16x17", "17x17", "257"] {
        let shards = dir.path().join(format!("shards-{mesh}"));
        let run = shard(&sample, mesh, &shards);
        assert!(
            run.status.success(),
            "{mesh}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let back = dir.path().join(format!("back-{mesh}.safetensors"));
        let spec = support::cli::spec_for(mesh);
        let read = featshard(&[
            "assemble",
            &spec,
            "--shards",
            &shards.display().to_string(),
            "--out",
            &back.display().to_string(),
        ]);
        assert!(
            read.status.success(),
            "{mesh}: {}",
            String::from_utf8_lossy(&read.stderr)
        );
        let ours = std::fs::read(&back).unwrap();
        let theirs = std::fs::read(dir.path().join("back-16x17.safetensors")).ok();
        if let Some(first) = theirs.filter(|_| mesh != "16x17") {
            assert_eq!(ours, first, "{mesh}: the same sample back as from 16x17");
        }
    }
}

#[test]
fn more_jobs_than_files_may_be_mapped_run_bounded_and_none_fails() {
    // 300 jobs over 300 samples (symbolic links to the real ones: a hard link would
    // change their inode under the tests that read them): at most 256 samples are mapped
    // at once, said on stderr, and every sample is sharded; before, a varying few
    // failed with "more than 256 files mapped at once".
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    for i in 0..300 {
        let source = ["prot60_nomsa", "prot60_smiles"][i % 2];
        let link = data.join(format!("s{i:03}.safetensors"));
        std::os::unix::fs::symlink(real(&format!("{source}.safetensors")), link).unwrap();
    }
    let out = dir.path().join("out");
    let run = shard_command(&data.display().to_string(), "1x1", &out)
        .args(["--jobs", "300"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(err.contains("--jobs 300: 256 samples at a time"), "{err}");
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("dataset.json")).unwrap()).unwrap();
    let samples = m["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 300);
    assert!(samples.iter().all(|s| s["status"] == "sharded"), "{m}");
}

#[test]
fn a_glob_through_link_cycles_ends_and_names_each_sample_once() {
    // g/self -> . and g/sub/up -> .. make `g/**` endless to a walker that follows
    // every link; the cycles are detected and not walked into.
    let dir = tempfile::tempdir().unwrap();
    let g = dir.path().join("g");
    std::fs::create_dir_all(g.join("sub")).unwrap();
    std::os::unix::fs::symlink(real("prot60_nomsa.safetensors"), g.join("a.safetensors")).unwrap();
    std::os::unix::fs::symlink(
        real("prot60_smiles.safetensors"),
        g.join("sub/b.safetensors"),
    )
    .unwrap();
    std::os::unix::fs::symlink(".", g.join("self")).unwrap();
    std::os::unix::fs::symlink("..", g.join("sub/up")).unwrap();
    let out = dir.path().join("out");
    let pattern = format!("{}/**/*.safetensors", g.display());
    let run = within(120, shard_command(&pattern, "1x1", &out));
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("dataset.json")).unwrap()).unwrap();
    let names: Vec<&str> = m["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"], "{m}");
    // A pattern in the working folder, and one level deep only without `**`.
    let mut top = shard_command("g/*.safetensors", "1x1", &dir.path().join("top"));
    top.current_dir(dir.path());
    let run = within(120, top);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("top/dataset.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["samples"].as_array().unwrap().len(), 1, "{m}");
}

/// A 10-token sample on 16,384 one-axis ranks, its one-hot map's columns whole: the
/// rank files are small (the map stored compact), and `assemble` gives the serial sample
/// back under a 1.5 GB address-space limit, from each rank's real items, where the
/// padded global map alone is 2 GB (before: it was made first, and the process aborted;
/// on 65,536 ranks, 34 GB, it refused).
#[test]
fn assembling_to_the_serial_sample_needs_no_padded_global() {
    use featshard::exec::files::{serialize, Metadata};
    use featshard::spec::ir::DType;

    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("map.yaml");
    std::fs::write(
        &spec,
        "version: 1\nmodule: m\nmesh: {cp: [cp]}\n\
         semantics:\n  tokens: {shard: true}\n  atoms: {shard: true, owner: tokens, map: atom_to_token}\n\
         features:\n  \
         atom_to_token: {axes: [atoms, tokens], dtype: int64, coshard: [{axis: 1, follows: 0}], index: {of: tokens, scope: shard_local, one_hot: 1}}\n  \
         ref_pos: {axes: [atoms, 3], dtype: float32}\n  \
         token_index: {axes: [tokens], dtype: int64}\n",
    )
    .unwrap();
    let (tokens, atoms) = (10usize, 20usize);
    let owner = |a: usize| a / 2;
    let map: Vec<u8> = (0..atoms)
        .flat_map(|a| (0..tokens).map(move |t| i64::from(owner(a) == t)))
        .flat_map(i64::to_le_bytes)
        .collect();
    let pos: Vec<u8> = (0..atoms * 3)
        .flat_map(|k| (k as f32 * 0.5).to_le_bytes())
        .collect();
    let index: Vec<u8> = (0..tokens as i64).flat_map(i64::to_le_bytes).collect();
    let tensors = [
        ("atom_to_token", DType::Int64, vec![atoms, tokens], &map[..]),
        ("ref_pos", DType::Float32, vec![atoms, 3], &pos[..]),
        ("token_index", DType::Int64, vec![tokens], &index[..]),
    ];
    let sample = dir.path().join("sample.safetensors");
    std::fs::write(&sample, serialize(&tensors, &Metadata::new()).unwrap()).unwrap();
    let shards = dir.path().join("shards");
    let run = featshard(&[
        "shard",
        spec.to_str().unwrap(),
        "--features",
        sample.to_str().unwrap(),
        "--mesh",
        "16384",
        "--encoding",
        "compact",
        "--out",
        shards.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let back = dir.path().join("back.safetensors");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "ulimit -v 1572864 && exec \"$0\" assemble {} --shards {} --out {}",
            spec.display(),
            shards.display(),
            back.display()
        ))
        .arg(env!("CARGO_BIN_EXE_featshard"));
    let out = within(300, cmd);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(&back).unwrap(),
        std::fs::read(&sample).unwrap()
    );
}
