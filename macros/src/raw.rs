//! The inline attributes as the spec's own syntax tree ([`RawSpec`]), the tree a YAML
//! file parses to. Each value is placed at a token that maps back to the span it was
//! written at, so that lowering and every check are the spec crate's, run once for both
//! front ends, and each error lands on the attribute it is about.

use featshard_spec::loc::Loc;
use featshard_spec::syntax::{
    Flag, OneOrMany, RawAxis, RawCoShard, RawDerive, RawFeature, RawHalo, RawIncoming, RawIndex,
    RawMesh, RawScalar, RawSemantic, RawSpec, Spanned, SpannedMap,
};
use proc_macro2::Span;

use crate::attr::{
    At, AxisAttr, DeriveAttr, FieldAttrs, PadLit, RealItems, SemanticAttr, StructAttrs,
};
use crate::field::TensorField;

/// The spans of the values put into the tree, numbered; a [`Loc`] holds the number.
#[derive(Default)]
pub struct Tokens(Vec<Span>);

impl Tokens {
    /// `value`, written at `span`.
    fn at<T>(&mut self, value: T, span: Span) -> Spanned<T> {
        let id = u32::try_from(self.0.len()).unwrap_or(u32::MAX);
        self.0.push(span);
        Spanned::new(value, Loc::at_token(id))
    }

    fn named(&mut self, a: &At<String>) -> Spanned<String> {
        self.at(a.value.clone(), a.span)
    }

    /// Where a value of the tree was written, if `loc` is one of ours.
    pub fn span(&self, loc: Loc) -> Option<Span> {
        let id = usize::try_from(loc.token_id()?).ok()?;
        self.0.get(id).copied()
    }
}

/// The struct's attributes and fields as a spec file would write them.
pub fn spec(
    ident: &syn::Ident,
    sattrs: &StructAttrs,
    fields: &[TensorField],
    fattrs: &[FieldAttrs],
    t: &mut Tokens,
) -> RawSpec {
    let whole = ident.span();
    let module = match &sattrs.module {
        Some(m) => t.named(m),
        None => t.at(format!("{}_placements", snake(ident)), whole),
    };
    let semantics = sattrs
        .semantics
        .iter()
        .map(|s| (t.named(&s.name), Some(semantic(s, t))))
        .collect();
    let features = fields
        .iter()
        .zip(fattrs)
        .map(|(f, a)| (t.at(f.feature.clone(), f.span), Some(feature(f, a, t))))
        .collect();
    RawSpec {
        version: t.at(1, whole),
        module,
        mesh: mesh(sattrs, whole, t),
        semantics: SpannedMap(semantics),
        workflows: sattrs.workflows.iter().map(|w| t.named(w)).collect(),
        features: Some(SpannedMap(features)),
        other_keys: sattrs.other_keys.as_ref().map(|o| t.named(o)),
        drop: sattrs.drop.iter().map(|d| t.named(d)).collect(),
        separator: sattrs.separator.as_ref().map(|s| t.named(s)),
    }
}

/// `mesh(cp0, cp1, dp = dp)`, or the default `[cp0, cp1]` without a DP axis.
fn mesh(sattrs: &StructAttrs, whole: Span, t: &mut Tokens) -> Spanned<RawMesh> {
    let (cp, dp, span) = match &sattrs.mesh {
        Some(m) => {
            let axes = m.cp.iter().map(|a| t.named(a)).collect();
            (
                t.at(axes, m.span),
                m.dp.as_ref().map(|d| t.named(d)),
                m.span,
            )
        }
        None => {
            let axes = ["cp0", "cp1"].map(|a| t.at(a.to_owned(), whole)).to_vec();
            (t.at(axes, whole), None, whole)
        }
    };
    let raw = RawMesh {
        cp: Some(cp),
        domain: None,
        uneven: Vec::new(),
        dp,
    };
    t.at(raw, span)
}

fn semantic(s: &SemanticAttr, t: &mut Tokens) -> RawSemantic {
    let at = s.name.span;
    let incoming_pads = s.incoming.as_ref().map(|i| {
        let map_pad = i.value.map_pad.as_ref().map(|p| t.at(p.value, p.span));
        let raw = match &i.value.real {
            RealItems::Mask(m) => RawIncoming {
                mask: Some(t.named(m)),
                counts: None,
                map_pad,
            },
            RealItems::Counts(at) => RawIncoming {
                mask: None,
                counts: Some(t.at(Flag(true), *at)),
                map_pad,
            },
        };
        t.at(raw, i.span)
    });
    RawSemantic {
        shard: t.at(Flag(s.shard), at),
        owner: s.owner.as_ref().map(|o| t.named(o)),
        counts: s.counts.as_ref().map(|c| t.named(c)),
        map: s.map.as_ref().map(|m| t.named(m)),
        window: s.window.as_ref().map(|w| t.at(w.value, w.span)),
        // The derive describes context-parallel structs; domain specs are YAML.
        batch: None,
        incoming_pads,
        stride: None,
        halo: None,
        unowned_rows: s.unowned_rows.as_ref().map(|u| t.named(u)),
        on_1d: s.on_1d.as_ref().map(|o| t.named(o)),
        layout: s.layout.as_ref().map(|o| t.named(o)),
        doc: None,
    }
}

fn feature(f: &TensorField, a: &FieldAttrs, t: &mut Tokens) -> RawFeature {
    RawFeature {
        axes: a.axes.as_ref().map(|x| {
            let axes = x
                .value
                .iter()
                .map(|v| t.at(axis(&v.value), v.span))
                .collect();
            t.at(axes, x.span)
        }),
        dtype: a.dtype.as_ref().map(|d| t.named(d)),
        pad: a.pad.as_ref().map(|p| t.at(scalar(p.value), p.span)),
        mask: a
            .mask
            .as_ref()
            .map(|m| t.at(OneOrMany::Many(m.value.clone()), m.span)),
        index: a.index.as_ref().map(|i| {
            let raw = RawIndex {
                of: i.value.of.clone(),
                scope: i.value.scope.value.clone(),
                one_hot: i.value.one_hot,
                none: i.value.none,
                deliver: i.value.deliver.clone(),
            };
            t.at(raw, i.span)
        }),
        one_hot: a.one_hot.as_ref().map(|n| t.at(n.value, n.span)),
        sparse: a.sparse.map(|s| t.at(Flag(true), s)),
        range: a.range.as_ref().map(|r| {
            let values = r
                .value
                .iter()
                .map(|v| t.at(scalar(v.value), v.span))
                .collect();
            t.at(values, r.span)
        }),
        coshard: list(&a.coshard, t, |&(axis, follows)| RawCoShard {
            axis,
            follows,
        }),
        replicate_axes: list(&a.replicate_axes, t, |&n| n),
        replicated: a.replicated.map(|s| t.at(Flag(true), s)),
        metadata: None,
        placement: a.placement.as_ref().map(|p| {
            let items = p.value.iter().map(|s| t.named(s)).collect();
            t.at(items, p.span)
        }),
        only: a.only.as_ref().map(|o| {
            let span = o.first().map_or(f.span, |w| w.span);
            let names = o.iter().map(|w| t.named(w)).collect();
            t.at(names, span)
        }),
        // An `Option` field is optional, unless it is one the pipeline derives.
        optional: (f.optional && a.derive.is_none()).then(|| t.at(Flag(true), f.span)),
        parameter: None,
        output: None,
        derive: a.derive.as_ref().map(|d| derive(d, t)),
        doc: None,
    }
}

/// `derive(...)` as the syntax tree's `derive:`.
fn derive(d: &At<DeriveAttr>, t: &mut Tokens) -> Spanned<RawDerive> {
    let raw = match &d.value {
        DeriveAttr::Outer(of) => {
            let names = of.value.iter().map(|n| t.named(n)).collect();
            RawDerive {
                outer: Some(t.at(names, of.span)),
                valid: None,
                halo: None,
            }
        }
        DeriveAttr::Valid(at) => RawDerive {
            outer: None,
            valid: Some(t.at(Flag(true), *at)),
            halo: None,
        },
        DeriveAttr::Halo(h) => {
            let (of, size) = &h.value;
            let halo = RawHalo {
                of: of.clone(),
                size: *size,
            };
            RawDerive {
                outer: None,
                valid: None,
                halo: Some(t.at(halo, h.span)),
            }
        }
    };
    t.at(raw, d.span)
}

/// A repeated attribute (`coshard(...)`, `replicate_axes(...)`) as a list, if given.
fn list<A, R>(
    items: &[At<A>],
    t: &mut Tokens,
    each: impl Fn(&A) -> R,
) -> Option<Spanned<Vec<Spanned<R>>>> {
    let span = items.first()?.span;
    let values = items.iter().map(|i| t.at(each(&i.value), i.span)).collect();
    Some(t.at(values, span))
}

fn axis(a: &AxisAttr) -> RawAxis {
    match a {
        AxisAttr::Semantic(s) => RawAxis::Name(s.clone()),
        AxisAttr::Channel(n) => RawAxis::Size(*n),
    }
}

fn scalar(p: PadLit) -> RawScalar {
    match p {
        PadLit::Bool(b) => RawScalar::Bool(b),
        PadLit::Int(i) => RawScalar::Int(i),
        PadLit::Float(x) => RawScalar::Float(x),
    }
}

/// `MyFeatures` -> `my_features`, the default module name.
fn snake(ident: &syn::Ident) -> String {
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
