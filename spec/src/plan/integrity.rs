//! A plan read from a file, checked for what the geometry relies on before anything
//! indexes with it: every name it refers to exists, every mesh axis, tensor axis and
//! shard dimension is in range, and counts are within the spec crate's limits. A plan
//! `plan::plan` built passes by construction; a plan file edited or corrupted by hand
//! is refused by name instead of panicking later.

use crate::infer::Split;
use crate::ir::{DeriveRule, Placement, Role};
use crate::limits;
use crate::mesh::MAX_MESH_AXES;

use super::{FeaturePlan, Padding, Plan, Remap, TensorPlan, PLAN_VERSION};

/// Reads a plan from the JSON `featshard generate` writes to `<module>.plan.json` (its
/// `$comment` header ignored), refusing another format version and a plan whose
/// references or numbers do not hold together ([`check`]).
pub fn from_json(text: &str) -> Result<Plan, String> {
    let mut doc: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if let Some(object) = doc.as_object_mut() {
        object.remove("$comment");
    }
    let plan: Plan = serde_json::from_value(doc).map_err(|e| e.to_string())?;
    if plan.version != PLAN_VERSION {
        return Err(format!(
            "plan format version {} (this featshard reads version {PLAN_VERSION})",
            plan.version
        ));
    }
    check(&plan)?;
    Ok(plan)
}

/// `Err` naming the first thing in `plan` that does not hold together.
pub fn check(plan: &Plan) -> Result<(), String> {
    if plan.features.len() > limits::MAX_FEATURES || plan.semantics.len() > limits::MAX_SEMANTICS {
        return Err(format!(
            "{} features and {} semantics, past the limits ({} and {})",
            plan.features.len(),
            plan.semantics.len(),
            limits::MAX_FEATURES,
            limits::MAX_SEMANTICS
        ));
    }
    for (name, s) in &plan.semantics {
        check_semantic(plan, name, s).map_err(|e| format!("semantic `{name}`: {e}"))?;
    }
    for (name, f) in &plan.features {
        let FeaturePlan::Tensor(t) = f else { continue };
        check_tensor(plan, t).map_err(|e| format!("feature `{name}`: {e}"))?;
    }
    for (workflow, names) in &plan.workflows {
        if let Some(n) = names.iter().find(|n| !plan.features.contains_key(*n)) {
            return Err(format!(
                "workflow `{workflow}` names `{n}`, not a feature of the plan"
            ));
        }
    }
    Ok(())
}

fn semantic(plan: &Plan, name: &str) -> Result<(), String> {
    match plan.semantics.contains_key(name) {
        true => Ok(()),
        false => Err(format!("`{name}` is not a semantic of the plan")),
    }
}

fn feature(plan: &Plan, name: &str) -> Result<(), String> {
    match plan.features.contains_key(name) {
        true => Ok(()),
        false => Err(format!("`{name}` is not a feature of the plan")),
    }
}

fn mesh_axes(plan: &Plan, axes: &[usize]) -> Result<(), String> {
    let count = plan.mesh.axes().len().min(MAX_MESH_AXES);
    match axes.iter().find(|&&m| m >= count) {
        Some(m) => Err(format!("mesh axis {m} (the mesh has {count})")),
        None => Ok(()),
    }
}

fn check_semantic(plan: &Plan, name: &str, s: &super::SemanticPlan) -> Result<(), String> {
    mesh_axes(plan, &s.sharded_on)?;
    match &s.padding {
        Padding::None => {}
        Padding::Multiple {
            mesh_axes: m,
            window,
            ..
        } => {
            mesh_axes(plan, m)?;
            if *window == Some(0) {
                return Err("a window of 0".into());
            }
        }
        Padding::OwnerBlocks {
            owner,
            root,
            source,
            mesh_axes: m,
        } => {
            mesh_axes(plan, m)?;
            semantic(plan, owner)?;
            semantic(plan, root)?;
            if owner == name || root == name {
                return Err("owns itself".into());
            }
            source.counts().map(|c| feature(plan, c)).transpose()?;
            source.map().map(|c| feature(plan, c)).transpose()?;
            // The layout's owner is the ownership's.
            let same = s
                .owned_by
                .as_ref()
                .is_some_and(|o| (&o.owner, &o.root, &o.source) == (owner, root, source));
            if !same {
                return Err("owner blocks without the same `owned_by`".into());
            }
        }
    }
    if let Some(o) = &s.owned_by {
        semantic(plan, &o.owner)?;
        semantic(plan, &o.root)?;
        if o.owner == name || o.root == name {
            return Err("owns itself".into());
        }
        o.source.counts().map(|c| feature(plan, c)).transpose()?;
        o.source.map().map(|c| feature(plan, c)).transpose()?;
    }
    for m in &s.masked_by {
        feature(plan, m)?;
    }
    if let Some(source) = &s.incoming {
        feature(plan, source.feature())?;
    }
    Ok(())
}

/// Every rule a tensor plan read back must keep, first failure first.
fn check_tensor(plan: &Plan, t: &TensorPlan) -> Result<(), String> {
    check_axes(plan, t)?;
    check_placements(plan, t)?;
    check_forms(t)?;
    check_role(plan, t)?;
    check_remap(plan, t)?;
    match &t.derived {
        Some(DeriveRule::Outer { of }) => of.iter().try_for_each(|f| feature(plan, f))?,
        Some(DeriveRule::Halo { of, size }) => {
            feature(plan, of)?;
            if !(1..=limits::MAX_HALO).contains(size) || t.axes.is_empty() {
                return Err(format!(
                    "a halo of {size} items a side over {} axes (1 to {} items, at least one axis)",
                    t.axes.len(),
                    limits::MAX_HALO
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// At most the most axes (none: a scalar), each with a semantic or a size, known mesh
/// axes, and a leader that is another of its axes.
fn check_axes(plan: &Plan, t: &TensorPlan) -> Result<(), String> {
    let rank = t.axes.len();
    if rank > limits::MAX_AXES {
        return Err(format!("{rank} axes (0 to {})", limits::MAX_AXES));
    }
    for (d, a) in t.axes.iter().enumerate() {
        match (&a.semantic, a.size) {
            (Some(s), None) => semantic(plan, s)?,
            (None, Some(_)) => {}
            _ => {
                return Err(format!(
                    "axis {d}: a semantic or a size, not both or neither"
                ))
            }
        }
        mesh_axes(plan, &a.split.mesh_axis().into_iter().collect::<Vec<_>>())
            .map_err(|e| format!("axis {d}: {e}"))?;
        if let Split::Follows { leader, .. } = a.split {
            if leader >= rank || leader == d {
                return Err(format!("axis {d} follows axis {leader}"));
            }
        }
    }
    Ok(())
}

/// One placement per mesh axis (and the dp axis after collate), each shard on an axis
/// the tensor has.
fn check_placements(plan: &Plan, t: &TensorPlan) -> Result<(), String> {
    let rank = t.axes.len();
    let dims = |p: &[Placement], len: usize, extra: usize| -> Result<(), String> {
        let bad = p
            .iter()
            .any(|p| matches!(p, Placement::Shard(d) if *d >= rank + extra));
        match p.len() == len && !bad {
            true => Ok(()),
            false => Err(format!(
                "placements {p:?} do not fit {len} mesh axes and {} tensor axes",
                rank + extra
            )),
        }
    };
    let m = plan.mesh.axes().len();
    dims(&t.placements, m, 0)?;
    if !t.placements_dp.is_empty() {
        dims(&t.placements_dp, m + 1, 1)?;
    }
    Ok(())
}

/// A one-hot axis that is a sized axis; a range of integers, low to high; sparse and
/// ranged features plain data.
fn check_forms(t: &TensorPlan) -> Result<(), String> {
    let rank = t.axes.len();
    if t.one_hot
        .is_some_and(|a| a >= rank || t.axes[a].size.is_none())
    {
        return Err(format!("one-hot axis {:?} is not a sized axis", t.one_hot));
    }
    if t.range
        .is_some_and(|[lo, hi]| lo > hi || !t.dtype.is_integer())
    {
        return Err(format!("range {:?} of a {} feature", t.range, t.dtype));
    }
    if (t.sparse || t.range.is_some()) && (t.role != Role::Data || t.one_hot.is_some()) {
        return Err("a sparse or ranged feature that is not plain data".to_owned());
    }
    Ok(())
}

/// A mask or an index of known semantics; an index's one-hot axis one it has.
fn check_role(plan: &Plan, t: &TensorPlan) -> Result<(), String> {
    let rank = t.axes.len();
    match &t.role {
        Role::Data => {}
        Role::Mask { of } => of.iter().try_for_each(|s| semantic(plan, s))?,
        Role::Index(ix) => {
            semantic(plan, &ix.of)?;
            if ix.one_hot.is_some_and(|a| a >= rank) {
                return Err(format!(
                    "one-hot axis {:?} past its {rank} axes",
                    ix.one_hot
                ));
            }
        }
    }
    Ok(())
}

/// A remap into known semantics and mesh axes, its diagonal block on an axis it has.
fn check_remap(plan: &Plan, t: &TensorPlan) -> Result<(), String> {
    match &t.remap {
        Remap::None => {}
        Remap::ToPaddedLayout { of, .. } => semantic(plan, of)?,
        Remap::ShardLocal { of, mesh_axis } => {
            semantic(plan, of)?;
            mesh_axes(plan, &[*mesh_axis])?;
        }
        Remap::DiagonalBlock {
            of,
            axis,
            mesh_axis,
        } => {
            semantic(plan, of)?;
            mesh_axes(plan, &[*mesh_axis])?;
            if *axis >= t.axes.len() {
                return Err(format!(
                    "diagonal block on axis {axis}, past its {} axes",
                    t.axes.len()
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples() -> Vec<Plan> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "yaml") {
                out.push(crate::compile_file(&path).expect("example compiles").1);
            }
        }
        out
    }

    #[test]
    fn every_example_plan_holds_together_and_reads_back_from_json() {
        let plans = examples();
        assert!(plans.len() >= 3);
        for plan in plans {
            check(&plan).unwrap_or_else(|e| panic!("{}: {e}", plan.module));
            let text = serde_json::to_string(&plan).unwrap();
            assert_eq!(from_json(&text).unwrap(), plan);
        }
    }

    #[test]
    fn a_corrupted_plan_is_refused_by_name() {
        let plan = examples()
            .into_iter()
            .find(|p| p.module == "boltz2_placements")
            .unwrap();
        let text = serde_json::to_value(&plan).unwrap();
        let cases: [(&str, serde_json::Value, &str); 5] = [
            (
                "/features/res_type/axes/0/split/mesh_axis",
                5.into(),
                "feature `res_type`: axis 0: mesh axis 5",
            ),
            (
                "/features/res_type/placements/0",
                serde_json::json!({"shard": 9}),
                "feature `res_type`: placements",
            ),
            (
                "/features/res_type/axes/0/semantic",
                "nowhere".into(),
                "`nowhere` is not a semantic",
            ),
            (
                "/features/res_type/one_hot",
                0.into(),
                "feature `res_type`: one-hot axis Some(0)",
            ),
            (
                "/semantics/atoms/padding/owner",
                "gone".into(),
                "semantic `atoms`: `gone` is not a semantic",
            ),
        ];
        for (at, value, want) in cases {
            let mut doc = text.clone();
            *doc.pointer_mut(at).unwrap_or_else(|| panic!("{at}")) = value;
            let e = from_json(&doc.to_string()).unwrap_err();
            assert!(e.contains(want), "{at}: {e}");
        }
    }
}
