//! Text -> [`RawSpec`](crate::syntax::RawSpec) -> Spec IR.
//!
//! [`parse_str`] reads YAML; [`lower`] takes the syntax tree from either front end (the
//! derive macro builds the same tree from its attributes) and checks each value on its
//! own: unparseable dtypes, scopes, placements and pads, an owner without counts or map,
//! incoming pads, key policies, mesh axes, windows, limits, names declared twice. Rules
//! across items live in [`crate::check`].

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::diag::{Diagnostics, SpecError};
use crate::ir::*;
use crate::limits;
use crate::loc::Loc;
use crate::names;
use crate::syntax::*;

/// Every `QUESTION(a|b)` a draft of `featshard init` left unanswered, outside comments:
/// each an error at its line and column naming the choices, before YAML reads the text
/// (to which it is no value, only a syntax error).
fn unanswered_questions(text: &str) -> Vec<SpecError> {
    let mut out = Vec::new();
    let mut offset = 0;
    for (k, line) in text.split_inclusive('\n').enumerate() {
        let code = line.split('#').next().unwrap_or_default();
        let mut from = 0;
        while let Some(at) = code[from..].find("QUESTION(").map(|i| from + i) {
            let end = code[at..].find(')').map_or(code.len(), |i| at + i + 1);
            let asked = &code[at..end];
            let choices = asked
                .trim_start_matches("QUESTION(")
                .trim_end_matches(')')
                .replace('|', ", ");
            let loc = Loc {
                line: u32::try_from(k + 1).unwrap_or(u32::MAX),
                column: u32::try_from(code[..at].chars().count() + 1).unwrap_or(u32::MAX),
                offset: offset + at,
                len: asked.len(),
                token: 0,
            };
            out.push(
                SpecError::new(format!("this question is unanswered: `{asked}`"), loc).help(
                    format!("write one of {choices} (or a channel size) in its place"),
                ),
            );
            from = end;
        }
        offset += line.len();
    }
    out
}

/// Parses spec text. `name` is what errors and generated headers call the source.
pub fn parse_str(name: &str, text: &str) -> Result<Spec, Diagnostics> {
    let fail = |errors| Diagnostics::new(name, text, errors);
    if text.len() > limits::MAX_SPEC_BYTES {
        return Err(fail(vec![SpecError::new(
            format!(
                "spec is {} bytes, more than the limit of {} bytes",
                text.len(),
                limits::MAX_SPEC_BYTES
            ),
            Loc::UNKNOWN,
        )]));
    }
    if text.trim().is_empty() {
        return Err(fail(vec![SpecError::new(
            "spec is empty: expected `version`, `module`, `mesh`, `semantics` and `features`",
            Loc {
                line: 1,
                column: 1,
                offset: 0,
                len: 1,
                token: 0,
            },
        )]));
    }
    let questions = unanswered_questions(text);
    if !questions.is_empty() {
        return Err(fail(questions));
    }
    let parsed: Result<Option<RawSpec>, _> =
        serde_saphyr::from_str_with_options(text, limits::yaml_options());
    let raw = match parsed {
        Ok(Some(raw)) => raw,
        Ok(None) => {
            return Err(fail(vec![SpecError::new(
                "spec is empty: expected `version`, `module`, `mesh`, `semantics` and `features`",
                Loc {
                    line: 1,
                    column: 1,
                    offset: 0,
                    len: 1,
                    token: 0,
                },
            )]))
        }
        Err(e) => return Err(fail(vec![yaml_error(&e, text)])),
    };
    let source = Source {
        name: name.to_owned(),
        sha256: sha256_hex(text),
    };
    lower(raw, source).map_err(fail)
}

/// Lowers a spec's syntax tree, read from YAML or built from a derive's attributes, into
/// the Spec IR. What is not syntax is decided here and in [`crate::check`], once for
/// both front ends; every error carries the [`Loc`] of the value it is about.
pub fn lower(raw: RawSpec, source: Source) -> Result<Spec, Vec<SpecError>> {
    let mut lower = Lower::default();
    let spec = lower.spec(raw, source);
    if lower.errors.is_empty() {
        Ok(spec)
    } else {
        Err(lower.errors)
    }
}

/// Hex SHA-256 of a text.
pub fn sha256_hex(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn yaml_error(e: &serde_saphyr::Error, text: &str) -> SpecError {
    let loc = e
        .location()
        .map(|l| Loc::from_saphyr(&l))
        .unwrap_or_else(|| {
            // Errors past the end (e.g. an unclosed bracket) have no location: point at the end.
            let line = u32::try_from(text.lines().count().max(1)).unwrap_or(u32::MAX);
            Loc {
                line,
                column: 1,
                offset: text.len().saturating_sub(1),
                len: 1,
                token: 0,
            }
        });
    // The saphyr message starts with its own "line L column C: " prefix; ours adds it back.
    let message = e.without_snippet().to_string();
    let message = message
        .strip_prefix("error: ")
        .unwrap_or(&message)
        .to_owned();
    let message = strip_location_prefix(&message);
    // ... and may end with " at line L, column C", which our prefix already says.
    let message = match message.rfind(" at line ") {
        Some(i) if message[i..].contains(", column ") => &message[..i],
        _ => message,
    };
    SpecError::new(format!("invalid YAML: {message}"), loc)
}

fn strip_location_prefix(m: &str) -> &str {
    if let Some(rest) = m.strip_prefix("line ") {
        if let Some(idx) = rest.find(": ") {
            let head = &rest[..idx];
            if head
                .chars()
                .all(|c| c.is_ascii_digit() || c == ' ' || c.is_ascii_lowercase())
            {
                return &rest[idx + 2..];
            }
        }
    }
    m
}

fn loc<T>(s: &Spanned<T>) -> Loc {
    s.loc
}

#[derive(Default)]
struct Lower {
    errors: Vec<SpecError>,
}

impl Lower {
    fn err(&mut self, e: SpecError) {
        self.errors.push(e);
    }

    fn spec(&mut self, raw: RawSpec, source: Source) -> Spec {
        if raw.version.value != 1 {
            self.err(
                SpecError::new(
                    format!("unsupported spec version {}", raw.version.value),
                    loc(&raw.version),
                )
                .help("this featshard reads `version: 1`"),
            );
        }
        let mesh = self.mesh(&raw.mesh);
        let semantics = self.semantics(raw.semantics);
        if !mesh.is_domain() {
            for s in semantics
                .values()
                .filter(|s| s.shards.stride.is_some() || s.shards.halo.is_some())
            {
                self.err(
                    SpecError::new(
                        "`stride` and `halo` apply to domain-parallel specs (`mesh: {domain: [...]}`)",
                        s.shards.loc,
                    )
                    .semantic(&s.name),
                );
            }
        }
        let workflows = self.workflows(raw.workflows);
        let features = self.features(raw.features);
        let mut inputs = self.inputs(raw.other_keys, raw.drop);
        inputs.separator = self.separator(raw.separator);
        Spec {
            source,
            module: Named::new(raw.module.value.clone(), loc(&raw.module)),
            mesh,
            semantics,
            workflows,
            features,
            inputs,
        }
    }

    fn mesh(&mut self, raw: &Spanned<RawMesh>) -> Mesh {
        let names = |axes: &Spanned<Vec<Spanned<String>>>| -> Vec<Named> {
            axes.value
                .iter()
                .map(|n| Named::new(n.value.clone(), loc(n)))
                .collect()
        };
        let split = match (&raw.value.cp, &raw.value.domain) {
            (Some(cp), None) => self.cp_axes(names(cp), loc(cp)),
            (None, Some(domain)) => self.domain_axes(names(domain), loc(domain), &raw.value.uneven),
            (Some(_), Some(domain)) => {
                self.err(
                    SpecError::new("a mesh names either `cp` axes (DTensor) or `domain` axes (ShardTensor), not both", loc(domain)),
                );
                None
            }
            (None, None) => {
                self.err(SpecError::new(
                    "the mesh needs `cp: [cp0, cp1]` or `domain: [axis, ...]`",
                    loc(raw),
                ));
                None
            }
        };
        let split = split.unwrap_or_else(|| {
            MeshSplit::Cp(["cp0", "cp1"].map(|a| Named::new(a, Loc::UNKNOWN)).to_vec())
        });
        if !matches!(split, MeshSplit::Domain { .. }) {
            if let Some(u) = raw.value.uneven.first() {
                self.err(SpecError::new(
                    "`uneven` applies to `domain` axes; CP shards are always padded",
                    loc(u),
                ));
            }
        }
        Mesh {
            split,
            dp: raw
                .value
                .dp
                .as_ref()
                .map(|d| Named::new(d.value.clone(), loc(d))),
            loc: loc(raw),
        }
    }

    /// The CP mesh: one axis `[cp]` or two `[cp0, cp1]`.
    fn cp_axes(&mut self, axes: Vec<Named>, at: Loc) -> Option<MeshSplit> {
        if (1..=2).contains(&axes.len()) {
            return Some(MeshSplit::Cp(axes));
        }
        self.err(
            SpecError::new(
                format!(
                    "a CP mesh has one axis `[cp]` or two `[cp0, cp1]`, {} given",
                    axes.len()
                ),
                at,
            )
            .help("a 2-D tile `[cp0, cp1]`, or one axis of any size `[cp]`"),
        );
        None
    }

    /// A semantic's owner: `owner` with `counts`, `map` or both.
    fn owner(
        &mut self,
        name: &str,
        key: Loc,
        owner: Option<Spanned<String>>,
        counts: Option<Spanned<String>>,
        map: Option<Spanned<String>>,
    ) -> Option<Owner> {
        match (owner, counts, map) {
            (None, None, None) => None,
            (Some(owner), Some(counts), None) => Some(Owner {
                owner: Named::new(owner.value.clone(), loc(&owner)),
                source_loc: loc(&counts),
                source: OwnerSource::Counts {
                    feature: counts.value,
                },
            }),
            (Some(owner), None, Some(map)) => Some(Owner {
                owner: Named::new(owner.value.clone(), loc(&owner)),
                source_loc: loc(&map),
                source: OwnerSource::Map { feature: map.value },
            }),
            (Some(owner), None, None) => {
                self.err(
                    SpecError::new(
                        format!(
                            "owner `{}` needs `counts: <feature>` or `map: <feature>`",
                            owner.value
                        ),
                        loc(&owner),
                    )
                    .semantic(name),
                );
                None
            }
            (Some(owner), Some(counts), Some(map)) => Some(Owner {
                owner: Named::new(owner.value.clone(), loc(&owner)),
                source_loc: loc(&counts),
                source: OwnerSource::CountsOrMap {
                    counts: counts.value,
                    map: map.value,
                },
            }),
            (None, counts, map) => {
                let at = counts.as_ref().map(loc).or(map.as_ref().map(loc));
                self.err(
                    SpecError::new(
                        "`counts` / `map` need `owner: <semantic>`",
                        at.unwrap_or(key),
                    )
                    .semantic(name),
                );
                None
            }
        }
    }

    /// A batch semantic is never sharded; a window holds at least one item.
    fn semantic_flags(&mut self, name: &str, body: &RawSemantic) {
        if let Some(b) = body.batch.as_ref().filter(|b| b.value.0) {
            if body.shard.value.0 {
                self.err(
                SpecError::new(
                    "a batch semantic is never sharded: scale the batch over the data-parallel axis",
                    loc(b),
                )
                .semantic(name)
                .help("set `shard: false`"),
            );
            }
        }
        if let Some(w) = &body.window {
            if w.value == 0 {
                self.err(SpecError::new("window must be at least 1", loc(w)).semantic(name));
            }
        }
    }

    /// A domain mesh's axes (one or two) and which of them are uneven.
    fn domain_axes(
        &mut self,
        axes: Vec<Named>,
        at: Loc,
        uneven_names: &[Spanned<String>],
    ) -> Option<MeshSplit> {
        if axes.is_empty() || axes.len() > 2 {
            self.err(SpecError::new(
                format!("a domain mesh has one or two axes, {} given", axes.len()),
                at,
            ));
            return None;
        }
        let mut uneven = vec![false; axes.len()];
        for u in uneven_names {
            match axes.iter().position(|a| a.name == u.value) {
                Some(i) => uneven[i] = true,
                None => self.err(
                    SpecError::new(
                        format!("`uneven` names `{}`, which is not a domain axis", u.value),
                        loc(u),
                    )
                    .help(format!(
                        "domain axes: {}",
                        axes.iter()
                            .map(|a| a.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                ),
            }
        }
        Some(MeshSplit::Domain { axes, uneven })
    }

    fn semantics(&mut self, raw: SpannedMap<RawSemantic>) -> BTreeMap<String, Semantic> {
        if raw.0.len() > limits::MAX_SEMANTICS {
            self.err(SpecError::new(
                format!(
                    "{} semantics declared, more than the limit of {}",
                    raw.0.len(),
                    limits::MAX_SEMANTICS
                ),
                Loc::UNKNOWN,
            ));
        }
        let mut out = BTreeMap::new();
        for (key, body) in raw.0 {
            let name = key.value.clone();
            if out.contains_key(&name) {
                self.err(
                    SpecError::new(format!("semantic `{name}` is declared twice"), loc(&key))
                        .semantic(&name),
                );
                continue;
            }
            let Some(mut body) = body else {
                self.err(
                    SpecError::new("needs `shard: true` or `shard: false`", loc(&key))
                        .semantic(&name),
                );
                continue;
            };
            let shards = self.shard_rule(&name, &body);
            let owner = self.owner(
                &name,
                loc(&key),
                body.owner.take(),
                body.counts.take(),
                body.map.take(),
            );
            self.semantic_flags(&name, &body);
            let incoming = body
                .incoming_pads
                .and_then(|i| self.incoming(&name, owner.as_ref(), i));
            let unowned_rows = body.unowned_rows.and_then(|u| self.unowned_rows(&name, u));
            let whole_on_1d = body.on_1d.is_some_and(|o| self.on_1d(&name, o));
            let windows = body.layout.and_then(|l| self.layout(&name, l));
            out.insert(
                name.clone(),
                Semantic {
                    name,
                    sharded: body.shard.value.0,
                    owner,
                    window: body.window.map(|w| w.value),
                    batch: body.batch.as_ref().is_some_and(|b| b.value.0),
                    incoming,
                    unowned_rows,
                    whole_on_1d,
                    windows,
                    shards,
                    loc: loc(&key),
                },
            );
        }
        out
    }

    /// `stride` and `halo`: on sharded semantics without an owner (whose axes a domain
    /// mesh splits directly); a stride of at least 1.
    fn shard_rule(&mut self, name: &str, body: &RawSemantic) -> ShardRule {
        let declared = body
            .stride
            .as_ref()
            .map(loc)
            .or(body.halo.as_ref().map(loc));
        let Some(at) = declared else {
            return ShardRule::default();
        };
        let key = if body.stride.is_some() {
            "stride"
        } else {
            "halo"
        };
        if !body.shard.value.0 {
            self.err(
                SpecError::new(
                    format!("`{key}` constrains shards, but this semantic is not sharded"),
                    at,
                )
                .semantic(name)
                .help("set `shard: true`, or drop it"),
            );
        } else if body.owner.is_some() {
            self.err(
                SpecError::new(
                    format!("`{key}` applies to axes a mesh splits directly, not to owned items"),
                    at,
                )
                .semantic(name),
            );
        }
        if let Some(s) = body.stride.as_ref().filter(|s| s.value == 0) {
            self.err(SpecError::new("stride must be at least 1", loc(s)).semantic(name));
        }
        for (key, v) in [("stride", &body.stride), ("halo", &body.halo)] {
            if let Some(v) = v.as_ref().filter(|v| v.value as usize > limits::MAX_LENGTH) {
                self.err(
                    SpecError::new(
                        format!(
                            "{key} {} is more than the length limit {}",
                            v.value,
                            limits::MAX_LENGTH
                        ),
                        loc(v),
                    )
                    .semantic(name),
                );
            }
        }
        ShardRule {
            stride: body.stride.as_ref().map(|s| s.value),
            halo: body.halo.as_ref().map(|h| h.value),
            loc: at,
        }
    }

    fn incoming(
        &mut self,
        name: &str,
        owner: Option<&Owner>,
        raw: Spanned<RawIncoming>,
    ) -> Option<Incoming> {
        let at = loc(&raw);
        let RawIncoming {
            mask,
            counts,
            map_pad,
        } = raw.value;
        let source = match (mask, counts) {
            (Some(mask), None) => IncomingSource::Mask {
                feature: mask.value,
            },
            (None, Some(c)) if c.value.0 => match owner.and_then(|o| o.source.counts()) {
                Some(counts) => IncomingSource::Counts {
                    feature: counts.to_owned(),
                },
                None => {
                    self.err(
                        SpecError::new(
                            "`incoming_pads: {counts: true}` needs `owner` and `counts: <feature>` on this semantic",
                            loc(&c),
                        )
                        .semantic(name),
                    );
                    return None;
                }
            },
            (None, Some(c)) => {
                self.err(
                    SpecError::new(
                        "`counts: false` says nothing; remove `incoming_pads`",
                        loc(&c),
                    )
                    .semantic(name),
                );
                return None;
            }
            (Some(_), Some(c)) => {
                self.err(
                    SpecError::new(
                        "the real items are given by `mask` or by `counts`, not both",
                        loc(&c),
                    )
                    .semantic(name),
                );
                return None;
            }
            (None, None) => {
                self.err(
                    SpecError::new(
                        "`incoming_pads` needs `mask: <feature>` or `counts: true`",
                        at,
                    )
                    .semantic(name),
                );
                return None;
            }
        };
        let map_pad = map_pad.map(|p| (p.value, loc(&p)));
        Some(Incoming {
            source,
            map_pad,
            loc: at,
        })
    }

    fn unowned_rows(&mut self, name: &str, raw: Spanned<String>) -> Option<Loc> {
        match raw.value.as_str() {
            "pad" => Some(loc(&raw)),
            "refuse" => None,
            other => {
                self.err(
                    SpecError::new(format!("unknown `unowned_rows` value `{other}`"), loc(&raw))
                        .semantic(name)
                        .help("`pad` (rows without an owner are pads) or `refuse` (the default)"),
                );
                None
            }
        }
    }

    /// `on_1d: whole | shard`: whether a one-axis CP mesh keeps the semantic whole.
    fn on_1d(&mut self, name: &str, raw: Spanned<String>) -> bool {
        match raw.value.as_str() {
            "whole" => true,
            "shard" => false,
            other => {
                self.err(
                    SpecError::new(format!("unknown `on_1d` value `{other}`"), loc(&raw))
                        .semantic(name)
                        .help(
                            "`whole` (kept whole on a one-axis CP mesh) or `shard` (the default)",
                        ),
                );
                false
            }
        }
    }

    /// `layout: windows | owner_blocks`: where `windows` was written, if it was.
    fn layout(&mut self, name: &str, raw: Spanned<String>) -> Option<Loc> {
        match raw.value.as_str() {
            "windows" => Some(loc(&raw)),
            "owner_blocks" => None,
            other => {
                self.err(
                    SpecError::new(format!("unknown `layout` value `{other}`"), loc(&raw))
                        .semantic(name)
                        .help("`windows` (serial order, each rank's block whole windows) or `owner_blocks` (the default)"),
                );
                None
            }
        }
    }

    fn inputs(&mut self, other: Option<Spanned<String>>, drop: Vec<Spanned<String>>) -> Inputs {
        let (other_keys, other_keys_loc) = match other {
            None => (KeyPolicy::Refuse, Loc::UNKNOWN),
            Some(o) => match KeyPolicy::parse(&o.value) {
                Some(p) => (p, loc(&o)),
                None => {
                    self.err(
                        SpecError::new(
                            format!("unknown `other_keys` policy `{}`", o.value),
                            loc(&o),
                        )
                        .help("one of `refuse`, `drop`, `pass`"),
                    );
                    (KeyPolicy::Refuse, loc(&o))
                }
            },
        };
        Inputs {
            other_keys,
            other_keys_loc,
            drop: drop
                .into_iter()
                .map(|d| Named::new(d.value.clone(), loc(&d)))
                .collect(),
            separator: Named::new(names::PATH.to_owned(), Loc::UNKNOWN),
        }
    }

    /// A separator holds no character a name may hold (it could not be told from one)
    /// and is short.
    fn separator(&mut self, raw: Option<Spanned<String>>) -> Named {
        let Some(s) = raw else {
            return Named::new(names::PATH.to_owned(), Loc::UNKNOWN);
        };
        let ok = !s.value.is_empty()
            && s.value.chars().count() <= 8
            && s.value != "_"
            && !s
                .value
                .chars()
                .any(|c| c.is_ascii_alphanumeric() || c.is_whitespace());
        if !ok {
            self.err(
                SpecError::new(
                    format!("`separator: {:?}` could not be told from a name", s.value),
                    loc(&s),
                )
                .help("1 to 8 characters, no letter, digit or space and not a single `_`: `.`, `/`, `__`, `:`"),
            );
        }
        Named::new(s.value.clone(), loc(&s))
    }

    fn workflows(&mut self, raw: Vec<Spanned<String>>) -> BTreeMap<String, Loc> {
        let mut out = BTreeMap::new();
        for w in raw {
            if out.insert(w.value.clone(), loc(&w)).is_some() {
                self.err(SpecError::new(
                    format!("workflow `{}` is declared twice", w.value),
                    loc(&w),
                ));
            }
        }
        out
    }

    fn features(&mut self, raw: Option<SpannedMap<RawFeature>>) -> BTreeMap<String, Feature> {
        let raw = raw.unwrap_or_default();
        if raw.0.is_empty() {
            self.err(SpecError::new(
                "the spec declares no features",
                Loc::UNKNOWN,
            ));
        }
        if raw.0.len() > limits::MAX_FEATURES {
            self.err(SpecError::new(
                format!(
                    "{} features declared, more than the limit of {}",
                    raw.0.len(),
                    limits::MAX_FEATURES
                ),
                Loc::UNKNOWN,
            ));
        }
        let mut out = BTreeMap::new();
        for (key, body) in raw.0 {
            let name = key.value.clone();
            if out.contains_key(&name) {
                self.err(
                    SpecError::new(format!("feature `{name}` is declared twice"), loc(&key))
                        .feature(&name),
                );
                continue;
            }
            let Some(body) = body else {
                self.err(
                    SpecError::new("needs `axes` and `dtype` (or `metadata: true`)", loc(&key))
                        .feature(&name),
                );
                continue;
            };
            if let Some(f) = self.feature(&name, loc(&key), body) {
                out.insert(name, f);
            }
        }
        out
    }

    fn feature(&mut self, name: &str, at: Loc, mut raw: RawFeature) -> Option<Feature> {
        let only = raw.only.as_ref().map(|o| {
            o.value
                .iter()
                .map(|w| Named::new(w.value.clone(), loc(w)))
                .collect()
        });
        let optional = raw.optional.as_ref().filter(|o| o.value.0).map(loc);
        let doc = raw.doc.take();
        let kind = if raw.metadata.as_ref().is_some_and(|m| m.value.0) {
            self.metadata_extras(name, &raw);
            FeatureKind::Metadata
        } else {
            FeatureKind::Tensor(Box::new(self.tensor_feature(name, at, raw)?))
        };
        Some(Feature {
            name: name.to_owned(),
            kind,
            only,
            optional,
            doc,
            loc: at,
        })
    }

    /// A tensor feature's keys lowered (`axes` and `dtype` required).
    fn tensor_feature(&mut self, name: &str, at: Loc, raw: RawFeature) -> Option<TensorFeature> {
        let Some(axes_raw) = raw.axes else {
            self.err(
                SpecError::new("needs `axes` (or `metadata: true`)", at)
                    .feature(name)
                    .help("e.g. `axes: [tokens, 3]`; use `axes: []` for a scalar"),
            );
            return None;
        };
        let Some(dtype_raw) = raw.dtype else {
            self.err(
                SpecError::new("needs `dtype`", at)
                    .feature(name)
                    .help(dtype_help()),
            );
            return None;
        };
        let dtype = self.dtype(name, &dtype_raw);
        let axes = self.axes(name, &axes_raw);
        let deliver = raw
            .index
            .as_ref()
            .and_then(|i| i.value.deliver.clone().map(|d| (d, loc(i))));
        let (role, role_loc) = self.role(name, at, raw.mask, raw.index);
        let placement = raw.placement.map(|p| self.placement(name, &p));
        let derived = raw.derive.and_then(|d| self.derive(name, d));
        let (pad, pad_loc) = self.pad(name, at, raw.pad);
        let range = raw.range.and_then(|r| self.range(name, r));
        let declared = TensorFeature {
            axes,
            axes_loc: loc(&axes_raw),
            dtype,
            dtype_loc: loc(&dtype_raw),
            pad,
            pad_loc,
            role,
            role_loc,
            one_hot: raw.one_hot.as_ref().map(|a| (a.value, loc(a))),
            sparse: raw.sparse.as_ref().filter(|s| s.value.0).map(loc),
            range,
            coshard: raw
                .coshard
                .map(|c| {
                    c.value
                        .iter()
                        .map(|c| CoShard {
                            axis: c.value.axis,
                            follows: c.value.follows,
                            loc: loc(c),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            replicate_axes: raw
                .replicate_axes
                .map(|r| r.value.iter().map(|a| (a.value, loc(a))).collect())
                .unwrap_or_default(),
            replicated: raw.replicated.is_some_and(|r| r.value.0),
            placement,
            derived,
            parameter: raw.parameter.as_ref().filter(|p| p.value.0).map(loc),
            output: raw.output.as_ref().filter(|p| p.value.0).map(loc),
            given: None,
        };
        let Some((form, at)) = deliver else {
            return Some(declared);
        };
        match crate::deliver::delivered(declared, &form, at) {
            Ok(t) => Some(t),
            Err(e) => {
                self.err((*e).feature(name));
                None
            }
        }
    }

    /// Metadata takes no tensor keys: each one given is an error.
    fn metadata_extras(&mut self, name: &str, raw: &RawFeature) {
        let extra = [
            raw.derive.as_ref().map(|a| ("derive", loc(a))),
            raw.axes.as_ref().map(|a| ("axes", loc(a))),
            raw.dtype.as_ref().map(|a| ("dtype", loc(a))),
            raw.pad.as_ref().map(|a| ("pad", loc(a))),
            raw.mask.as_ref().map(|a| ("mask", loc(a))),
            raw.index.as_ref().map(|a| ("index", loc(a))),
            raw.one_hot.as_ref().map(|a| ("one_hot", loc(a))),
            raw.sparse.as_ref().map(|a| ("sparse", loc(a))),
            raw.range.as_ref().map(|a| ("range", loc(a))),
            raw.placement.as_ref().map(|a| ("placement", loc(a))),
            raw.coshard.as_ref().map(|a| ("coshard", loc(a))),
            raw.parameter.as_ref().map(|a| ("parameter", loc(a))),
            raw.output.as_ref().map(|a| ("output", loc(a))),
        ];
        for (key, l) in extra.into_iter().flatten() {
            self.err(
                SpecError::new(
                    format!("metadata is passed through untouched; `{key}` does not apply"),
                    l,
                )
                .feature(name),
            );
        }
    }

    fn dtype(&mut self, name: &str, dtype_raw: &Spanned<String>) -> DType {
        match DType::parse(&dtype_raw.value) {
            Some(d) => d,
            None => {
                self.err(
                    SpecError::new(
                        format!("unknown dtype `{}`", dtype_raw.value),
                        loc(dtype_raw),
                    )
                    .feature(name)
                    .help(dtype_help()),
                );
                DType::Float32
            }
        }
    }

    fn axes(&mut self, name: &str, raw: &Spanned<Vec<Spanned<RawAxis>>>) -> Vec<Axis> {
        let mut axes: Vec<Axis> = Vec::new();
        // The channel sizes' product so far: a tensor's element count is an int64.
        let mut elements: Option<u64> = Some(1);
        for (i, a) in raw.value.iter().enumerate() {
            let kind = match &a.value {
                RawAxis::Size(n) => {
                    elements = elements.and_then(|e| e.checked_mul(*n));
                    if *n > i64::MAX as u64 {
                        self.err(
                            SpecError::new(
                                format!("channel size {n} is more than {}, the longest axis a torch tensor can have", i64::MAX),
                                loc(a),
                            )
                            .feature(name)
                            .axis(i, n),
                        );
                        elements = Some(0);
                    } else if elements.is_none_or(|e| e > i64::MAX as u64) {
                        self.err(
                            SpecError::new(
                                format!("the channel sizes up to this one make more than {} elements, the most a torch tensor can hold", i64::MAX),
                                loc(a),
                            )
                            .feature(name)
                            .axis(i, n),
                        );
                        elements = Some(0);
                    }
                    AxisKind::Channel(*n)
                }
                RawAxis::Name(s) => AxisKind::Semantic(s.clone()),
                RawAxis::Invalid(v) => {
                    self.err(
                        SpecError::new(
                            format!("an axis is a semantic name or a channel size, not {v}"),
                            loc(a),
                        )
                        .feature(name)
                        .axis(i, v),
                    );
                    AxisKind::Channel(1)
                }
            };
            axes.push(Axis { kind, loc: loc(a) });
        }
        axes
    }

    /// `mask` or `index` (not both), or data.
    fn role(
        &mut self,
        name: &str,
        at: Loc,
        mask: Option<Spanned<OneOrMany>>,
        index: Option<Spanned<RawIndex>>,
    ) -> (Role, Loc) {
        match (mask, index) {
            (Some(m), Some(i)) => {
                self.err(
                    SpecError::new("a feature is a mask or an index, not both", loc(&i))
                        .feature(name),
                );
                (Role::Data, loc(&m))
            }
            (Some(m), None) => {
                let l = loc(&m);
                let of = match m.value.into_vec() {
                    Ok(of) if !of.is_empty() => of,
                    Ok(_) => {
                        self.err(
                            SpecError::new(
                                "`mask: []` masks nothing: name the semantics it masks",
                                l,
                            )
                            .feature(name),
                        );
                        Vec::new()
                    }
                    Err(v) => {
                        self.err(
                            SpecError::new(
                                format!("`mask` names a semantic or a list of them, not {v}"),
                                l,
                            )
                            .feature(name),
                        );
                        Vec::new()
                    }
                };
                (Role::Mask { of }, l)
            }
            (None, Some(i)) => {
                let l = loc(&i);
                let scope = match i.value.scope.as_str() {
                    "serial" => IndexScope::Serial,
                    "shard_local" => IndexScope::ShardLocal,
                    "padded_global" => IndexScope::PaddedGlobal,
                    other => {
                        self.err(
                            SpecError::new(format!("unknown index scope `{other}`"), l)
                                .feature(name)
                                .help("one of `serial`, `shard_local`, `padded_global`"),
                        );
                        IndexScope::Serial
                    }
                };
                (
                    Role::Index(IndexRole {
                        of: i.value.of,
                        scope,
                        one_hot: i.value.one_hot,
                        none: i.value.none,
                    }),
                    l,
                )
            }
            (None, None) => (Role::Data, at),
        }
    }

    fn placement(
        &mut self,
        name: &str,
        p: &Spanned<Vec<Spanned<String>>>,
    ) -> (Vec<Placement>, Loc) {
        let mut parsed = Vec::new();
        for item in &p.value {
            match Placement::parse(&item.value) {
                Some(pl) => parsed.push(pl),
                None => self.err(
                    SpecError::new(format!("`{}` is not a placement", item.value), loc(item))
                        .feature(name)
                        .help("write `Shard(<dim>)` or `Replicate()`"),
                ),
            }
        }
        (parsed, loc(p))
    }

    fn pad(&mut self, name: &str, at: Loc, pad: Option<Spanned<RawScalar>>) -> (PadValue, Loc) {
        match pad {
            Some(p) => {
                let value = match &p.value {
                    RawScalar::Bool(b) => PadValue::Bool(*b),
                    RawScalar::Int(i) => PadValue::Int(*i),
                    RawScalar::Float(x) => PadValue::Float(*x),
                    RawScalar::Invalid(v) => {
                        self.err(
                            SpecError::new(
                                format!("`pad` is a bool or a number, not {v}"),
                                loc(&p),
                            )
                            .feature(name),
                        );
                        PadValue::default()
                    }
                };
                (value, loc(&p))
            }
            None => (PadValue::default(), at),
        }
    }

    /// `range: [lo, hi]`: two integers, `lo` at most `hi`.
    fn range(
        &mut self,
        name: &str,
        raw: Spanned<Vec<Spanned<RawScalar>>>,
    ) -> Option<([i64; 2], Loc)> {
        let at = loc(&raw);
        let ints: Vec<Option<i64>> = raw
            .value
            .iter()
            .map(|v| match v.value {
                RawScalar::Int(i) => Some(i),
                _ => None,
            })
            .collect();
        let message = match ints.as_slice() {
            [Some(lo), Some(hi)] if lo <= hi => return Some(([*lo, *hi], at)),
            [Some(lo), Some(hi)] => {
                format!("`range: [{lo}, {hi}]` is empty: its low end is above its high end")
            }
            _ => "`range` is two integers, `[lo, hi]`: the lowest and highest value".to_owned(),
        };
        self.err(SpecError::new(message, at).feature(name));
        None
    }

    fn derive(&mut self, name: &str, raw: Spanned<RawDerive>) -> Option<Derived> {
        let at = loc(&raw);
        let RawDerive { outer, valid, halo } = raw.value;
        let rule = match (outer, valid, halo) {
            (Some(outer), None, None) => self.outer(name, outer)?,
            (None, Some(valid), None) if valid.value.0 => DeriveRule::Valid,
            (None, None, Some(halo)) => self.halo(name, halo)?,
            (outer, valid, halo) => {
                let given = [outer.is_some(), valid.is_some(), halo.is_some()];
                let why = match given {
                    [false, true, false] => "`valid: false` derives nothing: leave `derive` out",
                    [false, false, false] => {
                        "`derive` needs a rule: `outer: [A, B]`, `valid: true` or `halo: {of: FEATURE, size: N}`"
                    }
                    _ => "`derive` takes one rule: `outer`, `valid` or `halo`",
                };
                self.err(SpecError::new(why, at).feature(name));
                return None;
            }
        };
        Some(Derived { rule, loc: at })
    }

    fn outer(&mut self, name: &str, outer: Spanned<Vec<Spanned<String>>>) -> Option<DeriveRule> {
        let of: Vec<String> = outer.value.iter().map(|n| n.value.clone()).collect();
        let of = match of.as_slice() {
            [a] => [a.clone(), a.clone()],
            [a, b] => [a.clone(), b.clone()],
            _ => {
                self.err(
                    SpecError::new(
                        format!("`outer` takes one or two features, {} given", of.len()),
                        loc(&outer),
                    )
                    .feature(name),
                );
                return None;
            }
        };
        Some(DeriveRule::Outer { of })
    }

    fn halo(&mut self, name: &str, halo: Spanned<RawHalo>) -> Option<DeriveRule> {
        let at = loc(&halo);
        let size = usize::try_from(halo.value.size)
            .ok()
            .filter(|n| (1..=limits::MAX_HALO).contains(n));
        let Some(size) = size else {
            self.err(
                SpecError::new(
                    format!(
                        "a halo of {} items a side: give 1 to {}",
                        halo.value.size,
                        limits::MAX_HALO
                    ),
                    at,
                )
                .feature(name),
            );
            return None;
        };
        Some(DeriveRule::Halo {
            of: halo.value.of,
            size,
        })
    }
}

fn dtype_help() -> String {
    let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    format!("one of {}", names.join(", "))
}
