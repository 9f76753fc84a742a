//! Validation of the Spec IR, shared by every front end.
//!
//! Each rule adds a [`SpecError`] naming the feature, axis or semantic and pointing at
//! the item's location; all errors are collected before anything fails.

use std::collections::{BTreeMap, BTreeSet};

use crate::diag::SpecError;
use crate::infer::Inferred;
use crate::ir::*;
use crate::limits;
use crate::loc::Loc;
use crate::names::{
    camel_is_keyword, did_you_mean, is_feature_name, is_keyword, is_snake_case, shadows_an_import,
    upper_camel, PATH,
};
use crate::ownership::OwnerChains;

/// Every problem found in `spec`, in a stable order (empty when the spec is valid).
pub fn check(spec: &Spec) -> Vec<SpecError> {
    let mut c = Checker {
        spec,
        ownership: OwnerChains::of(spec),
        errors: Vec::new(),
    };
    c.names();
    c.semantics();
    c.inputs();
    c.domain();
    for (name, _, t) in spec.tensors() {
        c.tensor(name, t);
    }
    for f in spec.features.values() {
        c.workflows_of(f);
    }
    c.errors
}

struct Checker<'a> {
    spec: &'a Spec,
    /// Owner chains, bounded: checks after `ownership_trees` read them.
    ownership: OwnerChains<'a>,
    errors: Vec<SpecError>,
}

impl<'a> Checker<'a> {
    fn err(&mut self, e: SpecError) {
        self.errors.push(e);
    }

    /// The module name names the generated files: short, an identifier, shadowing
    /// nothing the generated code imports.
    fn module_name(&mut self) {
        let m = &self.spec.module;
        if m.name.len() > limits::MAX_MODULE_NAME {
            self.err(SpecError::new(
                format!(
                    "module name is {} characters, more than the limit of {} (it names the generated files)",
                    m.name.len(),
                    limits::MAX_MODULE_NAME
                ),
                m.loc,
            ));
        } else if shadows_an_import(&m.name) {
            self.err(
                SpecError::new(
                    format!(
                        "module name `{}` would shadow the `{}` module the generated code imports",
                        m.name, m.name
                    ),
                    m.loc,
                )
                .help("choose a name of your own, e.g. `boltz2_placements`"),
            );
        } else if !is_snake_case(&m.name) || is_keyword(&m.name) {
            self.err(
                SpecError::new(
                    format!("module name `{}` is not a usable identifier", m.name),
                    m.loc,
                )
                .help(
                    "use snake_case that is not a Python or Rust keyword, e.g. `boltz2_placements`",
                ),
            );
        }
    }

    fn names(&mut self) {
        self.module_name();
        let spec = self.spec;
        let mut mesh_names: Vec<&Named> = spec.mesh.axes().iter().collect();
        mesh_names.extend(spec.mesh.dp.iter());
        let mut seen = BTreeSet::new();
        for n in mesh_names {
            if !is_snake_case(&n.name) {
                self.err(SpecError::new(
                    format!("mesh axis name `{}` must be snake_case", n.name),
                    n.loc,
                ));
            }
            if !seen.insert(n.name.as_str()) {
                self.err(SpecError::new(
                    format!("mesh axis name `{}` is used twice", n.name),
                    n.loc,
                ));
            }
        }
        let mut semantic_camel: BTreeMap<String, &str> = BTreeMap::new();
        for s in spec.semantics.values() {
            if !is_snake_case(&s.name) {
                self.err(
                    SpecError::new("semantic names must be snake_case", s.loc).semantic(&s.name),
                );
            } else if let Some(e) = variant_problem(&mut semantic_camel, &s.name, s.loc, "Semantic")
            {
                self.err(e.semantic(&s.name));
            }
        }
        let mut workflow_camel: BTreeMap<String, &str> = BTreeMap::new();
        for (w, loc) in &spec.workflows {
            if !is_snake_case(w) {
                self.err(SpecError::new(
                    format!("workflow name `{w}` must be snake_case"),
                    *loc,
                ));
            } else if let Some(e) = variant_problem(&mut workflow_camel, w, *loc, "Workflow") {
                self.err(e);
            }
        }
        // Rust variants are the UpperCamel names; two features must not collide there.
        let mut camel: BTreeMap<String, &str> = BTreeMap::new();
        for f in spec.features.values() {
            if !is_feature_name(&f.name) {
                self.err(
                    SpecError::new(
                        "feature names are snake_case (`[a-z][a-z0-9_]*`, no `__`), or a path of such names joined by `.` for a feature of a nested dict (`constraint_feature.contact`)",
                        f.loc,
                    )
                    .feature(&f.name),
                );
                continue;
            }
            if let Some(dict) = self.holds_a_feature(&f.name) {
                self.err(
                    SpecError::new(
                        format!(
                            "`{dict}` is a feature, so it cannot also be a dict holding `{}`",
                            f.name
                        ),
                        f.loc,
                    )
                    .feature(&f.name),
                );
            }
            if let Some(e) = variant_problem(&mut camel, &f.name, f.loc, "Feature") {
                self.err(e.feature(&f.name));
            }
        }
    }

    /// The first dict of a feature's path that is itself a feature (`a` of `a.b`).
    fn holds_a_feature(&self, name: &str) -> Option<String> {
        let parts: Vec<&str> = name.split(PATH).collect();
        (1..parts.len())
            .map(|k| parts[..k].join(PATH))
            .find(|dict| self.spec.features.contains_key(dict))
    }

    fn undeclared_semantic(&self, name: &str, loc: crate::loc::Loc) -> SpecError {
        let e = SpecError::new(format!("semantic `{name}` is not declared"), loc);
        match did_you_mean(name, self.spec.semantics.keys().map(String::as_str)) {
            Some(h) => e.help(format!("{h} (a declared semantic)")),
            None => e.help("declare it as a semantic, sharded or not"),
        }
    }

    /// `parameter: true` and `output: true`: a plain data tensor of a domain spec, the
    /// model's (always there), one or the other.
    fn parameters(&mut self) {
        let spec = self.spec;
        for (name, f, t) in spec.tensors() {
            let (at, what) = match (t.parameter, t.output) {
                (Some(_), Some(o)) => {
                    self.err(
                        SpecError::new(
                            "a feature is a model parameter or a model output, not both",
                            o,
                        )
                        .feature(name),
                    );
                    continue;
                }
                (Some(p), None) => (p, "parameter"),
                (None, Some(o)) => (o, "output"),
                (None, None) => continue,
            };
            let why = if !spec.mesh.is_domain() {
                format!("model {what}s are placed for domain-parallel (ShardTensor) specs (`mesh: {{domain: [...]}}`)")
            } else if !matches!(t.role, Role::Data) {
                format!("a model {what} holds values, not a mask or indices")
            } else if f.optional.is_some() || t.derived.is_some() {
                format!(
                    "a model {what} is the model's, always there: it cannot be optional or derived"
                )
            } else {
                continue;
            };
            self.err(SpecError::new(why, at).feature(name));
        }
    }

    /// What a domain-parallel (ShardTensor) spec cannot hold, and what only it can.
    fn domain(&mut self) {
        let spec = self.spec;
        self.parameters();
        if !spec.mesh.is_domain() {
            for s in spec.semantics.values().filter(|s| s.batch) {
                self.err(
                    SpecError::new(
                        "`batch: true` declares the per-domain-group batch axis of a domain-parallel spec (`mesh: {domain: [...]}`)",
                        s.loc,
                    )
                    .semantic(&s.name),
                );
            }
            return;
        }
        for s in spec.semantics.values() {
            if let Some(o) = &s.owner {
                self.err(
                    SpecError::new(
                        "owner-partitioned semantics are for context-parallel (DTensor) specs; a domain axis splits into contiguous pieces",
                        o.source_loc,
                    )
                    .semantic(&s.name),
                );
            }
        }
        for (name, _, t) in spec.tensors() {
            if let Some(c) = t.coshard.first() {
                self.err(
                    SpecError::new(
                        "co-sharded (block-diagonal) axes are for context-parallel (DTensor) specs",
                        c.loc,
                    )
                    .feature(name)
                    .axis(
                        c.axis,
                        t.axes
                            .get(c.axis)
                            .map_or(String::new(), |a| a.kind.to_string()),
                    ),
                );
            }
            if let Role::Index(IndexRole {
                scope: IndexScope::ShardLocal | IndexScope::PaddedGlobal,
                ..
            }) = &t.role
            {
                self.err(
                    SpecError::new(
                        "index remapping (shard_local, padded_global) is for context-parallel (DTensor) specs; use `scope: serial`",
                        t.role_loc,
                    )
                    .feature(name),
                );
            }
            let batch: Vec<usize> = t
                .axes
                .iter()
                .enumerate()
                .filter(|(_, a)| {
                    a.semantic()
                        .and_then(|s| spec.semantics.get(s))
                        .is_some_and(|s| s.batch)
                })
                .map(|(i, _)| i)
                .collect();
            if batch.len() > 1 {
                let i = batch[1];
                self.err(
                    SpecError::new("a feature has at most one batch axis", t.axes[i].loc)
                        .feature(name)
                        .axis(i, &t.axes[i].kind),
                );
            }
        }
    }

    fn semantics(&mut self) {
        let spec = self.spec;
        for s in spec.semantics.values() {
            let Some(owner) = &s.owner else { continue };
            let Some(os) = spec.semantics.get(&owner.owner.name) else {
                let e = self.undeclared_semantic(&owner.owner.name, owner.owner.loc);
                self.err(e.semantic(&s.name));
                continue;
            };
            if os.name == s.name {
                self.err(
                    SpecError::new("a semantic cannot own itself", owner.owner.loc)
                        .semantic(&s.name),
                );
                continue;
            }
            if s.sharded && !os.sharded {
                self.err(
                    SpecError::new(
                        format!(
                            "is sharded but its owner `{}` is not: owned items follow their owner's shard",
                            os.name
                        ),
                        owner.owner.loc,
                    )
                    .semantic(&s.name),
                );
            }
            self.owner_source(s, owner);
        }
        for s in spec.semantics.values() {
            if let Some(inc) = &s.incoming {
                self.incoming(s, inc);
                if let Some((value, at)) = inc.map_pad {
                    self.map_pad(s, value, at);
                }
            }
            if let Some(at) = s.unowned_rows {
                self.unowned_rows(s, at);
            }
            if let Some(at) = s.windows {
                self.windows(s, at);
            }
        }
        self.ownership_trees();
    }

    /// `layout: windows` needs a window, and a 2-D tile keeps no co-sharded diagonal
    /// block of its items: they lie in serial order, not in their owner's block.
    fn windows(&mut self, s: &Semantic, at: Loc) {
        if s.window.is_none() {
            self.err(
                SpecError::new("`layout: windows` needs the window: `window: W`", at)
                    .semantic(&s.name),
            );
        }
        if self.spec.mesh.is_cp_1d() {
            return;
        }
        let spec = self.spec;
        for (name, _, t) in spec.tensors() {
            let ours = |d: usize| t.axes.get(d).and_then(Axis::semantic) == Some(s.name.as_str());
            if let Some(c) = t.coshard.iter().find(|c| ours(c.axis) || ours(c.follows)) {
                self.err(
                    SpecError::new(
                        format!(
                            "co-shards an axis of `{}`, whose items lie in serial order (`layout: windows`), not in their owner's block: a 2-D tile has no diagonal block of it",
                            s.name
                        ),
                        c.loc,
                    )
                    .feature(name)
                    .help("give the map as an id vector (`[atoms]` ids, `index: {of: tokens}`), or keep `layout: owner_blocks`"),
                );
            }
        }
    }

    /// Ownership must form trees: follow owners until a root, a repeat, or more than
    /// the depth limit (each walk is then bounded, so checking is linear). A chain too
    /// deep is reported once, at its leaf.
    fn ownership_trees(&mut self) {
        let spec = self.spec;
        let owners: BTreeSet<&str> = spec
            .semantics
            .values()
            .filter_map(|s| s.owner.as_ref().map(|o| o.owner.name.as_str()))
            .collect();
        for s in spec.semantics.values() {
            let leaf = !owners.contains(s.name.as_str());
            let mut seen = BTreeSet::from([s.name.as_str()]);
            let mut cur = s;
            while let Some(o) = &cur.owner {
                let Some(next) = spec.semantics.get(&o.owner.name) else {
                    break;
                };
                if seen.len() > limits::MAX_OWNER_DEPTH {
                    if !leaf {
                        break;
                    }
                    self.err(
                        SpecError::new(
                            format!(
                                "its ownership chain is more than {} owners deep",
                                limits::MAX_OWNER_DEPTH
                            ),
                            s.loc,
                        )
                        .semantic(&s.name),
                    );
                    break;
                }
                if !seen.insert(next.name.as_str()) {
                    if next.name == s.name && next.name != cur.name {
                        self.err(
                            SpecError::new(
                                format!(
                                    "ownership cycle: {}",
                                    seen.iter().copied().collect::<Vec<_>>().join(" -> ")
                                ),
                                o.owner.loc,
                            )
                            .semantic(&s.name),
                        );
                    }
                    break;
                }
                cur = next;
            }
        }
    }

    /// The tensor feature `fname` that semantic `s` names as `what`, or an error.
    fn named_tensor(
        &mut self,
        s: &Semantic,
        fname: &str,
        what: &str,
        at: Loc,
    ) -> Option<&'a TensorFeature> {
        let spec: &'a Spec = self.spec;
        let Some(f) = spec.features.get(fname) else {
            let mut e =
                SpecError::new(format!("{what} `{fname}` is not declared"), at).semantic(&s.name);
            if let Some(h) = did_you_mean(fname, spec.features.keys().map(String::as_str)) {
                e = e.help(h);
            }
            self.err(e);
            return None;
        };
        let FeatureKind::Tensor(t) = &f.kind else {
            self.err(
                SpecError::new(format!("{what} must be a tensor, not metadata"), f.loc)
                    .feature(fname)
                    .semantic(&s.name),
            );
            return None;
        };
        if f.only.is_some() {
            self.err(
                SpecError::new(
                    format!(
                        "is the {what} of `{}`, so it must be in every workflow (remove `only`)",
                        s.name
                    ),
                    f.loc,
                )
                .feature(fname),
            );
        }
        if let Some(d) = &t.derived {
            self.err(
                SpecError::new(
                    format!(
                        "is the {what} of `{}`, so the sample must hold it: it cannot be derived",
                        s.name
                    ),
                    d.loc,
                )
                .feature(fname),
            );
        }
        Some(t)
    }

    /// A feature every sample must hold: not optional.
    fn required(&mut self, s: &Semantic, fname: &str, what: &str) {
        if let Some(at) = self.spec.features.get(fname).and_then(|f| f.optional) {
            self.err(
                SpecError::new(
                    format!(
                        "is the {what} of `{}`, which every sample needs: it cannot be optional",
                        s.name
                    ),
                    at,
                )
                .feature(fname),
            );
        }
    }

    fn owner_source(&mut self, s: &Semantic, owner: &Owner) {
        let source = &owner.source;
        if let Some(fname) = source.counts() {
            if !matches!(source, OwnerSource::CountsOrMap { .. }) {
                self.required(s, fname, "owner counts");
            }
            if let Some(t) = self.named_tensor(s, fname, "owner counts", owner.source_loc) {
                self.owner_counts(s, owner, fname, t);
            }
        }
        if let Some(fname) = source.map() {
            self.required(s, fname, "owner map");
            if let Some(t) = self.named_tensor(s, fname, "owner map", owner.source_loc) {
                self.owner_map(s, owner, fname, t);
            }
        }
    }

    /// An owner map is a one-hot `[items, owner]` matrix (Boltz's form) or an id
    /// vector: an integer `[items]` index of the owner (AlphaFold3's `atom_to_token_idx`).
    fn owner_map(&mut self, s: &Semantic, owner: &Owner, fname: &str, t: &TensorFeature) {
        let (items, of) = (s.name.as_str(), owner.owner.name.as_str());
        let sems: Vec<Option<&str>> = t.axes.iter().map(Axis::semantic).collect();
        if sems == [Some(items), Some(of)] {
            return;
        }
        let ids_of = match &t.role {
            Role::Index(ix) if ix.one_hot.is_none() => Some(ix.of.as_str()),
            _ => None,
        };
        let fault = if sems != [Some(items)] {
            None
        } else if !t.dtype.is_integer() {
            Some((
                format!(
                    "an id vector of `{of}` ids is an integer dtype, not {}",
                    t.dtype
                ),
                t.dtype_loc,
            ))
        } else if ids_of != Some(of) {
            Some((
                format!("an id vector names `{of}` items: declare `index: {{of: {of}}}`"),
                t.role_loc,
            ))
        } else {
            return;
        };
        let (message, at) = fault.unwrap_or_else(|| {
            (
                format!(
                    "owner map of `{items}` must be a one-hot `[{items}, {of}]` or a `[{items}]` id vector (`index: {{of: {of}}}`)"
                ),
                t.axes_loc,
            )
        });
        self.err(SpecError::new(message, at).feature(fname));
    }

    fn owner_counts(&mut self, s: &Semantic, owner: &Owner, fname: &str, t: &TensorFeature) {
        let sems: Vec<Option<&str>> = t.axes.iter().map(Axis::semantic).collect();
        if sems != [Some(owner.owner.name.as_str())] {
            self.err(
                SpecError::new(
                    format!(
                        "counts of `{}` per `{}` must have axes `[{}]`",
                        s.name, owner.owner.name, owner.owner.name
                    ),
                    t.axes_loc,
                )
                .feature(fname),
            );
        }
        if !t.dtype.is_integer() {
            self.err(
                SpecError::new(
                    format!("owner counts must be an integer dtype, not {}", t.dtype),
                    t.dtype_loc,
                )
                .feature(fname),
            );
        }
    }

    /// Incoming pads: the feature that tells the real items must be in every sample,
    /// and a mask must be 1-D over the semantic.
    fn incoming(&mut self, s: &Semantic, inc: &Incoming) {
        let fname = inc.source.feature();
        match &inc.source {
            IncomingSource::Counts { .. } => self.required(s, fname, "real-item counts"),
            IncomingSource::Mask { .. } => {
                self.required(s, fname, "incoming-pad mask");
                let Some(t) = self.named_tensor(s, fname, "incoming-pad mask", inc.loc) else {
                    return;
                };
                let one_d =
                    matches!(t.axes.as_slice(), [a] if a.semantic() == Some(s.name.as_str()));
                let masks = matches!(&t.role, Role::Mask { of } if of.contains(&s.name));
                if !one_d || !masks {
                    self.err(
                        SpecError::new(
                            format!(
                                "tells the real items of `{}`, so it must be a mask with axes `[{}]` (`mask: {}`)",
                                s.name, s.name, s.name
                            ),
                            t.axes_loc,
                        )
                        .feature(fname),
                    );
                }
            }
        }
    }

    /// `unowned_rows: pad` needs an owner map (one-hot or ids); ids of the items are
    /// renumbered past the dropped rows by intake (an id of a dropped row refused).
    /// `map_pad`: the incoming pads' value of an owner id vector, an id it may hold
    /// (an owner's, or its `none`).
    fn map_pad(&mut self, s: &Semantic, value: i64, at: Loc) {
        let spec: &'a Spec = self.spec;
        let map = s.owner.as_ref().and_then(|o| o.source.map());
        let ids = map.and_then(|m| match &spec.features.get(m)?.kind {
            FeatureKind::Tensor(t) => match &t.role {
                Role::Index(ix) if ix.one_hot.is_none() && t.axes.len() == 1 => Some((m, t, ix)),
                _ => None,
            },
            _ => None,
        });
        let Some((m, t, ix)) = ids else {
            self.err(
                SpecError::new(
                    "`map_pad` is the value an owner id vector holds at incoming pads: it needs `map:` an `[items]` feature declared `index: {of: OWNER, ...}` (a one-hot map's pad rows are zeros already)",
                    at,
                )
                .semantic(&s.name),
            );
            return;
        };
        let fits = t
            .dtype
            .int_range()
            .is_some_and(|(lo, hi)| (lo..=hi).contains(&value));
        if !fits || (value < 0 && ix.none != Some(value)) {
            self.err(
                SpecError::new(
                    format!(
                        "`map_pad: {value}` must be an id `{m}` can hold: an owner's (0 or more, within {}) or its declared `none`",
                        t.dtype
                    ),
                    at,
                )
                .semantic(&s.name)
                .feature(m),
            );
        }
    }

    fn unowned_rows(&mut self, s: &Semantic, at: Loc) {
        if !matches!(
            s.owner.as_ref().map(|o| &o.source),
            Some(OwnerSource::Map { .. })
        ) {
            self.err(
                SpecError::new(
                    "`unowned_rows: pad` applies to items owned through `map: <feature>`",
                    at,
                )
                .semantic(&s.name),
            );
        }
    }

    /// Optional and derived features, and the keys a sample may drop.
    fn inputs(&mut self) {
        let spec = self.spec;
        let mut seen = BTreeSet::new();
        for d in &spec.inputs.drop {
            if !seen.insert(d.name.as_str()) {
                self.err(SpecError::new(
                    format!("`{}` is listed twice in `drop`", d.name),
                    d.loc,
                ));
            }
            if spec.features.contains_key(&d.name) {
                self.err(
                    SpecError::new(
                        format!("`{}` is a feature, so it cannot be dropped", d.name),
                        d.loc,
                    )
                    .feature(&d.name),
                );
            }
        }
        let workflows = spec.workflow_features();
        for (name, f, t) in spec.tensors() {
            let Some(d) = &t.derived else { continue };
            if let Some(at) = f.optional {
                self.err(
                    SpecError::new(
                        "a derived feature is always made: it cannot be optional",
                        at,
                    )
                    .feature(name),
                );
            }
            self.derived(name, t, d, &workflows);
        }
    }

    /// A validity mask made from the lengths is a mask with one axis per semantic it
    /// masks: nothing else could tell real items from pads.
    fn valid_mask(&mut self, name: &str, t: &TensorFeature, d: &Derived) {
        let Role::Mask { of } = &t.role else {
            self.err(
                SpecError::new(
                    "a derived validity mask is a mask: declare the semantics it masks (`mask: tokens`)",
                    d.loc,
                )
                .feature(name),
            );
            return;
        };
        for (axis, a) in t.axes.iter().enumerate() {
            let masked = matches!(&a.kind, AxisKind::Semantic(s) if of.contains(s));
            if !masked {
                self.err(
                    SpecError::new(
                        "not a semantic it masks: a derived validity mask has only axes of the semantics it masks",
                        t.axes_loc,
                    )
                    .feature(name)
                    .axis(axis, &a.kind),
                );
            }
        }
    }

    fn derived(
        &mut self,
        name: &str,
        t: &TensorFeature,
        d: &Derived,
        workflows: &BTreeMap<String, BTreeSet<String>>,
    ) {
        if d.rule == DeriveRule::Valid {
            self.valid_mask(name, t, d);
            return;
        }
        let mut axes: Vec<&AxisKind> = Vec::new();
        for input in d.rule.inputs() {
            let Some(it) = self.derive_input(name, d, input, workflows) else {
                return;
            };
            axes.extend(it.axes.iter().map(|a| &a.kind));
        }
        let own: Vec<&AxisKind> = t.axes.iter().map(|a| &a.kind).collect();
        if own != axes {
            let show = |v: &[&AxisKind]| {
                v.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let what = match &d.rule {
                DeriveRule::Halo { of, .. } => format!("the halo of `{of}`"),
                rule => format!("the outer product of {}", rule.inputs().join(" and ")),
            };
            self.err(
                SpecError::new(
                    format!(
                        "{what} has axes [{}], but this feature has [{}]",
                        show(&axes),
                        show(&own)
                    ),
                    t.axes_loc,
                )
                .feature(name),
            );
            return;
        }
        if let DeriveRule::Halo { of, .. } = &d.rule {
            self.halo(name, t, d, of);
        }
    }

    /// One input of a derived feature: declared, a tensor, in every sample (not derived,
    /// but for a halo of a feature intake makes; not optional), in the feature's
    /// workflows. `None` when it fails (an error is recorded).
    fn derive_input(
        &mut self,
        name: &str,
        d: &Derived,
        input: &str,
        workflows: &BTreeMap<String, BTreeSet<String>>,
    ) -> Option<&'a TensorFeature> {
        let spec: &'a Spec = self.spec;
        let Some(f) = spec.features.get(input) else {
            let mut e = SpecError::new(
                format!("derives from `{input}`, which is not declared"),
                d.loc,
            )
            .feature(name);
            if let Some(h) = did_you_mean(input, spec.features.keys().map(String::as_str)) {
                e = e.help(h);
            }
            self.err(e);
            return None;
        };
        let FeatureKind::Tensor(it) = &f.kind else {
            self.err(
                SpecError::new(format!("derives from `{input}`, which is metadata"), d.loc)
                    .feature(name),
            );
            return None;
        };
        // A halo is laid out after intake has made every other derived feature.
        let made_first = matches!(d.rule, DeriveRule::Halo { .. })
            && it
                .derived
                .as_ref()
                .is_some_and(|x| !matches!(x.rule, DeriveRule::Halo { .. }));
        if (it.derived.is_some() && !made_first) || f.optional.is_some() || input == name {
            self.err(
                SpecError::new(
                    format!("derives from `{input}`, which a sample may lack (it is derived or optional)"),
                    d.loc,
                )
                .feature(name),
            );
            return None;
        }
        let missing = workflows
            .iter()
            .find(|(_, fs)| fs.contains(name) && !fs.contains(input));
        if let Some((w, _)) = missing {
            self.err(
                SpecError::new(
                    format!("derives from `{input}`, which is not in workflow `{w}`"),
                    d.loc,
                )
                .feature(name),
            );
        }
        Some(it)
    }

    /// A key halo holds whole rows of a feature over a windowed semantic, as it is.
    fn halo(&mut self, name: &str, t: &TensorFeature, d: &Derived, of: &str) {
        let spec = self.spec;
        let Some(FeatureKind::Tensor(source)) = spec.features.get(of).map(|f| &f.kind) else {
            return;
        };
        let why = match source.axes.first().map(|a| &a.kind) {
            _ if source.dtype != t.dtype => Some(format!(
                "the halo of `{of}` is its rows as they are: declare `dtype: {}`",
                source.dtype
            )),
            Some(AxisKind::Semantic(s)) => match spec.semantics.get(s) {
                Some(sem) if sem.sharded && sem.windows.is_some() => None,
                _ => Some(format!(
                    "a halo is read beside blocks of items in serial order: `{s}`, the first axis of `{of}`, does not declare `layout: windows`"
                )),
            },
            _ => Some(format!(
                "a halo is read along the first axis of `{of}`, which is no semantic's"
            )),
        };
        let rows_of_channels = source
            .axes
            .iter()
            .skip(1)
            .all(|a| matches!(a.kind, AxisKind::Channel(_)));
        let why = why.or_else(|| {
            (!rows_of_channels).then(|| {
                format!("a halo holds rows of `{of}`: its axes after the first are channels")
            })
        });
        // Rows of a one-hot feature are one-hot rows: its halo may travel as indices too.
        let why = why.or_else(|| {
            (source.sparse.is_some() || t.sparse.is_some()).then(|| {
                format!("`{of}` travels as its nonzero entries (sparse): a halo holds whole rows; take the halo of a dense or one-hot feature")
            })
        });
        let why = why.or_else(|| {
            let (own, its) = (t.one_hot.map(|o| o.0), source.one_hot.map(|o| o.0));
            (own.is_some() && own != its).then(|| {
                format!(
                    "a halo's rows are `{of}`'s: it is one-hot along the axis `{of}` is, or dense"
                )
            })
        });
        let why = why.or_else(|| {
            matches!(t.role, Role::Index(_)).then(|| {
                "a halo holds values as they are: it is data (its rows of an index keep their values), not an index".to_owned()
            })
        });
        if let Some(why) = why {
            self.err(SpecError::new(why, d.loc).feature(name));
        }
    }

    fn tensor(&mut self, name: &str, t: &TensorFeature) {
        let spec = self.spec;
        if t.axes.len() > limits::MAX_AXES {
            self.err(
                SpecError::new(
                    format!(
                        "{} axes, more than the limit of {}",
                        t.axes.len(),
                        limits::MAX_AXES
                    ),
                    t.axes_loc,
                )
                .feature(name),
            );
            return;
        }
        for (i, a) in t.axes.iter().enumerate() {
            match &a.kind {
                AxisKind::Semantic(s) if !spec.semantics.contains_key(s) => {
                    let e = self.undeclared_semantic(s, a.loc);
                    self.err(e.feature(name).axis(i, s));
                }
                AxisKind::Channel(0) => self.err(
                    SpecError::new("a channel axis must have size at least 1", a.loc)
                        .feature(name)
                        .axis(i, "channel"),
                ),
                _ => {}
            }
        }
        if t.pad.coerce(t.dtype).is_none() {
            self.err(
                SpecError::new(
                    format!("pad value {} does not fit dtype {}", t.pad, t.dtype),
                    t.pad_loc,
                )
                .feature(name),
            );
        }
        self.role(name, t);
        self.coshard(name, t);
        self.replicate_axes(name, t);
        self.one_hot_channel(name, t);
        self.sparse(name, t);
        self.range(name, t);
    }

    fn axis_label(t: &TensorFeature, i: usize) -> String {
        t.axes
            .get(i)
            .map(|a| match &a.kind {
                AxisKind::Semantic(s) => s.clone(),
                AxisKind::Channel(_) => "channel".to_owned(),
            })
            .unwrap_or_else(|| "out of range".to_owned())
    }

    fn role(&mut self, name: &str, t: &TensorFeature) {
        let spec = self.spec;
        match &t.role {
            Role::Data => {}
            Role::Mask { of } => self.mask(name, t, of),
            Role::Index(ix) => {
                let Some(target) = spec.semantics.get(&ix.of) else {
                    let e = self.undeclared_semantic(&ix.of, t.role_loc);
                    self.err(e.feature(name));
                    return;
                };
                self.index_none(name, t, ix);
                match ix.one_hot {
                    Some(axis) => self.one_hot(name, t, ix, axis),
                    None => self.index_values(name, t, ix, target.sharded),
                }
            }
        }
    }

    /// A mask names each masked semantic once, has an axis of it, and pads with 0.
    fn mask(&mut self, name: &str, t: &TensorFeature, of: &[String]) {
        let spec = self.spec;
        let mut seen = BTreeSet::new();
        for s in of.iter().filter(|s| !seen.insert(s.as_str())) {
            self.err(
                SpecError::new(format!("`{s}` is listed twice in `mask`"), t.role_loc)
                    .feature(name),
            );
        }
        for s in of {
            if !spec.semantics.contains_key(s) {
                let e = self.undeclared_semantic(s, t.role_loc);
                self.err(e.feature(name));
            } else if !t.axes.iter().any(|a| a.semantic() == Some(s)) {
                self.err(
                    SpecError::new(format!("masks `{s}` but has no `{s}` axis"), t.role_loc)
                        .feature(name),
                );
            }
        }
        if !t.pad.is_zero() {
            self.err(
                SpecError::new(
                    format!("a mask is 0 at pads (1 = valid), but pad is {}", t.pad),
                    t.pad_loc,
                )
                .feature(name),
            );
        }
    }

    /// A one-hot index: its axis is of the indexed semantic, and its ids can follow it.
    fn one_hot(&mut self, name: &str, t: &TensorFeature, ix: &IndexRole, axis: usize) {
        let Some(a) = t.axes.get(axis) else {
            self.err(
                SpecError::new(
                    format!(
                        "one-hot axis {axis} is out of range ({} axes)",
                        t.axes.len()
                    ),
                    t.role_loc,
                )
                .feature(name),
            );
            return;
        };
        if a.semantic() != Some(ix.of.as_str()) {
            self.err(
                SpecError::new(
                    format!("one-hot over `{}` needs a `{}` axis here", ix.of, ix.of),
                    t.role_loc,
                )
                .feature(name)
                .axis(axis, Self::axis_label(t, axis)),
            );
        }
        let follower = t.coshard.iter().any(|c| c.axis == axis);
        match ix.scope {
            IndexScope::Serial => self.err(
                SpecError::new(
                    "a one-hot axis is padded with its semantic, so its ids cannot stay serial",
                    t.role_loc,
                )
                .feature(name)
                .axis(axis, &ix.of)
                .help("use `scope: padded_global`, or `shard_local` with a co-sharded axis"),
            ),
            IndexScope::ShardLocal if !follower => self.err(
                SpecError::new(
                    "shard-local one-hot ids need this axis co-sharded with a leader axis",
                    t.role_loc,
                )
                .feature(name)
                .axis(axis, &ix.of)
                .help(format!(
                    "add `coshard: [{{axis: {axis}, follows: <leader>}}]`"
                )),
            ),
            _ => {}
        }
    }

    /// Index values: an integer dtype, and a scope that means something for the target.
    fn index_values(&mut self, name: &str, t: &TensorFeature, ix: &IndexRole, sharded: bool) {
        if !t.dtype.is_integer() {
            self.err(
                SpecError::new(
                    format!("index values need an integer dtype, not {}", t.dtype),
                    t.dtype_loc,
                )
                .feature(name),
            );
        }
        if ix.scope != IndexScope::Serial && !sharded {
            self.err(
                SpecError::new(
                    format!(
                        "`{}` is never sharded, so a {} index of it is its serial index",
                        ix.of,
                        ix.scope.name()
                    ),
                    t.role_loc,
                )
                .feature(name)
                .help("use `scope: serial`"),
            );
        }
    }

    /// An index's none value names no item: it is negative (a non-negative one would
    /// name one), fits the dtype, and a one-hot map has none (a row of zeros names no
    /// item).
    fn index_none(&mut self, name: &str, t: &TensorFeature, ix: &IndexRole) {
        let Some(none) = ix.none else {
            return;
        };
        let why = if ix.one_hot.is_some() {
            Some("a one-hot map has no none value: a row of zeros names no item".to_owned())
        } else if none >= 0 {
            Some(format!("`none: {none}` would name item {none} of `{}`: the none value is negative (AlphaFold3 uses -1)", ix.of))
        } else if t
            .dtype
            .int_range()
            .is_some_and(|(lo, hi)| !(lo..=hi).contains(&none))
        {
            Some(format!("`none: {none}` does not fit {}", t.dtype))
        } else {
            None
        };
        if let Some(why) = why {
            self.err(SpecError::new(why, t.role_loc).feature(name));
        }
    }

    fn coshard(&mut self, name: &str, t: &TensorFeature) {
        self.coshard_kept_whole(name, t);
        let mut followers = BTreeSet::new();
        for c in &t.coshard {
            self.coshard_pair(name, t, c, &mut followers);
        }
    }

    /// A co-sharded axis takes its leader's shard: keeping it whole contradicts it.
    fn coshard_kept_whole(&mut self, name: &str, t: &TensorFeature) {
        if let Some(c) = t.coshard.first() {
            let whole = t
                .replicate_axes
                .iter()
                .find(|(a, _)| *a == c.axis || *a == c.follows);
            if t.replicated || whole.is_some() {
                let what = if t.replicated {
                    "`replicated: true`"
                } else {
                    "`replicate_axes`"
                };
                self.err(
                    SpecError::new(
                        format!("{what} keeps axes whole, but `coshard` splits axis {} with axis {}: they contradict", c.axis, c.follows),
                        c.loc,
                    )
                    .feature(name)
                    .help("keep one of the two"),
                );
            }
        }
    }

    /// One `coshard` entry: axes in range and distinct, one leader per follower, no
    /// chains, sharded semantics related by ownership.
    fn coshard_pair(
        &mut self,
        name: &str,
        t: &TensorFeature,
        c: &CoShard,
        followers: &mut BTreeSet<usize>,
    ) {
        let n = t.axes.len();
        if c.axis >= n || c.follows >= n {
            let bad = if c.axis >= n { c.axis } else { c.follows };
            self.err(
                SpecError::new(
                    format!("co-shard axis {bad} is out of range ({n} axes)"),
                    c.loc,
                )
                .feature(name),
            );
            return;
        }
        let (fa, la) = (&t.axes[c.axis], &t.axes[c.follows]);
        if c.axis == c.follows {
            self.err(
                SpecError::new("an axis cannot follow itself", c.loc)
                    .feature(name)
                    .axis(c.axis, &fa.kind),
            );
            return;
        }
        if !followers.insert(c.axis) {
            self.err(
                SpecError::new("this axis follows two leaders", c.loc)
                    .feature(name)
                    .axis(c.axis, &fa.kind),
            );
        }
        if t.coshard.iter().any(|o| o.axis == c.follows) {
            self.err(
                SpecError::new("a leader axis cannot itself follow another axis", c.loc)
                    .feature(name)
                    .axis(c.follows, &la.kind),
            );
        }
        let (Some(fs), Some(ls)) = (fa.semantic(), la.semantic()) else {
            let (i, a) = if fa.semantic().is_none() {
                (c.axis, fa)
            } else {
                (c.follows, la)
            };
            self.err(
                SpecError::new(
                    "only semantic axes can be co-sharded, not channel axes",
                    c.loc,
                )
                .feature(name)
                .axis(i, &a.kind),
            );
            return;
        };
        self.coshard_semantics(name, c, fs, ls);
    }

    /// Both semantics of a co-shard are sharded, and one owns the other.
    fn coshard_semantics(&mut self, name: &str, c: &CoShard, fs: &str, ls: &str) {
        let spec = self.spec;
        let (Some(fsem), Some(lsem)) = (spec.semantics.get(fs), spec.semantics.get(ls)) else {
            return; // undeclared semantics are reported on the axis itself
        };
        for (i, sem) in [(c.follows, lsem), (c.axis, fsem)] {
            if !sem.sharded {
                self.err(
                    SpecError::new(
                        format!(
                            "co-sharded with something that is not sharded: `{}` is never sharded",
                            sem.name
                        ),
                        c.loc,
                    )
                    .feature(name)
                    .axis(i, &sem.name),
                );
            }
        }
        if fsem.sharded && lsem.sharded && !self.ownership.related(fs, ls) {
            self.err(
                SpecError::new(
                    format!(
                        "`{fs}` cannot follow `{ls}`: a block diagonal needs one to own the other"
                    ),
                    c.loc,
                )
                .feature(name)
                .axis(c.axis, fs)
                .help(format!("declare `owner: {ls}` on `{fs}` (or the reverse)")),
            );
        }
    }

    fn replicate_axes(&mut self, name: &str, t: &TensorFeature) {
        let mut seen = BTreeSet::new();
        for (axis, loc) in &t.replicate_axes {
            let Some(a) = t.axes.get(*axis) else {
                self.err(
                    SpecError::new(
                        format!(
                            "replicate axis {axis} is out of range ({} axes)",
                            t.axes.len()
                        ),
                        *loc,
                    )
                    .feature(name),
                );
                continue;
            };
            if !seen.insert(*axis) {
                self.err(
                    SpecError::new("listed twice in `replicate_axes`", *loc)
                        .feature(name)
                        .axis(*axis, &a.kind),
                );
            }
            let sharded = a
                .semantic()
                .and_then(|s| self.spec.semantics.get(s))
                .is_some_and(|s| s.sharded);
            if !sharded {
                self.err(
                    SpecError::new(
                        "this axis is never sharded; `replicate_axes` does not apply",
                        *loc,
                    )
                    .feature(name)
                    .axis(*axis, &a.kind),
                );
            }
        }
    }

    /// `one_hot: AXIS`: a channel axis with a size (its classes), on plain data whose
    /// pads are zero rows (no class).
    fn one_hot_channel(&mut self, name: &str, t: &TensorFeature) {
        let Some((axis, loc)) = t.one_hot else { return };
        let fault = match t.axes.get(axis).map(|a| &a.kind) {
            None => Some(format!("one-hot axis {axis} is out of range ({} axes)", t.axes.len())),
            Some(AxisKind::Semantic(s)) => Some(format!(
                "one-hot axis {axis} is an axis of `{s}`; it must be a channel axis (its size the class count)"
            )),
            Some(AxisKind::Channel(0)) => Some(format!("one-hot axis {axis} has no classes")),
            Some(AxisKind::Channel(_)) if t.role != Role::Data => Some(
                "a one-hot feature is plain data: not a mask, and an index's one-hot map is `index: {one_hot: AXIS}`".to_owned(),
            ),
            Some(AxisKind::Channel(_)) if !t.pad.is_zero() => Some(format!(
                "a one-hot feature pads with zero rows (no class); pad {} would be a class",
                t.pad
            )),
            Some(AxisKind::Channel(_)) => None,
        };
        if let Some(message) = fault {
            let e = SpecError::new(message, loc).feature(name);
            self.err(match t.axes.get(axis) {
                Some(a) => e.axis(axis, &a.kind),
                None => e,
            });
        }
    }

    /// `sparse: true`: plain data whose pads are zero (a pad is then no entry), one
    /// compact form at a time.
    fn sparse(&mut self, name: &str, t: &TensorFeature) {
        let Some(loc) = t.sparse else { return };
        let fault = if t.role != Role::Data {
            Some("a sparse feature is plain data: not a mask or an index".to_owned())
        } else if t.one_hot.is_some() {
            Some("a feature is one-hot or sparse, not both: a one-hot feature already travels as its indices".to_owned())
        } else if t.range.is_some() {
            Some("a feature is sparse or has a `range`, not both".to_owned())
        } else if !t.coshard.is_empty() {
            Some("a co-sharded feature is not sparse: its blocks are diagonal blocks".to_owned())
        } else if !t.pad.is_zero() {
            Some(format!(
                "a sparse feature pads with zeros (no entry); pad {} would be an entry",
                t.pad
            ))
        } else {
            None
        };
        if let Some(message) = fault {
            self.err(SpecError::new(message, loc).feature(name));
        }
    }

    /// `range: [lo, hi]`: plain integer data whose range and pad fit its dtype.
    fn range(&mut self, name: &str, t: &TensorFeature) {
        let Some(([lo, hi], loc)) = t.range else {
            return;
        };
        let fits = |v: i64| PadValue::Int(v).coerce(t.dtype).is_some();
        let pad = match t.pad {
            PadValue::Int(p) => Some(p),
            PadValue::Bool(b) => Some(i64::from(b)),
            PadValue::Float(_) => None,
        };
        let fault = if !t.dtype.is_integer() {
            Some(format!(
                "`range` narrows integer features; this one is {}",
                t.dtype
            ))
        } else if t.role != Role::Data {
            Some(
                "`range` is for plain data: a mask travels as bits, an index's values are remapped"
                    .to_owned(),
            )
        } else if t.one_hot.is_some() {
            Some("a one-hot feature travels as its indices already; it takes no `range`".to_owned())
        } else if !fits(lo) || !fits(hi) {
            Some(format!(
                "`range: [{lo}, {hi}]` does not fit dtype {}",
                t.dtype
            ))
        } else if !pad.is_some_and(|p| (lo..=hi).contains(&p)) {
            Some(format!(
                "pad {} lies outside `range: [{lo}, {hi}]`: pads travel narrowed too",
                t.pad
            ))
        } else {
            None
        };
        if let Some(message) = fault {
            self.err(SpecError::new(message, loc).feature(name));
        }
    }

    fn workflows_of(&mut self, f: &Feature) {
        let Some(only) = &f.only else { return };
        let mut seen = BTreeSet::new();
        for w in only {
            if !seen.insert(w.name.as_str()) {
                self.err(
                    SpecError::new(
                        format!("workflow `{}` is listed twice in `only`", w.name),
                        w.loc,
                    )
                    .feature(&f.name),
                );
            }
            if !self.spec.workflows.contains_key(&w.name) {
                let mut e = SpecError::new(format!("workflow `{}` is not declared", w.name), w.loc)
                    .feature(&f.name);
                e = match did_you_mean(&w.name, self.spec.workflows.keys().map(String::as_str)) {
                    Some(h) => e.help(h),
                    None => e.help("list it under the top-level `workflows:`"),
                };
                self.err(e);
            }
        }
    }
}

/// A name that cannot be a variant of the generated Rust enum `kind`: a keyword once
/// converted (`self` -> `Self`), or the same variant as an earlier name (`e_1`, `e1`).
fn variant_problem<'n>(
    seen: &mut BTreeMap<String, &'n str>,
    name: &'n str,
    loc: Loc,
    kind: &str,
) -> Option<SpecError> {
    let camel = upper_camel(name);
    if camel_is_keyword(name) {
        return Some(SpecError::new(
            format!("`{name}` becomes `{kind}::{camel}` in the generated Rust, which is a keyword"),
            loc,
        ));
    }
    let other = seen.insert(camel.clone(), name)?;
    Some(SpecError::new(
        format!(
            "`{name}` collides with `{other}`: both become `{kind}::{camel}` in the generated Rust"
        ),
        loc,
    ))
}

/// Whether one semantic owns the other, directly or through a chain.
/// Domain specs: every semantic is split over one domain axis, by every feature that
/// splits it, or the shard boundaries would not line up. Needs the inferred splits, so
/// it runs after inference (in `plan`).
pub fn split_alignment(spec: &Spec, inferred: &BTreeMap<&str, Inferred>) -> Vec<SpecError> {
    let mut errors = Vec::new();
    if !spec.mesh.is_domain() {
        return errors;
    }
    // The first feature (and axis) that splits each semantic, and its mesh axis.
    let mut first: BTreeMap<&str, (&str, usize, usize)> = BTreeMap::new();
    for (name, _, t) in spec.tensors() {
        let Some(i) = inferred.get(name) else {
            continue;
        };
        for (d, (axis, split)) in t.axes.iter().zip(&i.splits).enumerate() {
            let (Some(s), Some(m)) = (axis.semantic(), split.mesh_axis()) else {
                continue;
            };
            match first.get(s) {
                Some(&(other, j, m0)) if m0 != m => errors.push(
                    SpecError::new(
                        format!(
                            "`{s}` is split over mesh axis `{}` here but over `{}` in feature `{other}` (axis {j}): their shard boundaries would not line up",
                            spec.mesh.axes()[m].name, spec.mesh.axes()[m0].name
                        ),
                        axis.loc,
                    )
                    .feature(name)
                    .axis(d, &axis.kind)
                    .help("order the axes alike in both features, or keep one whole with `replicate_axes`"),
                ),
                Some(_) => {}
                None => {
                    first.insert(s, (name, d, m));
                }
            }
        }
    }
    errors
}
