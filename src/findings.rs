//! `featshard validate SPEC --features SAMPLE`: a spec checked against what a sample's
//! values show. featshard executes a spec exactly, so a declaration that misreads the
//! featurizer (atom ids declared plain data, a pad mask declared plain data, a flag
//! declared a mask) shards wrong without an error, and the round trip is exact for it
//! too. These checks read the values through `crate::values::shows`, as `init` does.

use std::collections::BTreeMap;
use std::path::Path;

use featshard_spec::ir::{AxisKind, Role, Spec, TensorFeature};
use featshard_spec::loc::Loc;

use crate::values::{shows, Sample, Tensor};

/// What a sample's values say against one declaration.
pub struct Finding {
    /// The feature the declaration is of.
    pub feature: String,
    /// Where the spec declares it.
    pub at: Loc,
    /// What the values show.
    pub shows: String,
    /// The declaration to consider.
    pub consider: String,
}

impl Finding {
    /// One finding as a line of the report, `path:line:column` first.
    pub fn render(&self, spec: &Path) -> String {
        format!(
            "{}:{}:{}: feature `{}`: {}; consider {}",
            spec.display(),
            self.at.line,
            self.at.column,
            self.feature,
            self.shows,
            self.consider
        )
    }
}

/// The sample as the spec reads it: every declared tensor it gives, with values, and
/// each semantic's length and items' owners.
struct Read<'a> {
    spec: &'a Spec,
    given: BTreeMap<&'a str, (&'a TensorFeature, &'a Tensor, &'a [f64])>,
    lengths: BTreeMap<String, usize>,
    owner_of: BTreeMap<String, Vec<Option<usize>>>,
}

/// Every finding of `sample`'s values against `spec`, in feature order.
pub fn check(spec: &Spec, sample: &Sample) -> Vec<Finding> {
    let read = Read::new(spec, sample);
    let mut out = Vec::new();
    for (name, &(t, x, v)) in &read.given {
        let at = spec.features[*name].loc;
        let mut found = |shows: String, consider: String| {
            out.push(Finding {
                feature: (*name).to_owned(),
                at,
                shows,
                consider,
            })
        };
        read.ids(name, t, x, v, &mut found);
        read.masks(name, t, v, &mut found);
        read.dense(t, x, v, &mut found);
        read.index_values(t, v, &mut found);
    }
    read.map_pads(&mut out);
    out
}

impl<'a> Read<'a> {
    fn new(spec: &'a Spec, sample: &'a Sample) -> Read<'a> {
        let mut given = BTreeMap::new();
        let mut lengths = BTreeMap::new();
        for (name, _, t) in spec.tensors() {
            let Some(x) = sample.tensors.get(name) else {
                continue;
            };
            if x.shape.len() != t.axes.len() {
                continue;
            }
            for (a, &n) in t.axes.iter().zip(&x.shape) {
                if let Some(s) = a.semantic() {
                    lengths.entry(s.to_owned()).or_insert(n);
                }
            }
            if let Some(v) = x.values.as_deref() {
                given.insert(name, (t, x, v));
            }
        }
        let mut read = Read {
            spec,
            given,
            lengths,
            owner_of: BTreeMap::new(),
        };
        read.owner_of = read.owners();
        read
    }

    /// Each owned semantic's items' owners, from its declared map or counts.
    fn owners(&self) -> BTreeMap<String, Vec<Option<usize>>> {
        let mut out = BTreeMap::new();
        for (s, sem) in &self.spec.semantics {
            let Some(o) = &sem.owner else { continue };
            let from_map = o.source.map().and_then(|m| {
                let (t, x, v) = self.given.get(m)?;
                match (&t.role, x.shape.as_slice()) {
                    (_, [_]) => Some(shows::owners_of_ids(v)),
                    (Role::Index(_), [_, w]) if *w > 0 => Some(
                        v.chunks_exact(*w)
                            .map(|r| r.iter().position(|&x| x == 1.0))
                            .collect(),
                    ),
                    _ => None,
                }
            });
            let from_counts = || {
                let (_, _, v) = self.given.get(o.source.counts()?)?;
                shows::owners_of_counts(v, self.len(s)?)
            };
            if let Some(of) = from_map.or_else(from_counts) {
                out.insert(s.clone(), of);
            }
        }
        out
    }

    fn len(&self, s: &str) -> Option<usize> {
        self.lengths.get(s).copied()
    }

    /// The real items of `s`: the prefix its incoming-pad mask marks, else its length.
    fn real_len(&self, s: &str) -> Option<usize> {
        let mask = self
            .spec
            .semantics
            .get(s)?
            .incoming
            .as_ref()
            .map(|i| i.source.feature());
        let marked = mask
            .and_then(|m| self.given.get(m))
            .map(|(_, _, v)| shows::padded_prefix(v).unwrap_or(v.len()));
        marked.or_else(|| self.len(s))
    }

    /// Integers declared plain data that behave as ids of another semantic's items: an
    /// owner id per item (`atom_to_token_index`), each owner's first item
    /// (`start_atom_index`), a frame's atoms (`frame_atom_index`).
    fn ids(
        &self,
        name: &str,
        t: &TensorFeature,
        x: &Tensor,
        v: &[f64],
        found: &mut impl FnMut(String, String),
    ) {
        if !matches!(t.role, Role::Data) || !t.dtype.is_integer() || t.one_hot.is_some() {
            return;
        }
        let Some(first) = t.axes.first().and_then(|a| a.semantic()) else {
            return;
        };
        if let (Some(o), [_]) = (self.owner_name(first), x.shape.as_slice()) {
            let owners = self.real_len(o).unwrap_or(0);
            if owners > 1 && shows::owner_ids(v, owners) {
                found(
                    format!("its values are a `{o}` id per `{first}` item, in `{o}` order (an owner map), but it is declared plain data: on a mesh they would name other `{o}`"),
                    format!("`index: {{of: {o}, scope: shard_local}}` (and `map: {name}` on `{first}`)"),
                );
            }
        }
        for (items, owner_of) in self.owned_by(first) {
            match shows::item_ids(name, items, &x.shape, v, owner_of) {
                Some(shows::ItemIds::First) => found(
                    format!("its values are each `{first}` item's first `{items}` item, but it is declared plain data: they would not move with the `{items}`"),
                    format!("`index: {{of: {items}, scope: padded_global}}`"),
                ),
                Some(shows::ItemIds::Own { none }) => found(
                    format!("its values are ids of `{items}` of the row's own `{first}` item{}, but it is declared plain data: they would not move with the `{items}`", if none { " (-1: none)" } else { "" }),
                    format!("`pad: -1, index: {{of: {items}, scope: padded_global{}}}`", if none { ", none: -1" } else { "" }),
                ),
                None => {}
            }
        }
    }

    fn owner_name(&self, s: &str) -> Option<&str> {
        let o = self.spec.semantics.get(s)?.owner.as_ref()?;
        Some(o.owner.name.as_str())
    }

    /// The semantics `owner` owns, each with its items' owners.
    fn owned_by(&self, owner: &str) -> Vec<(&str, &[Option<usize>])> {
        self.owner_of
            .iter()
            .filter(|(s, _)| self.owner_name(s) == Some(owner))
            .map(|(s, of)| (s.as_str(), of.as_slice()))
            .collect()
    }

    /// 0/1 features over one sharded semantic: 1 on a prefix and 0 after where the
    /// semantic takes no incoming pads (its pads would be kept as items), or declared
    /// a mask with a 0 between 1s (a flag of some real items).
    fn masks(
        &self,
        name: &str,
        t: &TensorFeature,
        v: &[f64],
        found: &mut impl FnMut(String, String),
    ) {
        let [axis] = t.axes.as_slice() else { return };
        let Some(s) = axis.semantic() else { return };
        let Some(sem) = self.spec.semantics.get(s).filter(|x| x.sharded) else {
            return;
        };
        if !shows::zero_one(v) || t.derived.is_some() {
            return;
        }
        let is_mask = matches!(&t.role, Role::Mask { .. });
        if let (Some(n), None) = (shows::padded_prefix(v), &sem.incoming) {
            let data = matches!(t.role, Role::Data) && !shows::is_flag(name);
            if (is_mask || data) && !self.named_past(s, n) {
                let mask = if is_mask {
                    String::new()
                } else {
                    format!("`mask: {s}` and ")
                };
                found(
                    format!("it is 1 on the first {n} `{s}` and 0 on the {} after, which nothing owns or names: pads at the end, kept as `{s}` items", v.len() - n),
                    format!("{mask}`incoming_pads: {{mask: {name}}}` on `{s}`"),
                );
            }
        }
        let incoming = sem
            .incoming
            .as_ref()
            .is_some_and(|i| i.source.feature() == name);
        let flag = match (shows::zero_before_one(v), shows::padded_prefix(v)) {
            (Some(i), _) => Some(format!("it is 0 at `{s}` item {i} and 1 after it")),
            (None, Some(n)) if self.named_past(s, n) => Some(format!(
                "it is 0 on `{s}` {n} and after, which own or are owned by other items"
            )),
            _ => None,
        };
        if let (true, Some(flag)) = (is_mask, flag) {
            let consider = match incoming {
                true => {
                    format!("plain data (no `mask:`), and a pad mask of `{s}` for `incoming_pads`")
                }
                false => "plain data (no `mask:`)".to_owned(),
            };
            found(
                format!("{flag}: a flag of some real items, not a mask of the real ones"),
                consider,
            );
        }
    }

    /// Whether items of `s` from `n` on are real by another semantic's ids: an item
    /// there owns one, or is owned (a flag's prefix, `is_protein`, is no pad mask).
    fn named_past(&self, s: &str, n: usize) -> bool {
        let owns = self
            .owned_by(s)
            .iter()
            .any(|(_, of)| of.iter().flatten().any(|&o| o >= n));
        // Pads all naming one owner out of order (a collator's 0) are pads of the map.
        let owned = self.owner_of.get(s).is_some_and(|of| {
            self.pads_named(s, n).is_none()
                && of.get(n..).is_some_and(|p| p.iter().any(Option::is_some))
        });
        owns || owned
    }

    /// The one owner every item of `s` from `n` on names, where it is out of their
    /// owners' order (before the owner of item `n - 1`): pads the map holds a value at
    /// (OpenFold3's collator pads `atom_to_token_index` with 0), not owned items.
    fn pads_named(&self, s: &str, n: usize) -> Option<usize> {
        let map = self.spec.semantics.get(s)?.owner.as_ref()?.source.map()?;
        let &(_, _, v) = self.given.get(map).filter(|g| g.1.shape.len() == 1)?;
        shows::pad_id(v, n).map(|p| p as usize)
    }

    /// Integer one-hot encodings and mostly-zero pair features declared dense.
    fn dense(
        &self,
        t: &TensorFeature,
        x: &Tensor,
        v: &[f64],
        found: &mut impl FnMut(String, String),
    ) {
        if !matches!(t.role, Role::Data) || t.one_hot.is_some() || t.sparse.is_some() {
            return;
        }
        let last = t.axes.len().wrapping_sub(1);
        let channel = t
            .axes
            .last()
            .is_some_and(|a| matches!(a.kind, AxisKind::Channel(c) if c > 1));
        let width = x.shape.last().copied().unwrap_or(0);
        if channel
            && t.axes.len() > 1
            && t.dtype.is_integer()
            && shows::one_hot_rows(v, width).is_some()
        {
            found(
                format!("every row along axis {last} holds one 1 (or none): a one-hot encoding over {width} classes, declared dense"),
                format!("`one_hot: {last}` (it travels as indices)"),
            );
            return;
        }
        let pair = matches!(t.axes.as_slice(), [a, b, ..] if a.semantic().is_some() && a.semantic() == b.semantic());
        let share = shows::nonzero_share(v);
        if pair && t.range.is_none() && share < shows::SPARSE_BELOW {
            found(
                format!(
                    "{:.2}% of its values are nonzero: a mostly-zero pair feature, declared dense",
                    100.0 * share
                ),
                "`sparse: true` (it travels as its nonzero entries)".to_owned(),
            );
        }
    }

    /// Index values outside the indexed items that no `none` declares.
    fn index_values(&self, t: &TensorFeature, v: &[f64], found: &mut impl FnMut(String, String)) {
        let Role::Index(ix) = &t.role else { return };
        let Some(items) = self.len(&ix.of).filter(|_| ix.one_hot.is_none()) else {
            return;
        };
        let Some((count, at, value)) = shows::outside(v, items, ix.none) else {
            return;
        };
        let consider = match value {
            x if x < 0.0 && x.fract() == 0.0 => {
                format!("`none: {x}` in its `index` (a value that names no item)")
            }
            _ => format!("another `of:` than `{}`, or a featurizer bug", ix.of),
        };
        found(
            format!("{count} of its values name no item of the {items} `{}` (the first, at flat position {at}: {value})", ix.of),
            consider,
        );
    }

    /// An owner id vector that names a real owner where the items' mask says pads (a
    /// collator's 0), where the spec does not say so (`map_pad`).
    fn map_pads(&self, out: &mut Vec<Finding>) {
        for (s, sem) in &self.spec.semantics {
            let Some(map) = sem.owner.as_ref().and_then(|o| o.source.map()) else {
                continue;
            };
            let Some(&(_, _, v)) = self.given.get(map).filter(|g| g.1.shape.len() == 1) else {
                continue;
            };
            let declared = sem.incoming.as_ref().and_then(|i| i.map_pad.map(|p| p.0));
            let Some((mask, n)) = self.pad_mask(s) else {
                continue;
            };
            let Some(id) = self
                .pads_named(s, n)
                .filter(|&id| Some(id as i64) != declared)
            else {
                continue;
            };
            let named = v.len() - n;
            let consider = format!("`incoming_pads: {{mask: {mask}, map_pad: {id}}}` on `{s}`");
            out.push(Finding {
                feature: map.to_owned(),
                at: self.spec.features[map].loc,
                shows: format!("`{mask}` is 0 on `{s}` {n} and after (pads at the end), but it names `{}` {id}, a real owner, at all {named} of them", self.owner_name(s).unwrap_or("its owner")),
                consider,
            });
        }
    }

    /// A 1-D mask over `s` that the sample gives with a prefix of 1s: its name and the
    /// prefix.
    fn pad_mask(&self, s: &str) -> Option<(&'a str, usize)> {
        self.given.iter().find_map(|(name, &(t, _, v))| {
            let over = matches!(t.axes.as_slice(), [a] if a.semantic() == Some(s));
            let mask = matches!(&t.role, Role::Mask { .. });
            (over && mask).then(|| Some((*name, shows::padded_prefix(v)?)))?
        })
    }
}
