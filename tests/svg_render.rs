//! The SVG pictures rendered by a real browser (headless Chromium, Debian's `chromium`):
//! not blank, and one coloured tile per mesh tile.

use std::path::{Path, PathBuf};
use std::process::Command;

use featshard::picture::PALETTE_SVG;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chromium() -> PathBuf {
    let path = PathBuf::from("/usr/bin/chromium");
    assert!(
        path.exists(),
        "Chromium is needed to render the SVG pictures: apt-get install -y chromium (scripts/test does)"
    );
    path
}

/// Renders `svg` to a PNG with headless Chromium and returns its RGB pixels.
fn render(svg: &Path, png: &Path) -> (usize, usize, Vec<[u8; 3]>) {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1600,1000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", svg.display()))
        .output()
        .expect("run chromium");
    assert!(
        png.exists(),
        "no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(png).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let pixels = buf[..info.buffer_size()]
        .chunks(channels)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    (info.width as usize, info.height as usize, pixels)
}

fn hex(c: &str) -> [u8; 3] {
    let v = u32::from_str_radix(&c[1..], 16).unwrap();
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

#[test]
fn a_feature_picture_renders_with_one_colour_per_tile() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("msa.svg");
    let status = Command::new(env!("CARGO_BIN_EXE_featshard"))
        .args([
            "explain",
            &root().join("examples/boltz2.yaml").display().to_string(),
        ])
        .args([
            "--mesh",
            "3x3",
            "--feature",
            "msa",
            "--svg",
            &svg.display().to_string(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let (w, h, pixels) = render(&svg, &dir.path().join("msa.png"));
    assert!(w > 0 && h > 0);
    let non_white = pixels.iter().filter(|p| **p != [255, 255, 255]).count();
    assert!(
        non_white * 20 > pixels.len(),
        "the picture is (almost) blank"
    );
    // msa is (Shard(0), Shard(1)) on 3x3: nine tiles, each in its own colour.
    let tiles = PALETTE_SVG[..9]
        .iter()
        .filter(|c| {
            let rgb = hex(c);
            pixels.iter().filter(|p| **p == rgb).count() > 500
        })
        .count();
    assert_eq!(tiles, 9, "expected 9 coloured tiles in the rendering");
    assert!(
        !pixels.iter().any(|p| *p == hex(PALETTE_SVG[9])),
        "a tenth tile colour appeared"
    );
}
