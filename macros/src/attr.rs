//! The attribute grammar, in one place: `#[featshard(...)]` on the struct and its fields.
//!
//! ```text
//! struct: module = "name" | spec = "path.yaml" | workflow = "name"
//!         | mesh(cp0, cp1, dp = dp) | mesh(cp, dp = dp) | workflows(training, inference)
//!         | semantic(NAME [, shard] [, owner = SEM [, counts = FEATURE] [, map = FEATURE]]
//!                    [, window = N] [, incoming_pads(mask = FEATURE | counts [, map_pad = V])]
//!                    [, unowned_rows = pad | refuse] [, on_1d = whole | shard]
//!                    [, layout = windows | owner_blocks])
//!         | other_keys = refuse | drop | pass | drop(KEY, ...) | separator = "/"
//! field:  axes(SEM | N, ...) | dtype = DTYPE | pad = LITERAL | mask(SEM, ...)
//!         | index(of = SEM, scope = serial | shard_local | padded_global [, one_hot = AXIS]
//!                 [, none = -1] [, deliver = ids | one_hot])
//!         | one_hot = AXIS | sparse | range(LO, HI)
//!         | coshard(axis = A, follows = L) | replicate_axes(A, ...) | replicated
//!         | placement("Shard(0)", "Replicate()") | only(WORKFLOW, ...) | name = "feature"
//!         | derive(outer(FEATURE [, FEATURE])) | derive(valid)
//!         | derive(halo(of = FEATURE, size = N))
//! An `Option<Tensor>` field is an optional feature (or, with `derive`, one the
//! pipeline makes when it is `None`).
//! ```

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::{Attribute, Expr, ExprLit, ExprUnary, Ident, Lit, LitInt, LitStr, UnOp};

/// A value with the span it was written at.
#[derive(Clone, Debug)]
pub struct At<T> {
    pub value: T,
    pub span: Span,
}

impl<T> At<T> {
    fn new(value: T, span: Span) -> Self {
        At { value, span }
    }
}

#[derive(Default)]
pub struct StructAttrs {
    pub module: Option<At<String>>,
    pub spec: Option<At<String>>,
    pub workflow: Option<At<String>>,
    pub mesh: Option<MeshAttr>,
    pub workflows: Vec<At<String>>,
    pub semantics: Vec<SemanticAttr>,
    pub other_keys: Option<At<String>>,
    pub drop: Vec<At<String>>,
    pub separator: Option<At<String>>,
}

/// `mesh(cp0, cp1, dp = dp)`.
pub struct MeshAttr {
    pub cp: Vec<At<String>>,
    pub dp: Option<At<String>>,
    pub span: Span,
}

pub struct SemanticAttr {
    pub name: At<String>,
    pub shard: bool,
    pub owner: Option<At<String>>,
    pub counts: Option<At<String>>,
    pub map: Option<At<String>>,
    pub window: Option<At<u32>>,
    pub incoming: Option<At<IncomingAttr>>,
    pub unowned_rows: Option<At<String>>,
    pub on_1d: Option<At<String>>,
    pub layout: Option<At<String>>,
}

/// `incoming_pads(mask = FEATURE)` or `incoming_pads(counts)`, with `map_pad = V`.
#[derive(Clone, Debug)]
pub struct IncomingAttr {
    pub real: RealItems,
    /// The owner id vector's value at the pads.
    pub map_pad: Option<At<i64>>,
}

/// How the real items are told.
#[derive(Clone, Debug)]
pub enum RealItems {
    Mask(At<String>),
    /// Where `counts` was written.
    Counts(Span),
}

#[derive(Default)]
pub struct FieldAttrs {
    pub axes: Option<At<Vec<At<AxisAttr>>>>,
    pub dtype: Option<At<String>>,
    pub pad: Option<At<PadLit>>,
    pub mask: Option<At<Vec<String>>>,
    pub index: Option<At<IndexAttr>>,
    pub one_hot: Option<At<usize>>,
    /// Where `sparse` was written, if it was.
    pub sparse: Option<Span>,
    /// `range(lo, hi)`: the values, each where it was written.
    pub range: Option<At<Vec<At<PadLit>>>>,
    pub coshard: Vec<At<(usize, usize)>>,
    pub replicate_axes: Vec<At<usize>>,
    /// Where `replicated` was written, if it was.
    pub replicated: Option<Span>,
    pub placement: Option<At<Vec<At<String>>>>,
    pub only: Option<Vec<At<String>>>,
    /// `derive(outer(a, b))` or `derive(valid)`: how the pipeline makes the feature.
    pub derive: Option<At<DeriveAttr>>,
    /// The feature's name, when it differs from the field's.
    pub name: Option<At<String>>,
    /// Whether any `#[featshard]` attribute was present.
    pub present: bool,
}

#[derive(Clone, Debug)]
pub enum AxisAttr {
    Semantic(String),
    Channel(u64),
}

#[derive(Clone, Copy, Debug)]
pub enum PadLit {
    Bool(bool),
    Int(i64),
    Float(f64),
}

#[derive(Clone, Debug)]
pub struct IndexAttr {
    pub of: String,
    pub scope: At<String>,
    pub one_hot: Option<usize>,
    /// The value that names no item (`none = -1`).
    pub none: Option<i64>,
    /// The form a map is delivered in (`deliver = ids`).
    pub deliver: Option<String>,
}

fn is_featshard(a: &Attribute) -> bool {
    a.path().is_ident("featshard")
}

fn ident_string(meta: &ParseNestedMeta) -> syn::Result<At<String>> {
    let value = meta.value()?;
    if value.peek(LitStr) {
        let s: LitStr = value.parse()?;
        Ok(At::new(s.value(), s.span()))
    } else {
        let i: Ident = value.parse()?;
        Ok(At::new(i.to_string(), i.span()))
    }
}

fn name_list(meta: &ParseNestedMeta) -> syn::Result<Vec<At<String>>> {
    let mut out = Vec::new();
    meta.parse_nested_meta(|m| {
        let i = m
            .path
            .get_ident()
            .ok_or_else(|| m.error("expected a name"))?;
        out.push(At::new(i.to_string(), i.span()));
        Ok(())
    })?;
    Ok(out)
}

fn int<T: std::str::FromStr>(meta: &ParseNestedMeta) -> syn::Result<T>
where
    T::Err: std::fmt::Display,
{
    int_at(meta).map(|i| i.value)
}

/// `key = N`, with the span of `N`.
fn int_at<T: std::str::FromStr>(meta: &ParseNestedMeta) -> syn::Result<At<T>>
where
    T::Err: std::fmt::Display,
{
    let lit: LitInt = meta.value()?.parse()?;
    Ok(At::new(lit.base10_parse()?, lit.span()))
}

/// A key given twice is an error (as serde's "duplicate serde attribute"), not a
/// silent overwrite of the first.
fn duplicate(meta: &ParseNestedMeta) -> syn::Error {
    let key = meta
        .path
        .get_ident()
        .map_or_else(|| "?".to_owned(), ToString::to_string);
    meta.error(format!("duplicate featshard attribute `{key}`"))
}

/// Sets a key's value once.
fn once<T>(slot: &mut Option<T>, value: T, meta: &ParseNestedMeta) -> syn::Result<()> {
    if slot.is_some() {
        return Err(duplicate(meta));
    }
    *slot = Some(value);
    Ok(())
}

fn unknown(meta: &ParseNestedMeta, what: &str, known: &str) -> syn::Error {
    let name = meta
        .path
        .get_ident()
        .map(ToString::to_string)
        .unwrap_or_else(|| "?".into());
    meta.error(format!(
        "unknown {what} attribute `{name}`; expected one of {known}"
    ))
}

/// Reads every struct-level `#[featshard(...)]`, collecting all errors.
pub fn struct_attrs(attrs: &[Attribute], errors: &mut Vec<syn::Error>) -> StructAttrs {
    let mut out = StructAttrs::default();
    for attr in attrs.iter().filter(|a| is_featshard(a)) {
        let result = attr.parse_nested_meta(|meta| {
            let p = &meta.path;
            if p.is_ident("module") {
                once(&mut out.module, ident_string(&meta)?, &meta)?;
            } else if p.is_ident("spec") {
                once(&mut out.spec, ident_string(&meta)?, &meta)?;
            } else if p.is_ident("workflow") {
                once(&mut out.workflow, ident_string(&meta)?, &meta)?;
            } else if p.is_ident("workflows") {
                out.workflows.extend(name_list(&meta)?);
            } else if p.is_ident("mesh") {
                let span = p.get_ident().map_or_else(Span::call_site, Ident::span);
                let mut cp = Vec::new();
                let mut dp = None;
                meta.parse_nested_meta(|m| {
                    if m.path.is_ident("dp") {
                        dp = Some(ident_string(&m)?);
                    } else {
                        let i = m
                            .path
                            .get_ident()
                            .ok_or_else(|| m.error("expected a mesh axis name"))?;
                        cp.push(At::new(i.to_string(), i.span()));
                    }
                    Ok(())
                })?;
                once(&mut out.mesh, MeshAttr { cp, dp, span }, &meta)?;
            } else if p.is_ident("semantic") {
                out.semantics.push(semantic(&meta)?);
            } else if p.is_ident("other_keys") {
                once(&mut out.other_keys, ident_string(&meta)?, &meta)?;
            } else if p.is_ident("drop") {
                out.drop.extend(name_list(&meta)?);
            } else if p.is_ident("separator") {
                once(&mut out.separator, ident_string(&meta)?, &meta)?;
            } else {
                return Err(unknown(
                    &meta,
                    "struct",
                    "`module`, `spec`, `workflow`, `workflows`, `mesh`, `semantic`, `other_keys`, `drop`, `separator`",
                ));
            }
            Ok(())
        });
        if let Err(e) = result {
            errors.push(e);
        }
    }
    out
}

fn semantic(meta: &ParseNestedMeta) -> syn::Result<SemanticAttr> {
    let mut name = None;
    let mut s = SemanticAttr {
        name: At::new(String::new(), Span::call_site()),
        shard: false,
        owner: None,
        counts: None,
        map: None,
        window: None,
        incoming: None,
        unowned_rows: None,
        on_1d: None,
        layout: None,
    };
    meta.parse_nested_meta(|m| {
        let p = &m.path;
        if p.is_ident("shard") {
            if s.shard {
                return Err(duplicate(&m));
            }
            s.shard = true;
        } else if p.is_ident("owner") {
            once(&mut s.owner, ident_string(&m)?, &m)?;
        } else if p.is_ident("counts") {
            once(&mut s.counts, ident_string(&m)?, &m)?;
        } else if p.is_ident("map") {
            once(&mut s.map, ident_string(&m)?, &m)?;
        } else if p.is_ident("window") {
            once(&mut s.window, int_at(&m)?, &m)?;
        } else if p.is_ident("incoming_pads") {
            let span = p.get_ident().map_or_else(Span::call_site, Ident::span);
            once(&mut s.incoming, At::new(incoming(&m)?, span), &m)?;
        } else if p.is_ident("unowned_rows") {
            once(&mut s.unowned_rows, ident_string(&m)?, &m)?;
        } else if p.is_ident("on_1d") {
            once(&mut s.on_1d, ident_string(&m)?, &m)?;
        } else if p.is_ident("layout") {
            once(&mut s.layout, ident_string(&m)?, &m)?;
        } else if name.is_none()
            && !m.input.peek(syn::Token![=])
            && !m.input.peek(syn::token::Paren)
        {
            let i = p
                .get_ident()
                .ok_or_else(|| m.error("expected the semantic's name"))?;
            name = Some(At::new(i.to_string(), i.span()));
        } else {
            return Err(unknown(
                &m,
                "semantic",
                "`shard`, `owner`, `counts`, `map`, `window`, `incoming_pads`, `unowned_rows`, `on_1d`, `layout`",
            ));
        }
        Ok(())
    })?;
    s.name = name.ok_or_else(|| {
        meta.error("`semantic(...)` needs a name first, e.g. `semantic(tokens, shard)`")
    })?;
    Ok(s)
}

/// `incoming_pads(mask = FEATURE | counts [, map_pad = V])`.
fn incoming(m: &ParseNestedMeta) -> syn::Result<IncomingAttr> {
    let (mut real, mut map_pad) = (None, None);
    m.parse_nested_meta(|i| {
        if i.path.is_ident("mask") {
            real = Some(RealItems::Mask(ident_string(&i)?));
        } else if i.path.is_ident("counts") {
            let at = i.path.get_ident().map_or_else(Span::call_site, Ident::span);
            real = Some(RealItems::Counts(at));
        } else if i.path.is_ident("map_pad") {
            let e: Expr = i.value()?.parse()?;
            map_pad = match pad_literal(&e)? {
                PadLit::Int(v) => Some(At::new(v, syn::spanned::Spanned::span(&e))),
                _ => return Err(syn::Error::new_spanned(e, "`map_pad` takes an integer")),
            };
        } else {
            return Err(unknown(
                &i,
                "incoming_pads",
                "`mask = FEATURE`, `counts`, `map_pad = V`",
            ));
        }
        Ok(())
    })?;
    let real = real.ok_or_else(|| m.error("`incoming_pads` needs `mask = FEATURE` or `counts`"))?;
    Ok(IncomingAttr { real, map_pad })
}

/// Reads a field's `#[featshard(...)]`, collecting all errors.
pub fn field_attrs(attrs: &[Attribute], errors: &mut Vec<syn::Error>) -> FieldAttrs {
    let mut out = FieldAttrs::default();
    for attr in attrs.iter().filter(|a| is_featshard(a)) {
        out.present = true;
        if let Err(e) = attr.parse_nested_meta(|meta| field_key(&mut out, &meta)) {
            errors.push(e);
        }
    }
    out
}

/// One key of a field's attribute; a key given twice is an error.
fn field_key(out: &mut FieldAttrs, meta: &ParseNestedMeta) -> syn::Result<()> {
    let p = &meta.path;
    let span = p.get_ident().map_or_else(Span::call_site, Ident::span);
    if p.is_ident("axes") {
        once(&mut out.axes, At::new(axes_list(meta)?, span), meta)?;
    } else if p.is_ident("dtype") {
        once(&mut out.dtype, ident_string(meta)?, meta)?;
    } else if p.is_ident("pad") {
        let e: Expr = meta.value()?.parse()?;
        once(&mut out.pad, At::new(pad_literal(&e)?, span), meta)?;
    } else if p.is_ident("mask") {
        let names = name_list(meta)?.into_iter().map(|n| n.value).collect();
        once(&mut out.mask, At::new(names, span), meta)?;
    } else if p.is_ident("index") {
        once(&mut out.index, At::new(index(meta)?, span), meta)?;
    } else if p.is_ident("one_hot") {
        let n: LitInt = meta.value()?.parse()?;
        once(&mut out.one_hot, At::new(n.base10_parse()?, n.span()), meta)?;
    } else if p.is_ident("sparse") {
        once(&mut out.sparse, span, meta)?;
    } else if p.is_ident("range") {
        let content;
        syn::parenthesized!(content in meta.input);
        let list = content.parse_terminated(Expr::parse, syn::Token![,])?;
        let values = list
            .iter()
            .map(|e| Ok(At::new(pad_literal(e)?, syn::spanned::Spanned::span(e))))
            .collect::<syn::Result<_>>()?;
        once(&mut out.range, At::new(values, span), meta)?;
    } else if p.is_ident("coshard") {
        out.coshard.push(At::new(coshard(meta)?, span));
    } else if p.is_ident("replicate_axes") {
        let content;
        syn::parenthesized!(content in meta.input);
        let list = content.parse_terminated(LitInt::parse, syn::Token![,])?;
        for n in list {
            out.replicate_axes
                .push(At::new(n.base10_parse()?, n.span()));
        }
    } else if p.is_ident("replicated") {
        once(&mut out.replicated, span, meta)?;
    } else if p.is_ident("placement") {
        let content;
        syn::parenthesized!(content in meta.input);
        let list =
            content.parse_terminated(<LitStr as syn::parse::Parse>::parse, syn::Token![,])?;
        let values = list.iter().map(|l| At::new(l.value(), l.span())).collect();
        once(&mut out.placement, At::new(values, span), meta)?;
    } else if p.is_ident("only") {
        once(&mut out.only, name_list(meta)?, meta)?;
    } else if p.is_ident("name") {
        once(&mut out.name, ident_string(meta)?, meta)?;
    } else if p.is_ident("derive") {
        once(&mut out.derive, At::new(derive_rule(meta)?, span), meta)?;
    } else {
        return Err(unknown(
            meta,
            "field",
            "`axes`, `dtype`, `pad`, `mask`, `index`, `one_hot`, `sparse`, `range`, `coshard`, `replicate_axes`, `replicated`, `placement`, `only`, `name`, `derive`",
        ));
    }
    Ok(())
}

/// `axes(tokens, atoms, 3)`: semantics by name, channels by size.
fn axes_list(meta: &ParseNestedMeta) -> syn::Result<Vec<At<AxisAttr>>> {
    let mut axes = Vec::new();
    let content;
    syn::parenthesized!(content in meta.input);
    while !content.is_empty() {
        if content.peek(LitInt) {
            let n: LitInt = content.parse()?;
            axes.push(At::new(AxisAttr::Channel(n.base10_parse()?), n.span()));
        } else {
            let i: Ident = content.parse()?;
            axes.push(At::new(AxisAttr::Semantic(i.to_string()), i.span()));
        }
        if !content.is_empty() {
            content.parse::<syn::Token![,]>()?;
        }
    }
    Ok(axes)
}

/// `coshard(axis = A, follows = L)`.
fn coshard(meta: &ParseNestedMeta) -> syn::Result<(usize, usize)> {
    let (mut axis, mut follows) = (None, None);
    meta.parse_nested_meta(|m| {
        if m.path.is_ident("axis") {
            axis = Some(int(&m)?);
        } else if m.path.is_ident("follows") {
            follows = Some(int(&m)?);
        } else {
            return Err(unknown(&m, "coshard", "`axis`, `follows`"));
        }
        Ok(())
    })?;
    match (axis, follows) {
        (Some(a), Some(f)) => Ok((a, f)),
        _ => Err(meta.error("`coshard` needs `axis = A, follows = L`")),
    }
}

/// How the pipeline makes a derived feature.
#[derive(Clone, Debug)]
pub enum DeriveAttr {
    /// `outer(A, B)`: the features the outer product is taken of, at `outer`.
    Outer(At<Vec<At<String>>>),
    /// `valid`: a validity mask made from the lengths, at `valid`.
    Valid(Span),
    /// `halo(of = F, size = N)`: the key halo of feature `F`, at `halo`.
    Halo(At<(String, u64)>),
}

/// `derive(outer(A, B))` or `derive(valid)`.
fn derive_rule(meta: &ParseNestedMeta) -> syn::Result<DeriveAttr> {
    let mut rule = None;
    meta.parse_nested_meta(|m| {
        let at = m.path.get_ident().map_or_else(Span::call_site, Ident::span);
        if rule.is_some() {
            return Err(m.error("`derive` takes one rule"));
        }
        if m.path.is_ident("outer") {
            rule = Some(DeriveAttr::Outer(At::new(name_list(&m)?, at)));
            Ok(())
        } else if m.path.is_ident("valid") {
            rule = Some(DeriveAttr::Valid(at));
            Ok(())
        } else if m.path.is_ident("halo") {
            rule = Some(DeriveAttr::Halo(At::new(halo(&m)?, at)));
            Ok(())
        } else {
            Err(unknown(
                &m,
                "derive",
                "`outer(FEATURE, FEATURE)`, `valid`, `halo(of = FEATURE, size = N)`",
            ))
        }
    })?;
    rule.ok_or_else(|| {
        meta.error(
            "`derive` needs `outer(FEATURE, FEATURE)`, `valid` or `halo(of = FEATURE, size = N)`",
        )
    })
}

/// `halo(of = FEATURE, size = N)`.
fn halo(meta: &ParseNestedMeta) -> syn::Result<(String, u64)> {
    let (mut of, mut size) = (None, None);
    meta.parse_nested_meta(|m| {
        if m.path.is_ident("of") {
            of = Some(ident_string(&m)?.value);
        } else if m.path.is_ident("size") {
            size = Some(int(&m)?);
        } else {
            return Err(unknown(&m, "halo", "`of`, `size`"));
        }
        Ok(())
    })?;
    match (of, size) {
        (Some(of), Some(size)) => Ok((of, size)),
        _ => Err(meta.error("`halo` needs `of = FEATURE, size = N`")),
    }
}

use syn::parse::Parse as _;

fn pad_literal(e: &Expr) -> syn::Result<PadLit> {
    match e {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(b), ..
        }) => Ok(PadLit::Bool(b.value)),
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => Ok(PadLit::Int(i.base10_parse()?)),
        Expr::Lit(ExprLit {
            lit: Lit::Float(f), ..
        }) => Ok(PadLit::Float(f.base10_parse()?)),
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            expr,
            ..
        }) => match pad_literal(expr)? {
            PadLit::Int(i) => Ok(PadLit::Int(-i)),
            PadLit::Float(x) => Ok(PadLit::Float(-x)),
            PadLit::Bool(_) => Err(syn::Error::new_spanned(e, "a bool pad cannot be negated")),
        },
        _ => Err(syn::Error::new_spanned(
            e,
            "`pad` takes a literal: a number or a bool",
        )),
    }
}

fn index(meta: &ParseNestedMeta) -> syn::Result<IndexAttr> {
    let (mut of, mut scope, mut one_hot, mut none, mut deliver) = (None, None, None, None, None);
    meta.parse_nested_meta(|m| {
        if m.path.is_ident("of") {
            of = Some(ident_string(&m)?.value);
        } else if m.path.is_ident("scope") {
            scope = Some(ident_string(&m)?);
        } else if m.path.is_ident("one_hot") {
            one_hot = Some(int(&m)?);
        } else if m.path.is_ident("none") {
            let e: Expr = m.value()?.parse()?;
            none = match pad_literal(&e)? {
                PadLit::Int(i) => Some(i),
                _ => return Err(syn::Error::new_spanned(e, "`none` takes an integer (-1)")),
            };
        } else if m.path.is_ident("deliver") {
            deliver = Some(ident_string(&m)?.value);
        } else {
            return Err(unknown(
                &m,
                "index",
                "`of`, `scope`, `one_hot`, `none`, `deliver`",
            ));
        }
        Ok(())
    })?;
    match (of, scope) {
        (Some(of), Some(scope)) => Ok(IndexAttr {
            of,
            scope,
            one_hot,
            none,
            deliver,
        }),
        _ => Err(meta
            .error("`index` needs `of = SEMANTIC, scope = serial | shard_local | padded_global`")),
    }
}
