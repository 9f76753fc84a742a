//! Synthetic serial samples for any plan: random values with consistent structure
//! (owner counts, owner maps, one-hot maps and index values that point at real items).
//!
//! For tests, benchmarks and examples; a real pipeline reads its featurizer's output.

use std::collections::BTreeMap;

use featshard_spec::ir::{GivenForm, OwnerSource, Role};
use featshard_spec::plan::{OwnedBy, Plan, TensorPlan};
use tch::{Device, Kind, Tensor};

use crate::error::{RuntimeError, TorchContext};
use crate::kind::kind_of;
use crate::sample::Features;

/// The shape of a synthetic sample.
#[derive(Clone, Debug, Default)]
pub struct Shape {
    /// Length of every semantic that is not owner-partitioned.
    pub sizes: BTreeMap<String, usize>,
    /// For owner-partitioned semantics with a `counts` source: items per direct owner.
    pub counts: BTreeMap<String, Vec<usize>>,
    /// For owner-partitioned semantics with a `map` source: how many items (each owned
    /// by an owner item spread evenly over the owner axis).
    pub mapped: BTreeMap<String, usize>,
}

impl Shape {
    /// A Boltz-2-shaped sample (`examples/boltz2.yaml`): one token per entry of
    /// `atoms_per_token` (its atom count), `msa` MSA rows, `rset` R-set rows (`None`:
    /// one per two tokens with atoms), 2 conformers, 1 distogram ensemble, 2 templates.
    pub fn boltz(atoms_per_token: Vec<usize>, msa: usize, rset: Option<usize>) -> Shape {
        let with_atoms = atoms_per_token.iter().filter(|&&c| c > 0).count();
        let sizes = [
            ("tokens", atoms_per_token.len()),
            ("msa", msa),
            ("ensemble", 2),
            ("disto_ensemble", 1),
            ("templates", 2),
        ];
        Shape {
            sizes: sizes.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            counts: [("atoms".to_owned(), atoms_per_token)].into(),
            mapped: [("rset".to_owned(), rset.unwrap_or(with_atoms.div_ceil(2)))].into(),
        }
    }

    /// The same shape with `semantic` (not owner-partitioned) `n` long.
    pub fn with(mut self, semantic: &str, n: usize) -> Shape {
        self.sizes.insert(semantic.to_owned(), n);
        self
    }
}

/// A random serial sample of `workflow` (all features for `None`) with this shape.
pub fn sample(
    plan: &Plan,
    workflow: Option<&str>,
    shape: &Shape,
    seed: i64,
) -> Result<Features, RuntimeError> {
    tch::manual_seed(seed);
    let mut sizes = shape.sizes.clone();
    let owner_of = owners_of_items(plan, shape, &mut sizes);
    let names = plan.feature_names(workflow)?;
    let mut out = Features::new();
    for name in names {
        let Some(t) = plan.tensor(name) else {
            continue;
        };
        // The pipeline makes derived features itself.
        if t.derived.is_some() {
            continue;
        }
        let dims: Vec<i64> = t
            .axes
            .iter()
            .map(|a| match (&a.semantic, a.size) {
                (Some(s), _) => sizes.get(s).copied().unwrap_or(0) as i64,
                (None, Some(n)) => n as i64,
                (None, None) => 0,
            })
            .collect();
        let kind = kind_of(t.dtype);
        let x = match (
            structured(plan, name, &dims, &owner_of, &sizes, kind)?,
            t.one_hot,
        ) {
            (Some(x), _) => x,
            (None, Some(axis)) => one_hot_classes(name, &dims, axis, kind)?,
            (None, None) => match t.range {
                Some([lo, hi]) => Tensor::f_randint_low(
                    lo,
                    hi.saturating_add(1),
                    dims.as_slice(),
                    (kind, Device::Cpu),
                )
                .feature(name)?,
                None if t.sparse => sparse(name, &t.role, &dims, kind, &sizes)?,
                None => random(name, &t.role, &dims, kind, &sizes)?,
            },
        };
        let x = match &t.given {
            Some(given) => in_given_form(name, t, given, x, &sizes)?,
            None => x,
        };
        out.insert(name.to_owned(), x);
    }
    Ok(out)
}

/// A map made in its delivered form, in the form the featurizer gives it: ids as a
/// one-hot map (a row of none all 0), or a one-hot map as ids (none where a row is 0).
fn in_given_form(
    name: &str,
    t: &TensorPlan,
    given: &GivenForm,
    x: Tensor,
    sizes: &BTreeMap<String, usize>,
) -> Result<Tensor, RuntimeError> {
    let Role::Index(ix) = &t.role else {
        return Ok(x);
    };
    match given {
        GivenForm::OneHot { dtype } => {
            let width = sizes.get(&ix.of).copied().unwrap_or(0) as i64;
            let ids = x.f_to_kind(Kind::Int64).feature(name)?;
            // Row `width` of a one-hot one wider is the none row, then cut off.
            let at = ids
                .f_where_scalarother(&ids.f_ge(0).feature(name)?, width)
                .feature(name)?;
            at.f_one_hot(width + 1)
                .and_then(|m| m.f_narrow(1, 0, width))
                .and_then(|m| m.f_to_kind(kind_of(*dtype)))
                .feature(name)
        }
        GivenForm::Ids { dtype, none } => {
            let any = x
                .f_ne(0)
                .and_then(|m| m.f_any_dim(1, false))
                .feature(name)?;
            let ids = x.f_argmax(1, false).feature(name)?;
            let none = Tensor::from(none.unwrap_or(0));
            ids.f_where_self(&any, &none)
                .and_then(|m| m.f_to_kind(kind_of(*dtype)))
                .feature(name)
        }
    }
}

/// The direct owner of every item of each owned semantic, its count set in `sizes`:
/// items spread over their owners by `shape`'s counts, or evenly for a map.
fn owners_of_items(
    plan: &Plan,
    shape: &Shape,
    sizes: &mut BTreeMap<String, usize>,
) -> BTreeMap<String, Vec<usize>> {
    let mut owner_of: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for sem in plan.semantic_order() {
        let Some(OwnedBy { owner, source, .. }) =
            plan.semantics.get(sem).and_then(|s| s.owned_by.as_ref())
        else {
            continue;
        };
        let by_counts = match source {
            OwnerSource::Counts { .. } => true,
            OwnerSource::Map { .. } => false,
            OwnerSource::CountsOrMap { .. } => shape.counts.contains_key(sem),
        };
        let owners = match by_counts {
            true => {
                let counts = shape.counts.get(sem).cloned().unwrap_or_default();
                counts
                    .iter()
                    .enumerate()
                    .flat_map(|(o, &c)| std::iter::repeat_n(o, c))
                    .collect::<Vec<_>>()
            }
            false => {
                let n = shape.mapped.get(sem).copied().unwrap_or(0);
                let owner_len = sizes.get(owner).copied().unwrap_or(0);
                if owner_len == 0 {
                    Vec::new()
                } else {
                    (0..n).map(|r| r * owner_len / n.max(1)).collect()
                }
            }
        };
        sizes.insert(sem.to_owned(), owners.len());
        owner_of.insert(sem.to_owned(), owners);
    }
    owner_of
}

/// Owner counts, owner maps and one-hot maps between an owner and its items; incoming
/// pad masks all ones.
fn structured(
    plan: &Plan,
    name: &str,
    dims: &[i64],
    owner_of: &BTreeMap<String, Vec<usize>>,
    sizes: &BTreeMap<String, usize>,
    kind: Kind,
) -> Result<Option<Tensor>, RuntimeError> {
    if plan
        .semantics
        .values()
        .any(|s| s.incoming.as_ref().is_some_and(|i| i.feature() == name))
    {
        // Every item of a synthetic sample is real.
        return Tensor::f_ones(dims, (kind, Device::Cpu))
            .feature(name)
            .map(Some);
    }
    for (sem, s) in &plan.semantics {
        let Some(OwnedBy { owner, source, .. }) = &s.owned_by else {
            continue;
        };
        let is_counts = source.counts() == Some(name);
        if !is_counts && source.map() != Some(name) {
            continue;
        }
        let owners = &owner_of[sem];
        return Ok(Some(match is_counts {
            true => {
                let mut counts = vec![0i64; sizes.get(owner).copied().unwrap_or(0)];
                for &o in owners {
                    counts[o] += 1;
                }
                Tensor::from_slice(&counts).f_to_kind(kind).feature(name)?
            }
            false if dims.len() == 1 => ids(name, owners, kind)?,
            false => one_hot(name, dims, owners.iter().copied().enumerate(), kind)?,
        }));
    }
    index_feature(plan, name, dims, owner_of, kind)
}

/// Index features over owned semantics: ids of each item's owner or each owner's first
/// item, as an id vector or a one-hot map.
fn index_feature(
    plan: &Plan,
    name: &str,
    dims: &[i64],
    owner_of: &BTreeMap<String, Vec<usize>>,
    kind: Kind,
) -> Result<Option<Tensor>, RuntimeError> {
    let Some(t) = plan.tensor(name) else {
        return Ok(None);
    };
    let Role::Index(ix) = &t.role else {
        return Ok(None);
    };
    // An id vector of the items' owner (AlphaFold3's `atom_to_token_idx`), or of each
    // row's first item (none for a row without one).
    if let ([a], None) = (t.axes.as_slice(), ix.one_hot) {
        let row_sem = a.semantic.as_deref().unwrap_or_default();
        if let Some(chain) = owner_chain(plan, row_sem, &ix.of, owner_of) {
            return ids(name, &chain, kind).map(Some);
        }
        let (Some(none), Some(chain)) = (ix.none, owner_chain(plan, &ix.of, row_sem, owner_of))
        else {
            return Ok(None);
        };
        let mut first = vec![none; dims.first().copied().unwrap_or(0) as usize];
        for (item, &o) in chain.iter().enumerate().rev() {
            first[o] = item as i64;
        }
        return Tensor::from_slice(&first)
            .f_to_kind(kind)
            .feature(name)
            .map(Some);
    }
    let (Some(hot), 2) = (ix.one_hot, t.axes.len()) else {
        return Ok(None);
    };
    let row_sem = t.axes[1 - hot].semantic.as_deref().unwrap_or_default();
    // Rows owned by the indexed semantic: each row points at its owner.
    if let Some(chain) = owner_chain(plan, row_sem, &ix.of, owner_of) {
        let pairs = chain.into_iter().enumerate();
        return one_hot(name, dims, pairs, kind).map(Some);
    }
    // Rows that own the indexed items: each row points at its first item, if any.
    if let Some(chain) = owner_chain(plan, &ix.of, row_sem, owner_of) {
        let mut first: BTreeMap<usize, usize> = BTreeMap::new();
        for (item, &o) in chain.iter().enumerate() {
            first.entry(o).or_insert(item);
        }
        return one_hot(name, dims, first.into_iter(), kind).map(Some);
    }
    Ok(None)
}

/// For every item of `item`, its (transitive) owner in `owner`, if `owner` owns `item`.
fn owner_chain(
    plan: &Plan,
    item: &str,
    owner: &str,
    owner_of: &BTreeMap<String, Vec<usize>>,
) -> Option<Vec<usize>> {
    let mut map: Vec<usize> = owner_of.get(item)?.clone();
    let mut cur = item;
    loop {
        let OwnedBy { owner: next, .. } =
            plan.semantics.get(cur).and_then(|s| s.owned_by.as_ref())?;
        if next == owner {
            return Some(map);
        }
        let up = owner_of.get(next.as_str())?;
        map = map.iter().map(|&o| up[o]).collect();
        cur = next;
    }
}

fn ids(name: &str, ids: &[usize], kind: Kind) -> Result<Tensor, RuntimeError> {
    let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    Tensor::from_slice(&ids).f_to_kind(kind).feature(name)
}

fn one_hot(
    name: &str,
    dims: &[i64],
    hot: impl Iterator<Item = (usize, usize)>,
    kind: Kind,
) -> Result<Tensor, RuntimeError> {
    let (rows, cols): (Vec<i64>, Vec<i64>) = hot.map(|(r, c)| (r as i64, c as i64)).unzip();
    let mut m = Tensor::f_zeros(dims, (kind, Device::Cpu)).feature(name)?;
    if !rows.is_empty() {
        let ones = Tensor::f_ones([rows.len() as i64], (kind, Device::Cpu)).feature(name)?;
        let idx = [
            Some(Tensor::from_slice(&rows)),
            Some(Tensor::from_slice(&cols)),
        ];
        let _ = m.f_index_put_(&idx, &ones, false).feature(name)?;
    }
    Ok(m)
}

/// A one-hot feature along `axis`: each row one random class, or none (a pad row) about
/// once in as many rows as there are classes.
fn one_hot_classes(
    name: &str,
    dims: &[i64],
    axis: usize,
    kind: Kind,
) -> Result<Tensor, RuntimeError> {
    let classes = dims[axis];
    let mut rows = dims.to_vec();
    rows.remove(axis);
    Tensor::f_randint_low(0, classes + 1, rows.as_slice(), (Kind::Int64, Device::Cpu))
        .and_then(|i| i.f_one_hot(classes + 1))
        .and_then(|h| h.f_narrow(-1, 0, classes))
        .and_then(|h| h.f_movedim(&[-1i64][..], &[axis as i64][..]))
        .and_then(|h| h.f_to_kind(kind))
        .and_then(|h| h.f_contiguous())
        .feature(name)
}

/// A sparse feature: random values at about one element in a hundred, zeros elsewhere.
fn sparse(
    name: &str,
    role: &Role,
    dims: &[i64],
    kind: Kind,
    sizes: &BTreeMap<String, usize>,
) -> Result<Tensor, RuntimeError> {
    let values = random(name, role, dims, kind, sizes)?;
    Tensor::f_rand(dims, (Kind::Float, Device::Cpu))
        .and_then(|r| r.f_lt(0.01))
        .and_then(|keep| values.f_mul(&keep.f_to_kind(kind)?))
        .feature(name)
}

fn random(
    name: &str,
    role: &Role,
    dims: &[i64],
    kind: Kind,
    sizes: &BTreeMap<String, usize>,
) -> Result<Tensor, RuntimeError> {
    let opts = (Kind::Float, Device::Cpu);
    match role {
        Role::Index(ix) if ix.one_hot.is_none() => {
            let n = sizes.get(&ix.of).copied().unwrap_or(0).max(1) as i64;
            Tensor::f_randint_low(0, n, dims, (kind, Device::Cpu)).feature(name)
        }
        Role::Mask { .. } | Role::Index(_) => Tensor::f_rand(dims, opts)
            .and_then(|r| r.f_gt(0.3))
            .and_then(|b| b.f_to_kind(kind))
            .feature(name),
        Role::Data => match kind {
            Kind::Bool => Tensor::f_rand(dims, opts)
                .and_then(|r| r.f_gt(0.5))
                .feature(name),
            Kind::Half | Kind::BFloat16 | Kind::Float | Kind::Double => Tensor::f_rand(dims, opts)
                .and_then(|r| r.f_add_scalar(0.5))
                .and_then(|r| r.f_to_kind(kind))
                .feature(name),
            _ => Tensor::f_randint_low(1, 7, dims, (kind, Device::Cpu)).feature(name),
        },
    }
}
