//! From the struct and its attributes to the Spec IR, and from there to the Plan with
//! the spec crate's own checks and inference (the derive never decides a placement).

use std::collections::BTreeMap;
use std::path::PathBuf;

use featshard_spec::diag::SpecError;
use featshard_spec::ir::*;
use featshard_spec::loc::Loc;
use featshard_spec::plan::{self, Plan};
use proc_macro2::Span;
use syn::{Field, GenericArgument, Ident, PathArguments, Type};

use crate::attr::{self, AxisAttr, FieldAttrs, PadLit, StructAttrs};

/// A field the derive moves to and from the runtime.
pub struct TensorField {
    pub ident: Ident,
    /// The feature name (the field's, unless renamed).
    pub feature: String,
    pub optional: bool,
    /// Made by the pipeline when absent (always present in a rank's blocks).
    pub derived: bool,
    pub span: Span,
}

/// What the derive expands from.
pub struct Model {
    pub plan: Plan,
    pub fields: Vec<TensorField>,
    /// The workflow the runtime methods use.
    pub workflow: Option<String>,
    /// The spec file to track for rebuilds (spec-file mode).
    pub spec_file: Option<PathBuf>,
}

pub fn model(input: &syn::DeriveInput, errors: &mut Vec<syn::Error>) -> Option<Model> {
    let syn::Data::Struct(data) = &input.data else {
        errors.push(syn::Error::new_spanned(
            &input.ident,
            "#[derive(Features)] works on structs with named fields",
        ));
        return None;
    };
    let syn::Fields::Named(named) = &data.fields else {
        errors.push(syn::Error::new_spanned(
            &input.ident,
            "#[derive(Features)] works on structs with named fields",
        ));
        return None;
    };
    let sattrs = attr::struct_attrs(&input.attrs, errors);
    let mut fields = Vec::new();
    let mut fattrs = Vec::new();
    for f in &named.named {
        let a = attr::field_attrs(&f.attrs, errors);
        let Some(ident) = f.ident.clone() else {
            continue;
        };
        let optional = match tensor_type(&f.ty) {
            Some(optional) => optional,
            None => {
                errors.push(syn::Error::new_spanned(
                    &f.ty,
                    "unsupported field type: featshard fields are `tch::Tensor` or `Option<tch::Tensor>`",
                ));
                continue;
            }
        };
        let feature = a
            .name
            .as_ref()
            .map_or_else(|| ident.to_string(), |n| n.value.clone());
        fields.push(TensorField {
            ident,
            feature,
            optional,
            derived: a.derive.is_some(),
            span: field_span(f),
        });
        fattrs.push(a);
    }
    // Two fields naming one feature.
    let mut seen: BTreeMap<&str, &TensorField> = BTreeMap::new();
    for f in &fields {
        if let Some(first) = seen.insert(&f.feature, f) {
            errors.push(syn::Error::new(
                f.span,
                format!(
                    "duplicate feature `{}`: field `{}` already is it",
                    f.feature, first.ident
                ),
            ));
        }
    }
    if !errors.is_empty() {
        return None;
    }
    match &sattrs.spec {
        Some(path) => from_spec_file(input, &sattrs, path, fields, &fattrs, errors),
        None => from_attributes(input, &sattrs, fields, &fattrs, errors),
    }
}

fn field_span(f: &Field) -> Span {
    f.ident.as_ref().map_or_else(Span::call_site, Ident::span)
}

/// `Some(false)` for `Tensor`, `Some(true)` for `Option<Tensor>`, `None` otherwise.
fn tensor_type(ty: &Type) -> Option<bool> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident == "Tensor" && last.arguments.is_none() {
        return Some(false);
    }
    if last.ident == "Option" {
        if let PathArguments::AngleBracketed(args) = &last.arguments {
            if let Some(GenericArgument::Type(inner)) = args.args.first() {
                return (tensor_type(inner) == Some(false)).then_some(true);
            }
        }
    }
    None
}

fn snake(ident: &Ident) -> String {
    let mut out = String::new();
    for (i, c) in ident.to_string().chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Inline mode: the attributes are the spec.
fn from_attributes(
    input: &syn::DeriveInput,
    sattrs: &StructAttrs,
    fields: Vec<TensorField>,
    fattrs: &[FieldAttrs],
    errors: &mut Vec<syn::Error>,
) -> Option<Model> {
    let (cp, dp) = mesh_of(sattrs, errors)?;
    let mut semantics = BTreeMap::new();
    let mut semantic_spans: BTreeMap<String, Span> = BTreeMap::new();
    for s in &sattrs.semantics {
        let owner = owner_of(s, errors);
        if semantic_spans
            .insert(s.name.value.clone(), s.name.span)
            .is_some()
        {
            errors.push(syn::Error::new(
                s.name.span,
                format!("semantic `{}` is declared twice", s.name.value),
            ));
        }
        semantics.insert(s.name.value.clone(), semantic_of(s, owner, errors));
    }
    let mut features = BTreeMap::new();
    for (f, a) in fields.iter().zip(fattrs) {
        match feature_of(f, a) {
            Ok(feat) => {
                features.insert(f.feature.clone(), feat);
            }
            Err(e) => errors.push(e),
        }
    }
    let other_keys = other_keys_of(sattrs, errors);
    if !errors.is_empty() {
        return None;
    }
    let spec = Spec {
        source: Source {
            name: input.ident.to_string(),
            sha256: featshard_spec::lower::sha256_hex(&quote::quote!(#input).to_string()),
        },
        module: named(&sattrs.module.as_ref().map_or_else(
            || format!("{}_placements", snake(&input.ident)),
            |m| m.value.clone(),
        )),
        mesh: Mesh {
            cp: cp.to_vec(),
            dp,
            domain: None,
            loc: Loc::UNKNOWN,
        },
        semantics,
        workflows: sattrs
            .workflows
            .iter()
            .map(|w| (w.value.clone(), Loc::UNKNOWN))
            .collect(),
        features,
        inputs: Inputs {
            other_keys,
            other_keys_loc: Loc::UNKNOWN,
            drop: sattrs.drop.iter().map(|d| named(&d.value)).collect(),
        },
    };
    match plan::plan(&spec) {
        Ok(plan) => Some(Model {
            plan,
            fields,
            workflow: sattrs.workflow.as_ref().map(|w| w.value.clone()),
            spec_file: None,
        }),
        Err(spec_errors) => {
            let at = Spans {
                fields: &fields,
                semantics: &semantic_spans,
                whole: input.ident.span(),
            };
            errors.extend(spec_errors.iter().map(|e| at.error(e)));
            None
        }
    }
}

/// The CP mesh axes and the DP axis, from `mesh(...)` or the defaults.
fn mesh_of(
    sattrs: &StructAttrs,
    errors: &mut Vec<syn::Error>,
) -> Option<([Named; 2], Option<Named>)> {
    match &sattrs.mesh {
        Some(attr::MeshAttr { cp, dp, span }) => {
            if cp.len() != 2 {
                errors.push(syn::Error::new(
                    *span,
                    format!(
                        "the CP mesh has exactly two axes `mesh(cp0, cp1)`, {} given",
                        cp.len()
                    ),
                ));
                return None;
            }
            Some((
                [named(&cp[0].value), named(&cp[1].value)],
                dp.as_ref().map(|d| named(&d.value)),
            ))
        }
        None => Some(([named("cp0"), named("cp1")], None)),
    }
}

/// One `semantic(...)` attribute as the IR's semantic, its owner read already.
fn semantic_of(
    s: &attr::SemanticAttr,
    owner: Option<Owner>,
    errors: &mut Vec<syn::Error>,
) -> Semantic {
    let incoming = incoming_of(s, owner.as_ref(), errors);
    Semantic {
        name: s.name.value.clone(),
        sharded: s.shard,
        window: s.window,
        // The derive describes context-parallel structs; domain specs are YAML.
        batch: false,
        incoming: incoming.map(|source| Incoming {
            source,
            loc: Loc::UNKNOWN,
        }),
        unowned_rows: unowned_rows_of(s, errors),
        owner,
        shards: Default::default(),
        loc: Loc::UNKNOWN,
    }
}

/// `owner = SEM` with `counts = FEATURE`, `map = FEATURE` or both.
fn owner_of(s: &attr::SemanticAttr, errors: &mut Vec<syn::Error>) -> Option<Owner> {
    match (&s.owner, &s.counts, &s.map) {
        (Some(o), Some(c), None) => Some(Owner {
            owner: named(&o.value),
            source: OwnerSource::Counts {
                feature: c.value.clone(),
            },
            source_loc: Loc::UNKNOWN,
        }),
        (Some(o), None, Some(m)) => Some(Owner {
            owner: named(&o.value),
            source: OwnerSource::Map {
                feature: m.value.clone(),
            },
            source_loc: Loc::UNKNOWN,
        }),
        (Some(o), Some(c), Some(m)) => Some(Owner {
            owner: named(&o.value),
            source: OwnerSource::CountsOrMap {
                counts: c.value.clone(),
                map: m.value.clone(),
            },
            source_loc: Loc::UNKNOWN,
        }),
        (None, None, None) => None,
        _ => {
            errors.push(syn::Error::new(
                s.name.span,
                format!(
                    "semantic `{}`: `owner = SEM` goes with `counts = FEATURE`, `map = FEATURE` or both",
                    s.name.value
                ),
            ));
            None
        }
    }
}

/// `incoming_pads(mask = FEATURE)` or `incoming_pads(counts)`.
fn incoming_of(
    s: &attr::SemanticAttr,
    owner: Option<&Owner>,
    errors: &mut Vec<syn::Error>,
) -> Option<IncomingSource> {
    match s.incoming.as_ref().map(|i| &i.value) {
        Some(attr::IncomingAttr::Mask(m)) => Some(IncomingSource::Mask { feature: m.clone() }),
        Some(attr::IncomingAttr::Counts) => match owner.and_then(|o| o.source.counts()) {
            Some(c) => Some(IncomingSource::Counts {
                feature: c.to_owned(),
            }),
            None => {
                errors.push(syn::Error::new(
                    s.incoming.as_ref().map_or(s.name.span, |i| i.span),
                    format!("semantic `{}`: `incoming_pads(counts)` needs `owner = SEM, counts = FEATURE`", s.name.value),
                ));
                None
            }
        },
        None => None,
    }
}

/// `unowned_rows = pad | refuse`: where unowned rows are pads.
fn unowned_rows_of(s: &attr::SemanticAttr, errors: &mut Vec<syn::Error>) -> Option<Loc> {
    match s.unowned_rows.as_ref().map(|u| (u.value.as_str(), u.span)) {
        Some(("pad", _)) => Some(Loc::UNKNOWN),
        Some(("refuse", _)) | None => None,
        Some((other, span)) => {
            errors.push(syn::Error::new(
                span,
                format!("semantic `{}`: unknown `unowned_rows` value `{other}`; expected `pad` or `refuse`", s.name.value),
            ));
            None
        }
    }
}

/// `other_keys = refuse | drop | pass`.
fn other_keys_of(sattrs: &StructAttrs, errors: &mut Vec<syn::Error>) -> KeyPolicy {
    match &sattrs.other_keys {
        Some(p) => match KeyPolicy::parse(&p.value) {
            Some(k) => k,
            None => {
                errors.push(syn::Error::new(
                    p.span,
                    format!(
                        "unknown `other_keys` policy `{}`; expected `refuse`, `drop` or `pass`",
                        p.value
                    ),
                ));
                KeyPolicy::Refuse
            }
        },
        None => KeyPolicy::Refuse,
    }
}

/// Where a spec error lands: its feature's field, its semantic's attribute, else the
/// struct.
struct Spans<'a> {
    fields: &'a [TensorField],
    semantics: &'a BTreeMap<String, Span>,
    whole: Span,
}

impl Spans<'_> {
    fn error(&self, e: &SpecError) -> syn::Error {
        let span = e
            .feature
            .as_ref()
            .and_then(|n| self.fields.iter().find(|f| &f.feature == n).map(|f| f.span))
            .or_else(|| {
                e.semantic
                    .as_ref()
                    .and_then(|s| self.semantics.get(s).copied())
            })
            .unwrap_or(self.whole);
        syn::Error::new(span, spec_message(e))
    }
}

fn named(s: &str) -> Named {
    Named::new(s, Loc::UNKNOWN)
}

fn spec_message(e: &SpecError) -> String {
    match &e.help {
        Some(h) => format!("{e}\nhelp: {h}"),
        None => e.to_string(),
    }
}

fn feature_of(f: &TensorField, a: &FieldAttrs) -> syn::Result<Feature> {
    let Some(axes) = &a.axes else {
        return Err(syn::Error::new(
            f.span,
            format!(
                "feature `{}`: needs `#[featshard(axes(...), dtype = ...)]`",
                f.feature
            ),
        ));
    };
    let Some(dtype) = &a.dtype else {
        return Err(syn::Error::new(
            f.span,
            format!("feature `{}`: needs `dtype = ...`", f.feature),
        ));
    };
    let dtype_value = DType::parse(&dtype.value).ok_or_else(|| {
        syn::Error::new(
            dtype.span,
            format!("feature `{}`: unknown dtype `{}`", f.feature, dtype.value),
        )
    })?;
    let role = role_of(f, a)?;
    let placement = placement_of(f, a)?;
    let derived = derived_of(f, a)?;
    // An `Option` field is optional, unless it is one the pipeline derives.
    let optional = (f.optional && derived.is_none()).then_some(Loc::UNKNOWN);
    Ok(Feature {
        name: f.feature.clone(),
        kind: FeatureKind::Tensor(Box::new(TensorFeature {
            axes: axes.value.iter().map(axis_of).collect(),
            axes_loc: Loc::UNKNOWN,
            dtype: dtype_value,
            dtype_loc: Loc::UNKNOWN,
            pad: a
                .pad
                .as_ref()
                .map_or_else(PadValue::default, |p| pad_of(p.value)),
            pad_loc: Loc::UNKNOWN,
            role,
            role_loc: Loc::UNKNOWN,
            coshard: a
                .coshard
                .iter()
                .map(|c| CoShard {
                    axis: c.value.0,
                    follows: c.value.1,
                    loc: Loc::UNKNOWN,
                })
                .collect(),
            replicate_axes: a
                .replicate_axes
                .iter()
                .map(|r| (r.value, Loc::UNKNOWN))
                .collect(),
            replicated: a.replicated,
            placement,
            derived,
            parameter: None,
            output: None,
        })),
        optional,
        only: a
            .only
            .as_ref()
            .map(|o| o.iter().map(|w| named(&w.value)).collect()),
        doc: None,
        loc: Loc::UNKNOWN,
    })
}

/// `mask(...)`, `index(...)` or neither.
fn role_of(f: &TensorField, a: &FieldAttrs) -> syn::Result<Role> {
    match (&a.mask, &a.index) {
        (Some(_), Some(i)) => Err(syn::Error::new(
            i.span,
            format!("feature `{}`: a mask or an index, not both", f.feature),
        )),
        (Some(m), None) => Ok(Role::Mask {
            of: m.value.clone(),
        }),
        (None, Some(i)) => Ok(Role::Index(IndexRole {
            of: i.value.of.clone(),
            scope: match i.value.scope.value.as_str() {
                "serial" => IndexScope::Serial,
                "shard_local" => IndexScope::ShardLocal,
                "padded_global" => IndexScope::PaddedGlobal,
                other => {
                    return Err(syn::Error::new(
                        i.value.scope.span,
                        format!("feature `{}`: unknown index scope `{other}`", f.feature),
                    ))
                }
            },
            one_hot: i.value.one_hot,
        })),
        (None, None) => Ok(Role::Data),
    }
}

/// `placement("Shard(0)", ...)`, if given.
fn placement_of(f: &TensorField, a: &FieldAttrs) -> syn::Result<Option<(Vec<Placement>, Loc)>> {
    match &a.placement {
        Some(p) => {
            let mut out = Vec::new();
            for s in &p.value {
                out.push(Placement::parse(s).ok_or_else(|| {
                    syn::Error::new(
                        p.span,
                        format!("feature `{}`: `{s}` is not a placement", f.feature),
                    )
                })?);
            }
            Ok(Some((out, Loc::UNKNOWN)))
        }
        None => Ok(None),
    }
}

/// `derive(outer(A, B))`, if given.
fn derived_of(f: &TensorField, a: &FieldAttrs) -> syn::Result<Option<Derived>> {
    match &a.derive {
        Some(d) => {
            let of = match d.value.as_slice() {
                [x] => [x.clone(), x.clone()],
                [x, y] => [x.clone(), y.clone()],
                _ => {
                    return Err(syn::Error::new(
                        d.span,
                        format!("feature `{}`: `outer` takes one or two features", f.feature),
                    ))
                }
            };
            Ok(Some(Derived {
                rule: DeriveRule::Outer { of },
                loc: Loc::UNKNOWN,
            }))
        }
        None => Ok(None),
    }
}

fn axis_of(a: &AxisAttr) -> Axis {
    Axis {
        kind: match a {
            AxisAttr::Semantic(s) => AxisKind::Semantic(s.clone()),
            AxisAttr::Channel(n) => AxisKind::Channel(*n),
        },
        loc: Loc::UNKNOWN,
    }
}

fn pad_of(p: PadLit) -> PadValue {
    match p {
        PadLit::Bool(b) => PadValue::Bool(b),
        PadLit::Int(i) => PadValue::Int(i),
        PadLit::Float(x) => PadValue::Float(x),
    }
}

/// Spec-file mode: the struct is checked against a YAML spec.
fn from_spec_file(
    input: &syn::DeriveInput,
    sattrs: &StructAttrs,
    path: &attr::At<String>,
    mut fields: Vec<TensorField>,
    fattrs: &[FieldAttrs],
    errors: &mut Vec<syn::Error>,
) -> Option<Model> {
    let (file, text, spec) = load_spec(sattrs, path, errors)?;
    let plan = match plan::plan(&spec) {
        Ok(p) => p,
        Err(e) => {
            let d = featshard_spec::Diagnostics::new(&path.value, &text, e);
            errors.push(syn::Error::new(
                path.span,
                d.render_plain().trim_end().to_owned(),
            ));
            return None;
        }
    };
    let at = |l: Loc| format!("{}:{}:{}", path.value, l.line, l.column);
    for f in &mut fields {
        let Some(feat) = spec.features.get(&f.feature) else {
            continue;
        };
        let derived = matches!(&feat.kind, FeatureKind::Tensor(t) if t.derived.is_some());
        f.derived = derived;
        if f.optional && !derived && feat.optional.is_none() {
            errors.push(syn::Error::new(
                f.span,
                format!(
                    "feature `{}` (at {}) is in every sample: its field is `Tensor`, not `Option<Tensor>`",
                    f.feature,
                    at(feat.loc)
                ),
            ));
        }
    }
    for (f, a) in fields.iter().zip(fattrs) {
        check_field(f, a, &spec, sattrs, path, errors);
    }
    for (name, feat) in &spec.features {
        if matches!(feat.kind, FeatureKind::Tensor(_)) && !fields.iter().any(|f| &f.feature == name)
        {
            errors.push(syn::Error::new(
                input.ident.span(),
                format!(
                    "feature `{name}` (declared at {}) has no field; add `{name}: Tensor`",
                    at(feat.loc)
                ),
            ));
        }
    }
    if !errors.is_empty() {
        return None;
    }
    Some(Model {
        plan,
        fields,
        workflow: sattrs.workflow.as_ref().map(|w| w.value.clone()),
        spec_file: Some(file),
    })
}

/// The spec file read, parsed and cut to the struct's workflow; it must be a CP spec.
fn load_spec(
    sattrs: &StructAttrs,
    path: &attr::At<String>,
    errors: &mut Vec<syn::Error>,
) -> Option<(PathBuf, String, Spec)> {
    let root = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_default();
    let file = root.join(&path.value);
    let text = match featshard_spec::read_spec(&file) {
        Ok(t) => t,
        Err(e) => {
            errors.push(syn::Error::new(
                path.span,
                format!("spec file `{}` ({}): {e}", path.value, file.display()),
            ));
            return None;
        }
    };
    let mut spec = match featshard_spec::lower::parse_str(&path.value, &text) {
        Ok(s) => s,
        Err(d) => {
            errors.push(syn::Error::new(
                path.span,
                d.render_plain().trim_end().to_owned(),
            ));
            return None;
        }
    };
    if spec.mesh.domain.is_some() {
        errors.push(syn::Error::new(
            path.span,
            format!(
                "{} is a domain-parallel (ShardTensor) spec; `#[derive(Features)]` describes context-parallel (DTensor) structs: use the generated Python module",
                path.value
            ),
        ));
        return None;
    }
    if let Some(w) = &sattrs.workflow {
        match spec.for_workflow(&w.value) {
            Some(s) => spec = s,
            None => {
                errors.push(syn::Error::new(
                    w.span,
                    format!("workflow `{}` is not declared in `{}`", w.value, path.value),
                ));
                return None;
            }
        }
    }
    Some((file, text, spec))
}

/// A field's attributes checked against its feature in the spec file.
fn check_field(
    f: &TensorField,
    a: &FieldAttrs,
    spec: &Spec,
    sattrs: &StructAttrs,
    path: &attr::At<String>,
    errors: &mut Vec<syn::Error>,
) {
    let f_at = |l: Loc| format!("{}:{}:{}", path.value, l.line, l.column);
    let Some(feat) = spec.features.get(&f.feature) else {
        let scope = sattrs
            .workflow
            .as_ref()
            .map(|w| format!(" (workflow `{}`)", w.value))
            .unwrap_or_default();
        errors.push(syn::Error::new(
            f.span,
            format!("feature `{}` is not in `{}`{scope}", f.feature, path.value),
        ));
        return;
    };
    let FeatureKind::Tensor(t) = &feat.kind else {
        errors.push(syn::Error::new(
            f.span,
            format!(
                "feature `{}` is metadata (at {}), not a tensor",
                f.feature,
                f_at(feat.loc)
            ),
        ));
        return;
    };
    if let Some(d) = &a.dtype {
        if DType::parse(&d.value) != Some(t.dtype) {
            errors.push(syn::Error::new(
                d.span,
                format!(
                    "feature `{}`: dtype `{}` disagrees with `{}` at {}",
                    f.feature,
                    d.value,
                    t.dtype,
                    f_at(t.dtype_loc)
                ),
            ));
        }
    }
    if let Some(axes) = &a.axes {
        let spec_axes: Vec<String> = t.axes.iter().map(|x| x.kind.to_string()).collect();
        let ours: Vec<String> = axes
            .value
            .iter()
            .map(|x| match x {
                AxisAttr::Semantic(s) => s.clone(),
                AxisAttr::Channel(n) => n.to_string(),
            })
            .collect();
        if ours != spec_axes {
            errors.push(syn::Error::new(
                axes.span,
                format!(
                    "feature `{}`: axes [{}] (rank {}) disagree with [{}] (rank {}) at {}",
                    f.feature,
                    ours.join(", "),
                    ours.len(),
                    spec_axes.join(", "),
                    spec_axes.len(),
                    f_at(t.axes_loc)
                ),
            ));
        }
    }
}
