//! Sizes, shapes and tables as `explain` and the refusals print them for people.

use std::fmt::Write as _;

/// Bytes for people: B, KB, MB, GB, TB, PB (powers of 1000); past that in powers of ten.
pub(crate) fn human(n: u128) -> String {
    let units = [
        ("PB", 1e15),
        ("TB", 1e12),
        ("GB", 1e9),
        ("MB", 1e6),
        ("KB", 1e3),
    ];
    let x = n as f64;
    if x >= 1e18 {
        return format!("{x:.2e} B");
    }
    match units.iter().find(|(_, u)| x >= *u) {
        Some((name, u)) => format!("{:.2} {name}", x / u),
        None => format!("{n} B"),
    }
}

/// A shape as `[2, 102, 3]`.
pub(crate) fn shape(s: &[usize]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Symbolic extents as `[pad6(tokens), 3]`.
pub(crate) fn extents(e: &[featshard_spec::plan::Extent]) -> String {
    let items: Vec<String> = e.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// Rows as columns padded to their widest cell, a rule under the first.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let mut widths = vec![0usize; rows.first().map_or(0, Vec::len)];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, &w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            let _ = writeln!(out, "{}", rule.join("  "));
        }
    }
    out
}
