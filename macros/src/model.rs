//! From the struct and its attributes to the Spec IR, and from there to the Plan with
//! the spec crate's own checks and inference (the derive never decides a placement).

use std::collections::BTreeMap;
use std::path::PathBuf;

use featshard_spec::diag::SpecError;
use featshard_spec::ir::{DType, FeatureKind, Source, Spec};
use featshard_spec::loc::Loc;
use featshard_spec::plan::{self, Plan};
use proc_macro2::Span;
use syn::{Field, GenericArgument, Ident, PathArguments, Type};

use crate::attr::{self, AxisAttr, FieldAttrs, StructAttrs};
use crate::field::TensorField;
use crate::raw::{self, Tokens};

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

/// Inline mode: the attributes are the spec, lowered and checked by the spec crate as a
/// YAML file would be.
fn from_attributes(
    input: &syn::DeriveInput,
    sattrs: &StructAttrs,
    fields: Vec<TensorField>,
    fattrs: &[FieldAttrs],
    errors: &mut Vec<syn::Error>,
) -> Option<Model> {
    let mut tokens = Tokens::default();
    let raw = raw::spec(&input.ident, sattrs, &fields, fattrs, &mut tokens);
    let source = Source {
        name: input.ident.to_string(),
        sha256: featshard_spec::sha256_hex(&quote::quote!(#input).to_string()),
    };
    let at = Spans {
        tokens: &tokens,
        fields: &fields,
        whole: input.ident.span(),
    };
    let planned = featshard_spec::lower(raw, source).and_then(|spec| plan::plan(&spec));
    match planned {
        Ok(plan) => Some(Model {
            plan,
            workflow: sattrs.workflow.as_ref().map(|w| w.value.clone()),
            fields,
            spec_file: None,
        }),
        Err(spec_errors) => {
            errors.extend(spec_errors.iter().map(|e| at.error(e)));
            None
        }
    }
}

/// Where a spec error lands: the attribute value it is about, else its feature's field,
/// else the struct.
struct Spans<'a> {
    tokens: &'a Tokens,
    fields: &'a [TensorField],
    whole: Span,
}

impl Spans<'_> {
    fn error(&self, e: &SpecError) -> syn::Error {
        let span = self
            .tokens
            .span(e.loc)
            .or_else(|| {
                let feature = e.feature.as_ref()?;
                self.fields
                    .iter()
                    .find(|f| &f.feature == feature)
                    .map(|f| f.span)
            })
            .unwrap_or(self.whole);
        syn::Error::new(span, spec_message(e))
    }
}

fn spec_message(e: &SpecError) -> String {
    match &e.help {
        Some(h) => format!("{e}\nhelp: {h}"),
        None => e.to_string(),
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
                // The path is named as written, relative to the crate: the absolute
                // one depends on where the crate is built.
                format!(
                    "spec file `{}` (relative to the crate's Cargo.toml): {e}",
                    path.value
                ),
            ));
            return None;
        }
    };
    let mut spec = match featshard_spec::parse_str(&path.value, &text) {
        Ok(s) => s,
        Err(d) => {
            errors.push(syn::Error::new(
                path.span,
                d.render_plain().trim_end().to_owned(),
            ));
            return None;
        }
    };
    if spec.mesh.is_domain() {
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
            .map(|x| match &x.value {
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
