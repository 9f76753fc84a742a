//! The agreement's status frames: any text goes into a frame of exactly its size and
//! comes back a failure; any bytes decode or are refused; terms with a loader's sampler
//! of any text fit a frame; the verdict over any frames is one outcome, never a panic.
#![no_main]

use featshard::exec::agree::{frame_of, verdict, Status, Terms, STATUS_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    let failed = Status::Rank {
        rank: data.len(),
        kind: Some(text.clone()),
        message: text.clone(),
    };
    let frame = failed.encode();
    assert_eq!(frame.len(), STATUS_BYTES);
    assert!(Status::decode(&frame).expect("a frame it wrote").failed());
    let ranks: Vec<usize> = data.iter().map(|&b| usize::from(b)).collect();
    let axes = [(text.clone(), data.len()), ("cp".to_owned(), 1)];
    let terms = Terms::new(
        &text,
        Some(&text),
        &axes,
        &ranks,
        data.first().map(|&b| b.into()),
    );
    let mine = frame_of(0, &Status::Ok, Some(&terms)).encode();
    assert_eq!(mine.len(), STATUS_BYTES);
    // A loader's sampler terms of any text fit a frame too, and differ by digest.
    let drawn = terms.clone().with_sampler(&text);
    assert_ne!(drawn.digest, terms.digest);
    let theirs = frame_of(1, &Status::Ok, Some(&drawn)).encode();
    assert_eq!(theirs.len(), STATUS_BYTES);
    let frames: Vec<Option<Status>> = [&mine[..], data, &frame, &theirs]
        .iter()
        .map(|f| Status::decode(f))
        .collect();
    let _ = verdict(&frames);
});
