//! The Python module of a domain-parallel (PhysicsNeMo ShardTensor) spec: placement
//! tables plus `scatter_inputs` / `gather_outputs` over `scatter_tensor`.

use featshard_spec::plan::Split;
use featshard_spec::plan::{FeaturePlan, Padding, Plan, SplitPlan, TensorPlan};
use serde::Serialize;

use crate::python::{
    header_comment, py_axis_semantics, py_bool, py_channel_sizes, py_pad, py_placement, py_str,
    py_tuple, render_with,
};
use crate::CodegenError;

const MODULE: &str = include_str!("../templates/shard_tensor.py.tera");
const TESTS: &str = include_str!("../templates/shard_tensor_tests.py.tera");

#[derive(Serialize)]
struct Ctx {
    header: String,
    module: String,
    sha256: String,
    domain_axes: String,
    dp: String,
    uneven: String,
    semantics: Vec<SemanticRow>,
    features: Vec<FeatureRow>,
    /// Model parameters placed like the inputs (`parameter: true`).
    parameters: Vec<FeatureRow>,
    /// Model outputs placed like the inputs (`output: true`).
    outputs: Vec<FeatureRow>,
    metadata: Vec<String>,
    workflows: Vec<(String, Vec<String>)>,
    test_meshes: String,
}

#[derive(Serialize)]
struct SemanticRow {
    name: String,
    sharded: &'static str,
    batch: &'static str,
    pad_mesh_axes: String,
    stride: u32,
    halo: u32,
}

#[derive(Serialize)]
struct FeatureRow {
    name: String,
    placements: String,
    splits: String,
    semantics: String,
    channels: String,
    dtype: &'static str,
    pad: String,
}

fn context(plan: &Plan) -> Result<Ctx, CodegenError> {
    let SplitPlan::Domain { axes, uneven } = &plan.mesh.split else {
        return Err(CodegenError(format!(
            "`{}` is not a domain-parallel spec",
            plan.module
        )));
    };
    let rows = Rows::of(plan);
    let workflows = rows.workflows(plan);
    Ok(Ctx {
        header: header_comment(plan),
        module: plan.module.clone(),
        sha256: plan.source.sha256.clone(),
        domain_axes: py_tuple(axes.iter().map(|a| py_str(a))),
        dp: plan.mesh.dp.as_deref().map_or("None".into(), py_str),
        uneven: py_tuple(uneven.iter().map(|&u| py_bool(u).to_owned())),
        semantics: semantic_rows(plan),
        features: rows.features,
        parameters: rows.parameters,
        outputs: rows.outputs,
        metadata: rows.metadata,
        workflows,
        test_meshes: test_meshes(plan),
    })
}

fn semantic_rows(plan: &Plan) -> Vec<SemanticRow> {
    plan.semantics
        .iter()
        .map(|(name, s)| SemanticRow {
            name: name.clone(),
            sharded: py_bool(s.sharded),
            batch: py_bool(s.batch),
            pad_mesh_axes: py_tuple(
                match &s.padding {
                    Padding::Multiple { mesh_axes, .. } => mesh_axes.clone(),
                    _ => Vec::new(),
                }
                .iter()
                .map(ToString::to_string),
            ),
            stride: s.stride.max(1),
            halo: s.halo,
        })
        .collect()
}

/// The plan's features by what they are to the model: inputs, parameters, outputs,
/// metadata.
struct Rows {
    features: Vec<FeatureRow>,
    parameters: Vec<FeatureRow>,
    outputs: Vec<FeatureRow>,
    metadata: Vec<String>,
}

impl Rows {
    fn of(plan: &Plan) -> Rows {
        let mut rows = Rows {
            features: Vec::new(),
            parameters: Vec::new(),
            outputs: Vec::new(),
            metadata: Vec::new(),
        };
        for (name, f) in &plan.features {
            let FeaturePlan::Tensor(t) = f else {
                rows.metadata.push(name.clone());
                continue;
            };
            let to = match (t.parameter, t.output) {
                (true, _) => &mut rows.parameters,
                (_, true) => &mut rows.outputs,
                _ => &mut rows.features,
            };
            to.push(feature_row(name, t));
        }
        rows
    }

    /// Every workflow's inputs: parameters and outputs are the model's, no workflow's.
    fn workflows(&self, plan: &Plan) -> Vec<(String, Vec<String>)> {
        let models: Vec<&str> = self
            .parameters
            .iter()
            .chain(&self.outputs)
            .map(|p| p.name.as_str())
            .collect();
        plan.workflows
            .iter()
            .map(|(w, fs)| {
                let inputs = fs.iter().filter(|f| !models.contains(&f.as_str()));
                (w.clone(), inputs.cloned().collect())
            })
            .collect()
    }
}

fn feature_row(name: &str, t: &TensorPlan) -> FeatureRow {
    FeatureRow {
        name: name.to_owned(),
        placements: py_tuple(t.placements.iter().map(py_placement)),
        splits: py_tuple(t.axes.iter().map(|a| match a.split {
            Split::Mesh { mesh_axis } | Split::Follows { mesh_axis, .. } => mesh_axis.to_string(),
            Split::Whole => "None".to_owned(),
        })),
        semantics: py_axis_semantics(t),
        channels: py_channel_sizes(t),
        dtype: t.dtype.name(),
        pad: py_pad(t.pad_value),
    }
}

/// The generated test's meshes: domain only with uneven shards on 3 ranks (3 x 2 on a
/// 2D domain), and ddp 2 x domain 2 (2 x 2 on a 2D domain): every domain axis split.
/// Without a data-parallel axis the second mesh is domain only too.
fn test_meshes(plan: &Plan) -> String {
    let n = plan.mesh.axes().len();
    let sizes = |lead: &[usize]| {
        let mut v = vec![1usize; n];
        v[..lead.len().min(n)].copy_from_slice(&lead[..lead.len().min(n)]);
        py_tuple(v.iter().map(ToString::to_string))
    };
    let ddp = if plan.mesh.dp.is_some() { 2 } else { 1 };
    format!("[(1, {}), ({ddp}, {})]", sizes(&[3, 2]), sizes(&[2, 2]))
}

fn render(name: &str, template: &str, plan: &Plan) -> Result<String, CodegenError> {
    render_with(name, template, &context(plan)?)
}

/// `<module>.py` of a domain-parallel spec.
pub fn shard_tensor_module(plan: &Plan) -> Result<String, CodegenError> {
    render("shard_tensor.py", MODULE, plan)
}

/// The gloo parity test of a domain-parallel spec (`generate --tests`).
pub fn shard_tensor_tests(plan: &Plan) -> Result<String, CodegenError> {
    render("shard_tensor_tests.py", TESTS, plan)
}
