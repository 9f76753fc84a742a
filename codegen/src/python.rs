//! The Python placement module and its stub, rendered from tera templates.
//!
//! The context is plain strings already written as Python literals, so the templates
//! hold layout only.

use featshard_spec::ir::{DeriveRule, IncomingSource, IndexScope, PadValue, Placement, Role};
use featshard_spec::plan::Split;
use featshard_spec::plan::{FeaturePlan, OwnedBy, Padding, Plan, Remap, SemanticPlan, TensorPlan};
use serde::Serialize;
use tera::{Context, Tera};

use crate::{header_lines, CodegenError};

const MODULE: &str = include_str!("../templates/module.py.tera");
const STUB: &str = include_str!("../templates/module.pyi.tera");
const DATA: &str = include_str!("../templates/data.py.tera");
const TESTS: &str = include_str!("../templates/tests.py.tera");

/// `<module>.py` of a CP spec: the placement tables and the padding, block and
/// distribution functions over them.
pub fn python_module(plan: &Plan) -> Result<String, CodegenError> {
    render("module.py", MODULE, plan)
}

/// `<module>.pyi`: the type stub of `<module>.py`.
pub fn python_stub(plan: &Plan) -> Result<String, CodegenError> {
    render("module.pyi", STUB, plan)
}

/// A pytest parity test of the spec under torch.distributed (`generate --tests`).
pub fn python_tests(plan: &Plan) -> Result<String, CodegenError> {
    render("tests.py", TESTS, plan)
}

/// The data module: sharding and distribution over torch.distributed.
pub fn python_data(plan: &Plan) -> Result<String, CodegenError> {
    render("data.py", DATA, plan)
}

fn render(name: &str, template: &str, plan: &Plan) -> Result<String, CodegenError> {
    render_with(name, template, &context(plan))
}

/// Renders `template` with a context of Python literals; output ends with a newline.
pub(crate) fn render_with(
    name: &str,
    template: &str,
    ctx: &impl Serialize,
) -> Result<String, CodegenError> {
    let mut tera = Tera::default();
    tera.autoescape_on(vec![]);
    tera.add_raw_template(name, template)
        .map_err(|e| CodegenError(format!("{name}: {e:?}")))?;
    let ctx = Context::from_serialize(ctx).map_err(|e| CodegenError(e.to_string()))?;
    let mut out = tera
        .render(name, &ctx)
        .map_err(|e| CodegenError(format!("{name}: {e:?}")))?;
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// The do-not-edit header as Python comments.
pub(crate) fn header_comment(plan: &Plan) -> String {
    header_lines(plan)
        .iter()
        .map(|l| format!("# {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[derive(Serialize)]
struct Ctx {
    header: String,
    module: String,
    sha256: String,
    /// The CP mesh axes as a Python tuple, and its type.
    cp_axes: String,
    cp_axes_type: String,
    /// The meshes the generated parity test runs on: 2-D tiles, or one-axis meshes.
    test_meshes: String,
    dp: String,
    semantics: Vec<SemanticRow>,
    semantic_order: Vec<String>,
    tensors: Vec<TensorRow>,
    masks: Vec<MaskRow>,
    indices: Vec<IndexRow>,
    one_hot: Vec<MaskRow>,
    sparse: Vec<String>,
    ranges: Vec<MaskRow>,
    cosharded: Vec<CoshardRow>,
    shard_local: Vec<ShardLocalRow>,
    repad: Vec<MaskRow>,
    metadata: Vec<String>,
    all_features: Vec<String>,
    workflows: Vec<WorkflowRow>,
    optional: Vec<String>,
    derived: Vec<MaskRow>,
    drop: Vec<String>,
    other_keys: &'static str,
}

#[derive(Serialize)]
struct SemanticRow {
    name: String,
    sharded: &'static str,
    padding: &'static str,
    mesh_axes: String,
    owner: String,
    root: String,
    owner_counts: String,
    owner_map: String,
    window: String,
    incoming: String,
    unowned_rows: &'static str,
}

#[derive(Serialize)]
struct TensorRow {
    name: String,
    placements: String,
    placements_dp: String,
    splits: String,
    semantics: String,
    channels: String,
    dtype: &'static str,
    pad: String,
}

#[derive(Serialize)]
struct MaskRow {
    name: String,
    of: String,
}

#[derive(Serialize)]
struct IndexRow {
    name: String,
    of: String,
    scope: &'static str,
    one_hot: String,
}

#[derive(Serialize)]
struct CoshardRow {
    name: String,
    pairs: String,
}

#[derive(Serialize)]
struct ShardLocalRow {
    name: String,
    of: String,
    mesh_axis: usize,
}

#[derive(Serialize)]
struct WorkflowRow {
    name: String,
    features: Vec<String>,
}

fn context(plan: &Plan) -> Ctx {
    let rows = FeatureRows::of(plan);
    Ctx {
        header: header_comment(plan),
        semantics: plan
            .semantics
            .iter()
            .map(|(name, s)| semantic_row(name, s))
            .collect(),
        module: plan.module.clone(),
        sha256: plan.source.sha256.clone(),
        cp_axes: py_tuple(plan.mesh.axes().iter().map(|a| py_str(a))),
        test_meshes: match plan.mesh.axes().len() {
            1 => "[(1,), (2,), (3,), (4,)]".into(),
            _ => "[(1, 1), (2, 2), (3, 3), (2, 3)]".into(),
        },
        cp_axes_type: format!("tuple[{}]", vec!["str"; plan.mesh.axes().len()].join(", ")),
        dp: plan.mesh.dp.as_deref().map_or("None".into(), py_str),
        semantic_order: plan
            .semantic_order()
            .into_iter()
            .map(str::to_owned)
            .collect(),
        tensors: rows.tensors,
        masks: rows.masks,
        indices: rows.indices,
        one_hot: rows.one_hot,
        sparse: rows.sparse,
        ranges: rows.ranges,
        cosharded: rows.cosharded,
        shard_local: rows.shard_local,
        repad: rows.repad,
        metadata: rows.metadata,
        all_features: plan.features.keys().cloned().collect(),
        workflows: plan
            .workflows
            .iter()
            .map(|(w, fs)| WorkflowRow {
                name: w.clone(),
                features: fs.clone(),
            })
            .collect(),
        optional: rows.optional,
        derived: rows.derived,
        drop: plan.inputs.drop.clone(),
        other_keys: plan.inputs.other_keys.name(),
    }
}

/// One semantic's row of the `SEMANTICS` table.
fn semantic_row(name: &str, s: &SemanticPlan) -> SemanticRow {
    let (padding, mesh_axes) = match &s.padding {
        Padding::None => ("none", Vec::new()),
        Padding::Multiple { mesh_axes, .. } => ("multiple", mesh_axes.clone()),
        Padding::OwnerBlocks { mesh_axes, .. } => ("owner_blocks", mesh_axes.clone()),
    };
    // Ownership on any mesh (in serial order on one axis, in owner blocks on a tile).
    let opt = |f: Option<&str>| f.map_or("None".into(), py_str);
    let (o, r, counts, map) = match &s.owned_by {
        Some(OwnedBy {
            owner,
            root,
            source,
        }) => (
            py_str(owner),
            py_str(root),
            opt(source.counts()),
            opt(source.map()),
        ),
        None => ("None".into(), "None".into(), "None".into(), "None".into()),
    };
    let incoming = match &s.incoming {
        Some(IncomingSource::Mask { feature }) => {
            format!("(\"mask\", {})", py_str(feature))
        }
        Some(IncomingSource::Counts { feature }) => {
            format!("(\"counts\", {})", py_str(feature))
        }
        None => "None".into(),
    };
    SemanticRow {
        name: name.to_owned(),
        sharded: py_bool(s.sharded),
        padding,
        mesh_axes: py_tuple(mesh_axes.iter().map(ToString::to_string)),
        owner: o,
        root: r,
        owner_counts: counts,
        owner_map: map,
        window: s.window.map_or("None".into(), |w| w.to_string()),
        incoming,
        unowned_rows: py_bool(s.unowned_rows_are_pads),
    }
}

/// One tensor feature's row of the placement tables.
fn tensor_row(name: &str, t: &TensorPlan) -> TensorRow {
    TensorRow {
        name: name.to_owned(),
        placements: py_tuple(t.placements.iter().map(py_placement)),
        placements_dp: py_tuple(t.placements_dp.iter().map(py_placement)),
        splits: py_tuple(t.axes.iter().map(|a| match a.split {
            Split::Whole => "None".to_owned(),
            Split::Mesh { mesh_axis } => format!("(\"mesh\", {mesh_axis})"),
            Split::Follows { mesh_axis, .. } => format!("(\"follows\", {mesh_axis})"),
        })),
        semantics: py_axis_semantics(t),
        channels: py_channel_sizes(t),
        dtype: t.dtype.name(),
        pad: py_pad(t.pad_value),
    }
}

/// Every per-feature table but the semantics', filled in one pass over the features.
#[derive(Default)]
struct FeatureRows {
    tensors: Vec<TensorRow>,
    masks: Vec<MaskRow>,
    indices: Vec<IndexRow>,
    one_hot: Vec<MaskRow>,
    sparse: Vec<String>,
    ranges: Vec<MaskRow>,
    cosharded: Vec<CoshardRow>,
    metadata: Vec<String>,
    shard_local: Vec<ShardLocalRow>,
    repad: Vec<MaskRow>,
    optional: Vec<String>,
    derived: Vec<MaskRow>,
}

impl FeatureRows {
    fn of(plan: &Plan) -> FeatureRows {
        let mut rows = FeatureRows::default();
        for (name, f) in &plan.features {
            match f {
                FeaturePlan::Metadata { optional, .. } => {
                    rows.metadata.push(name.clone());
                    if *optional {
                        rows.optional.push(name.clone());
                    }
                }
                FeaturePlan::Tensor(t) => rows.add_tensor(name, t),
            }
        }
        rows
    }

    fn add_tensor(&mut self, name: &str, t: &TensorPlan) {
        if t.optional {
            self.optional.push(name.to_owned());
        }
        if let Some(DeriveRule::Outer { of: [a, b] }) = &t.derived {
            self.derived.push(MaskRow {
                name: name.to_owned(),
                of: format!("({}, {})", py_str(a), py_str(b)),
            });
        }
        self.tensors.push(tensor_row(name, t));
        if let Some(axis) = t.one_hot {
            self.one_hot.push(MaskRow {
                name: name.to_owned(),
                of: axis.to_string(),
            });
        }
        if t.sparse {
            self.sparse.push(name.to_owned());
        }
        if let Some([lo, hi]) = t.range {
            self.ranges.push(MaskRow {
                name: name.to_owned(),
                of: format!("({lo}, {hi})"),
            });
        }
        match &t.role {
            Role::Data => {}
            Role::Mask { of } => self.masks.push(MaskRow {
                name: name.to_owned(),
                of: py_tuple(of.iter().map(|s| py_str(s))),
            }),
            Role::Index(ix) => self.indices.push(IndexRow {
                name: name.to_owned(),
                of: ix.of.clone(),
                scope: match ix.scope {
                    IndexScope::Serial => "serial",
                    IndexScope::ShardLocal => "shard_local",
                    IndexScope::PaddedGlobal => "padded_global",
                },
                one_hot: ix.one_hot.map_or("None".into(), |a| a.to_string()),
            }),
        }
        if let Remap::ToPaddedLayout { of, repad: true } = &t.remap {
            self.repad.push(MaskRow {
                name: name.to_owned(),
                of: py_str(of),
            });
        }
        if let Remap::ShardLocal { of, mesh_axis } = &t.remap {
            self.shard_local.push(ShardLocalRow {
                name: name.to_owned(),
                of: of.clone(),
                mesh_axis: *mesh_axis,
            });
        }
        let pairs: Vec<String> = t
            .axes
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a.split {
                featshard_spec::plan::Split::Follows { leader, .. } => {
                    Some(format!("({i}, {leader})"))
                }
                _ => None,
            })
            .collect();
        if !pairs.is_empty() {
            self.cosharded.push(CoshardRow {
                name: name.to_owned(),
                pairs: py_tuple(pairs.into_iter()),
            });
        }
    }
}

pub(crate) fn py_str(s: &str) -> String {
    // Names are snake_case (checked by the spec crate), so no escaping is needed.
    format!("\"{s}\"")
}

pub(crate) fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// Every axis' semantic as a Python tuple (`None` for a channel axis).
pub(crate) fn py_axis_semantics(t: &TensorPlan) -> String {
    py_tuple(
        t.axes
            .iter()
            .map(|a| a.semantic.as_deref().map_or("None".into(), py_str)),
    )
}

/// Every axis' fixed channel size as a Python tuple (`None` for a semantic axis).
pub(crate) fn py_channel_sizes(t: &TensorPlan) -> String {
    py_tuple(
        t.axes
            .iter()
            .map(|a| a.size.map_or("None".into(), |n| n.to_string())),
    )
}

/// A Python tuple literal; one element gets its trailing comma.
pub(crate) fn py_tuple(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    match items.len() {
        1 => format!("({},)", items[0]),
        _ => format!("({})", items.join(", ")),
    }
}

pub(crate) fn py_placement(p: &Placement) -> String {
    match p {
        Placement::Shard(d) => format!("Shard({d})"),
        Placement::Replicate => "Replicate()".into(),
    }
}

pub(crate) fn py_pad(p: PadValue) -> String {
    match p {
        PadValue::Bool(b) => py_bool(b).into(),
        PadValue::Int(i) => i.to_string(),
        PadValue::Float(x) if x.is_nan() => "math.nan".into(),
        PadValue::Float(x) if x.is_infinite() && x > 0.0 => "math.inf".into(),
        PadValue::Float(x) if x.is_infinite() => "-math.inf".into(),
        PadValue::Float(x) => format!("{x:?}"),
    }
}
