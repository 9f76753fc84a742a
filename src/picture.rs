//! `featshard explain --feature` / `--svg`: a feature's padded global shape cut into its
//! mesh tiles, in the terminal or as SVG. Display only: every number comes from the plan.

use std::fmt::Write as _;

use featshard_spec::plan::Split;
use featshard_spec::plan::{Plan, Resolved, TensorPlan};
use featshard_spec::Mesh;

use crate::commands::Failure;

/// Rows (or columns) of tiles drawn whole; past it, the first three and the last two.
pub const SHOWN: usize = 8;

/// Ranks a tile lists by number; past it, the first three, the last and the count.
const LISTED: usize = 8;

/// The grid indices drawn of `n`.
fn shown(n: usize) -> Vec<usize> {
    match n <= SHOWN {
        true => (0..n).collect(),
        false => vec![0, 1, 2, n - 2, n - 1],
    }
}

/// One tile of the picture: the part of the tensor some ranks hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tile {
    /// The tile's row of the rank grid (its cp0 block; 0 when rows are not cut).
    pub row: usize,
    /// The tile's column (its cp1 block; 0 when columns are not cut).
    pub col: usize,
    /// Ranks holding this tile (more than one where a mesh axis replicates).
    pub ranks: Vec<usize>,
    /// The shape each of those ranks holds, symbolic or resolved.
    pub local_shape: String,
    /// Pad items per split axis in this tile, `(axis, count)`, when lengths are known.
    pub pads: Vec<(usize, usize)>,
}

/// How one feature is cut over the mesh: its tiles and what cuts them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Picture {
    /// The feature's name.
    pub feature: String,
    /// Its axes, as the spec writes them.
    pub axes: String,
    /// Its placements on the mesh.
    pub placements: String,
    /// Its global (padded) shape, symbolic or resolved.
    pub global_shape: String,
    /// Tile rows (cp0 blocks, or 1).
    pub rows: usize,
    /// Tile columns (cp1 blocks, or 1).
    pub cols: usize,
    /// The rows drawn, in order: every one up to [`SHOWN`], else the first and last
    /// few (a mesh of thousands of ranks is drawn in a screen, the rest elided).
    pub shown_rows: Vec<usize>,
    /// The columns drawn, likewise.
    pub shown_cols: Vec<usize>,
    /// How the rows are cut: `axis 0 (tokens) over cp0`.
    pub row_cut: Option<String>,
    /// How the columns are cut: `axis 1 (tokens) over cp1`.
    pub col_cut: Option<String>,
    /// Axes every rank holds whole.
    pub whole: Vec<String>,
    /// Co-sharded axes: each rank keeps the diagonal block.
    pub diagonal: Vec<String>,
    /// The names of the mesh axes (one or two).
    pub mesh_axes: Vec<String>,
    /// Every tile, row by row.
    pub tiles: Vec<Tile>,
}

fn tensor<'p>(plan: &'p Plan, name: &str) -> Result<&'p TensorPlan, Failure> {
    plan.tensor(name)
        .ok_or_else(|| match plan.features.get(name) {
            Some(_) => Failure::Other(format!(
                "feature `{name}` is metadata: it is passed through, not sharded"
            )),
            None => Failure::Other(format!("feature `{name}` is not in the spec")),
        })
}

fn axis_name(t: &TensorPlan, d: usize) -> String {
    let a = &t.axes[d];
    match (&a.semantic, a.size) {
        (Some(s), _) => s.clone(),
        (None, Some(n)) => n.to_string(),
        _ => "?".into(),
    }
}

/// The picture of one feature on a mesh; with `resolved`, shapes are numbers.
pub fn picture(
    plan: &Plan,
    mesh: Mesh,
    name: &str,
    resolved: Option<&Resolved>,
) -> Result<Picture, Failure> {
    let t = tensor(plan, name)?;
    let shapes = resolved.and_then(|r| r.features.get(name));
    let split_on = |m: usize| {
        t.axes
            .iter()
            .enumerate()
            .find(|(_, a)| matches!(a.split, Split::Mesh { mesh_axis } if mesh_axis == m))
            .map(|(d, _)| d)
    };
    let cuts = [split_on(0), split_on(1)];
    let symbolic = plan.symbolic_shapes(t, mesh);
    let grid = Grid {
        mesh,
        rows: if cuts[0].is_some() { mesh.size(0) } else { 1 },
        cols: if cuts[1].is_some() { mesh.size(1) } else { 1 },
    };
    let local_shape = shapes.map_or_else(
        || crate::text::extents(&symbolic.local),
        |s| crate::text::shape(&s.local_shape),
    );
    let cut = |m: usize| {
        cuts[m].map(|d| {
            format!(
                "axis {d} ({}) over {}",
                axis_name(t, d),
                plan.mesh.axes()[m]
            )
        })
    };
    Ok(Picture {
        feature: name.to_owned(),
        axes: format!(
            "[{}]",
            (0..t.axes.len())
                .map(|d| axis_name(t, d))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        // As Python writes the tuple: `(Shard(0),)` on one axis.
        placements: match t.placements.as_slice() {
            [one] => format!("{one},"),
            all => all
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        },
        global_shape: shapes.map_or_else(
            || crate::text::extents(&symbolic.global),
            |s| crate::text::shape(&s.global_shape),
        ),
        rows: grid.rows,
        cols: grid.cols,
        shown_rows: shown(grid.rows),
        shown_cols: shown(grid.cols),
        row_cut: cut(0),
        col_cut: cut(1),
        whole: whole_axes(t),
        diagonal: diagonal_axes(plan, t),
        mesh_axes: plan.mesh.axes().to_vec(),
        tiles: grid.tiles(t, shapes.zip(resolved), &local_shape),
    })
}

/// The tiles of a picture: one per block of the split mesh axes.
struct Grid {
    mesh: Mesh,
    rows: usize,
    cols: usize,
}

impl Grid {
    /// Every tile drawn ([`shown`] rows and columns), with the ranks it stands for
    /// and, resolved, its pads.
    fn tiles(
        &self,
        t: &TensorPlan,
        resolved: Option<(&featshard_spec::plan::FeatureShapes, &Resolved)>,
        local_shape: &str,
    ) -> Vec<Tile> {
        let (rows, cols, mesh) = (self.rows, self.cols, self.mesh);
        let mut tiles = Vec::new();
        for row in shown(rows) {
            for col in shown(cols) {
                let ranks: Vec<usize> = mesh
                    .coords()
                    .enumerate()
                    .filter(|(_, c)| {
                        (rows == 1 || c.get(0) == row) && (cols == 1 || c.get(1) == col)
                    })
                    .map(|(r, _)| r)
                    .collect();
                let pads = resolved.map_or_else(Vec::new, |(s, r)| tile_pads(t, r, s, [row, col]));
                tiles.push(Tile {
                    row,
                    col,
                    ranks,
                    local_shape: local_shape.to_owned(),
                    pads,
                });
            }
        }
        tiles
    }
}

/// The feature's axes of a semantic that no mesh axis splits.
fn whole_axes(t: &TensorPlan) -> Vec<String> {
    t.axes
        .iter()
        .enumerate()
        .filter(|(_, a)| a.semantic.is_some() && a.split == Split::Whole)
        .map(|(d, _)| format!("axis {d} ({})", axis_name(t, d)))
        .collect()
}

/// The feature's axes split with another (block-diagonal).
fn diagonal_axes(plan: &Plan, t: &TensorPlan) -> Vec<String> {
    t.axes
        .iter()
        .enumerate()
        .filter_map(|(d, a)| match a.split {
            Split::Follows { leader, mesh_axis } => Some(format!(
                "axis {d} ({}) follows axis {leader} over {}",
                axis_name(t, d),
                plan.mesh.axes()[mesh_axis]
            )),
            _ => None,
        })
        .collect()
}

/// Pad items of each split axis inside the tile at `grid` (row, col; a picture is
/// drawn in two dimensions, a one-axis mesh's tiles in one column).
fn tile_pads(
    t: &TensorPlan,
    r: &Resolved,
    shapes: &featshard_spec::plan::FeatureShapes,
    grid: [usize; 2],
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (d, a) in t.axes.iter().enumerate() {
        let (Some(s), Some(m)) = (&a.semantic, a.split.mesh_axis()) else {
            continue;
        };
        let local = shapes.local_shape[d];
        let start = grid[m] * local;
        let real = match r.blocks.get(s) {
            // Owner blocks: the real items of the blocks inside this tile.
            Some(b) => b
                .block_counts
                .iter()
                .enumerate()
                .filter(|(k, _)| (start..start + local).contains(&(k * b.per_block)))
                .map(|(_, &n)| n)
                .sum(),
            // End-padded: real items first.
            None => shapes.serial_shape[d].saturating_sub(start).min(local),
        };
        if real < local {
            out.push((d, local - real));
        }
    }
    out
}

/// The picture as text: a box per tile with its ranks, local shape and pads; colour
/// (one background per tile) when `color`.
pub fn render_text(p: &Picture, color: bool) -> String {
    let mut out = text_header(p);
    let labels: Vec<[String; 3]> = p.tiles.iter().map(tile_lines).collect();
    let width = labels
        .iter()
        .flat_map(|l| l.iter().map(|s| s.chars().count()))
        .max()
        .unwrap_or(8)
        + 2;
    let cols = p.shown_cols.len().max(1);
    // After a column whose successor is not the next one: a narrow `…` column.
    let gap_after = |c: usize| {
        p.shown_cols
            .get(c + 1)
            .is_some_and(|&n| n != p.shown_cols[c] + 1)
    };
    let rule = |l: char, m: char, r: char| {
        let mut s = String::new();
        s.push(l);
        for c in 0..cols {
            s.push_str(&"─".repeat(width));
            if gap_after(c) {
                s.push(m);
                s.push_str("───");
            }
            s.push(if c + 1 == cols { r } else { m });
        }
        s
    };
    let _ = writeln!(out, "{}", rule('┌', '┬', '┐'));
    for (row, row_labels) in labels.chunks(cols).enumerate() {
        for line in 0..3 {
            let mut s = String::from("│");
            for (col, label) in row_labels.iter().enumerate() {
                let k = row * cols + col;
                let text = format!(" {:<w$}", label[line], w = width - 1);
                if color {
                    let bg = PALETTE_ANSI[k % PALETTE_ANSI.len()];
                    let _ = write!(s, "\x1b[30;48;5;{bg}m{text}\x1b[0m│");
                } else {
                    let _ = write!(s, "{text}│");
                }
                if gap_after(col) {
                    s.push_str(if line == 1 { " … │" } else { "   │" });
                }
            }
            let _ = writeln!(out, "{s}");
        }
        let (at, next) = (p.shown_rows.get(row), p.shown_rows.get(row + 1));
        if let (Some(&at), Some(&next)) = (at, next) {
            let _ = writeln!(out, "{}", rule('├', '┼', '┤'));
            if next != at + 1 {
                let _ = writeln!(out, "  ⋮ {} more rows of tiles", next - at - 1);
                let _ = writeln!(out, "{}", rule('├', '┼', '┤'));
            }
        }
    }
    let _ = writeln!(out, "{}", rule('└', '┴', '┘'));
    let hidden = p.rows * p.cols - p.shown_rows.len() * p.shown_cols.len();
    if hidden > 0 {
        let _ = writeln!(
            out,
            "({} of {} tiles drawn: the first three and the last two rows and columns)",
            p.tiles.len(),
            p.rows * p.cols
        );
    }
    out
}

/// The text picture's lines above its tiles: the feature, its global shape, what
/// splits its rows and columns, what stays whole.
fn text_header(p: &Picture) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} {} -> ({})", p.feature, p.axes, p.placements);
    let _ = writeln!(out, "global shape {}", p.global_shape);
    let replicated = |m: usize| {
        let axis = p.mesh_axes.get(m).map_or("the mesh", String::as_str);
        format!("replicated over {axis}")
    };
    let rows = p.row_cut.clone().unwrap_or_else(|| replicated(0));
    match p.mesh_axes.len() {
        1 => {
            let _ = writeln!(out, "rows: {rows}");
        }
        _ => {
            let cols = p.col_cut.clone().unwrap_or_else(|| replicated(1));
            let _ = writeln!(out, "rows: {rows}; columns: {cols}");
        }
    }
    if !p.whole.is_empty() {
        let _ = writeln!(out, "whole on every rank: {}", p.whole.join(", "));
    }
    if !p.diagonal.is_empty() {
        let _ = writeln!(out, "diagonal blocks: {}", p.diagonal.join(", "));
    }
    out
}

fn tile_lines(t: &Tile) -> [String; 3] {
    let listed = |ranks: &[usize]| {
        let text = |r: &[usize]| r.iter().map(ToString::to_string).collect::<Vec<_>>();
        match ranks.len() <= LISTED {
            true => text(ranks).join(","),
            false => format!(
                "{},…,{} ({})",
                text(&ranks[..3]).join(","),
                ranks[ranks.len() - 1],
                ranks.len()
            ),
        }
    };
    let ranks = match t.ranks.as_slice() {
        [one] => format!("rank {one}"),
        many => format!("ranks {}", listed(many)),
    };
    let pads = if t.pads.is_empty() {
        String::new()
    } else {
        format!(
            "pad {}",
            t.pads
                .iter()
                .map(|(d, n)| format!("{n} on axis {d}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    [ranks, t.local_shape.clone(), pads]
}

/// 256-colour backgrounds, light enough for black text.
const PALETTE_ANSI: [u8; 9] = [153, 158, 223, 189, 194, 225, 152, 229, 182];
/// The SVG fills, one per tile in order (distinct, so a rendering can be counted).
pub const PALETTE_SVG: [&str; 16] = [
    "#a6cee3", "#b2df8a", "#fb9a99", "#fdbf6f", "#cab2d6", "#ffff99", "#8dd3c7", "#bebada",
    "#80b1d3", "#fdb462", "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One picture of the SVG grid at `(x0, y0)`: its title lines and its tiles.
fn svg_picture(
    s: &mut String,
    p: &Picture,
    (x0, y0): (usize, usize),
    (tile_w, tile_h, head): (usize, usize, usize),
) {
    let _ = writeln!(
        s,
        "<g class=\"feature\" data-feature=\"{}\"><text x=\"{x0}\" y=\"{}\" font-weight=\"bold\">{} {}</text>",
        escape(&p.feature),
        y0 + 14,
        escape(&p.feature),
        escape(&p.axes)
    );
    let _ = writeln!(
        s,
        "<text x=\"{x0}\" y=\"{}\">({}) global {}</text>",
        y0 + 30,
        escape(&p.placements),
        escape(&p.global_shape)
    );
    let _ = writeln!(
        s,
        "<text x=\"{x0}\" y=\"{}\" fill=\"#555\">rows: {}; cols: {}</text>",
        y0 + 46,
        escape(p.row_cut.as_deref().unwrap_or("replicated")),
        escape(p.col_cut.as_deref().unwrap_or("replicated"))
    );
    for (k, t) in p.tiles.iter().enumerate() {
        // Drawn where it stands among the shown tiles (elided ones take no room).
        let at = |v: &[usize], i: usize| v.iter().position(|&x| x == i).unwrap_or(0);
        let (col, row) = (at(&p.shown_cols, t.col), at(&p.shown_rows, t.row));
        let (x, y) = (x0 + col * tile_w, y0 + head + row * tile_h);
        let fill = PALETTE_SVG[k % PALETTE_SVG.len()];
        let [ranks, shape, pads] = tile_lines(t);
        let _ = writeln!(
            s,
            "<rect class=\"tile\" x=\"{x}\" y=\"{y}\" width=\"{tile_w}\" height=\"{tile_h}\" fill=\"{fill}\" stroke=\"#333\"/>"
        );
        for (i, line) in [ranks, shape, pads].iter().enumerate() {
            if !line.is_empty() {
                let _ = writeln!(
                    s,
                    "<text x=\"{}\" y=\"{}\">{}</text>",
                    x + 6,
                    y + 18 + i * 16,
                    escape(line)
                );
            }
        }
    }
}

/// Every picture in one SVG document, a grid of small pictures.
pub fn render_svg(pictures: &[Picture]) -> String {
    const TILE_H: usize = 64;
    // Monospace 12px is about 7.2px a character; tiles fit their longest label.
    let longest = pictures
        .iter()
        .flat_map(|p| {
            p.tiles
                .iter()
                .flat_map(|t| tile_lines(t).map(|l| l.chars().count()))
        })
        .max()
        .unwrap_or(0);
    let tile_w = (longest * 15 / 2 + 14).max(150);
    const HEAD: usize = 58;
    const GAP: usize = 28;
    let per_row = 3.min(pictures.len().max(1));
    let cell_w = |p: &Picture| p.shown_cols.len() * tile_w;
    let cell_h = |p: &Picture| HEAD + p.shown_rows.len() * TILE_H;
    let col_w = pictures
        .iter()
        .map(cell_w)
        .max()
        .unwrap_or(tile_w)
        .max(3 * 150)
        + GAP;
    let row_h = pictures.iter().map(cell_h).max().unwrap_or(TILE_H) + GAP;
    let rows = pictures.len().div_ceil(per_row);
    let (width, height) = (per_row * col_w + GAP, rows * row_h + GAP);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"monospace\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for (n, p) in pictures.iter().enumerate() {
        let (x0, y0) = (GAP + (n % per_row) * col_w, GAP + (n / per_row) * row_h);
        svg_picture(&mut s, p, (x0, y0), (tile_w, TILE_H, HEAD));
        s.push_str("</g>\n");
    }
    s.push_str("</svg>\n");
    s
}
