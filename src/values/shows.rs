//! What a feature's values show, read the same way by `init` (what it proposes) and by
//! `validate --features` (what it finds against a spec): a mask of real items, a
//! one-hot encoding, ids of another semantic's items, a mostly-zero feature.
//!
//! Every reader takes values as `f64` (exact for integers below 2^53) and the shape
//! they came in, and says only what the values are consistent with: a name or a
//! declaration decides what a feature is, the values whether that can be so.

/// A pair feature under this share of nonzero values is mostly zero: it travels as its
/// entries (bonds of a small sample are over 1%; a pair of token ids and a value beat
/// dense bytes up to about a third).
pub const SPARSE_BELOW: f64 = 0.05;

/// A name that says a flag of some items (`is_protein`, `has_frame`), not a mask of
/// the real ones, whatever its values.
pub fn is_flag(name: &str) -> bool {
    name.starts_with("is_") || name.starts_with("has_")
}

/// Whether every value is 0 or 1.
pub fn zero_one(v: &[f64]) -> bool {
    v.iter().all(|&x| x == 0.0 || x == 1.0)
}

/// How many leading ones a 0/1 vector has, when there is at least one, every later
/// value is 0 and there is a 0: the values of a mask over real items that come first,
/// then pads.
pub fn padded_prefix(v: &[f64]) -> Option<usize> {
    let n = v.iter().take_while(|&&x| x == 1.0).count();
    (n > 0 && n < v.len() && v[n..].iter().all(|&x| x == 0.0)).then_some(n)
}

/// The first 0 after which a 1 follows: where a 0/1 vector is no mask of a prefix (a
/// flag of some items: `is_protein`, `ref_mask`).
pub fn zero_before_one(v: &[f64]) -> Option<usize> {
    let first_zero = v.iter().position(|&x| x == 0.0)?;
    v[first_zero..].contains(&1.0).then_some(first_zero)
}

/// Whether the rows of `width` values are one-hot along them: 0/1, at most one 1 a row
/// (a row of none is a pad), and a 1 somewhere. Returns how many rows hold a 1.
pub fn one_hot_rows(v: &[f64], width: usize) -> Option<usize> {
    if width == 0 || !zero_one(v) || !v.contains(&1.0) {
        return None;
    }
    let mut owned = 0;
    for row in v.chunks_exact(width) {
        match row.iter().filter(|&&x| x == 1.0).count() {
            0 => {}
            1 => owned += 1,
            _ => return None,
        }
    }
    Some(owned)
}

/// The share of nonzero values.
pub fn nonzero_share(v: &[f64]) -> f64 {
    match v.len() {
        0 => 1.0,
        n => v.iter().filter(|&&x| x != 0.0).count() as f64 / n as f64,
    }
}

/// Whether an integer vector holds an owner id per item (AlphaFold3's
/// `atom_to_token_idx`): every value an owner of `owners` or -1, in owner order from
/// owner 0 to the last.
pub fn owner_ids(v: &[f64], owners: usize) -> bool {
    let owned: Vec<f64> = v.iter().copied().filter(|&x| x != -1.0).collect();
    owned.first() == Some(&0.0)
        && owned.last() == Some(&(owners as f64 - 1.0))
        && owned.windows(2).all(|w| w[0] <= w[1])
        && owned.iter().all(|&x| x.fract() == 0.0 && x < owners as f64)
}

/// Owner ids per item (as [`owner_ids`]) whose items may end in pads the featurizer
/// gave one owner's id out of order (OpenFold3's collator pads `atom_to_token_index`
/// with 0): the real items' count, and the pads' id where there are pads.
pub fn owner_ids_padded(v: &[f64], owners: usize) -> Option<(usize, Option<f64>)> {
    if owner_ids(v, owners) {
        return Some((v.len(), None));
    }
    let &last = v.last()?;
    let real = v.len() - v.iter().rev().take_while(|&&x| x == last).count();
    let pad = pad_id(v, real)?;
    owner_ids(&v[..real], owners).then_some((real, Some(pad)))
}

/// The one id every item of an owner id vector holds from `real` on, where it is out
/// of the owners' order (below item `real - 1`'s): the value a collator pads the vector
/// with (OpenFold3's 0), not owners of real items.
pub fn pad_id(v: &[f64], real: usize) -> Option<f64> {
    let (&before, past) = (v.get(real.checked_sub(1)?)?, v.get(real..)?);
    let &pad = past.first()?;
    (pad >= 0.0 && pad < before && past.iter().all(|&x| x == pad)).then_some(pad)
}

/// Each item's owner, from owner ids per item (-1: none).
pub fn owners_of_ids(v: &[f64]) -> Vec<Option<usize>> {
    v.iter()
        .map(|&x| (x >= 0.0).then_some(x as usize))
        .collect()
}

/// Each item's owner, from the items each owner holds, in order; `None` when they
/// hold more than `items` (counts that cannot be the sample's, never allocated).
pub fn owners_of_counts(counts: &[f64], items: usize) -> Option<Vec<Option<usize>>> {
    let total: f64 = counts.iter().map(|&c| c.max(0.0)).sum();
    if total > items as f64 {
        return None;
    }
    Some(
        counts
            .iter()
            .enumerate()
            .flat_map(|(o, &c)| std::iter::repeat_n(Some(o), c.max(0.0) as usize))
            .collect(),
    )
}

/// Whether a vector over owners holds each owner's first item (OpenFold3's
/// `start_atom_index`): owner `t`'s value is an item `t` owns whose previous item `t`
/// does not, for every owner that owns an item (`owner_of`: each item's owner); at
/// least two owners do (one owner's first item 0 shows nothing), and they come first
/// (real owners, then pads): owners of a few items each (atoms owning R-set rows) show
/// nothing of the rest.
pub fn first_items(v: &[f64], owner_of: &[Option<usize>]) -> bool {
    let owning = owner_of.iter().flatten().max().map_or(0, |&m| m + 1);
    // Owners past the vector's are no owners of it (and never allocated for).
    if owning > v.len() {
        return false;
    }
    let mut seen = vec![false; owning];
    owner_of.iter().flatten().for_each(|&o| seen[o] = true);
    if seen.contains(&false) {
        return false;
    }
    let mut told = 0;
    for (t, &x) in v.iter().enumerate() {
        let owns = owner_of.contains(&Some(t));
        if !owns {
            continue;
        }
        let i = x as usize;
        let first = x >= 0.0
            && x.fract() == 0.0
            && owner_of.get(i) == Some(&Some(t))
            && (i == 0 || owner_of[i - 1] != Some(t));
        if !first {
            return false;
        }
        told += 1;
    }
    told >= 2
}

/// Whether `[owners, k]` integer values name items (or -1), some of them the row's own
/// owner's (a frame's atoms: `frame_atom_index`), and at least one names an item.
pub fn own_item_ids(v: &[f64], k: usize, owner_of: &[Option<usize>]) -> bool {
    if k == 0 || v.iter().all(|&x| x == -1.0) {
        return false;
    }
    let ids = v
        .iter()
        .all(|&x| x == -1.0 || (x >= 0.0 && x.fract() == 0.0 && (x as usize) < owner_of.len()));
    ids && v
        .iter()
        .enumerate()
        .any(|(i, &x)| x >= 0.0 && owner_of[x as usize] == Some(i / k))
}

/// What an integer feature over owners holds of the items they own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemIds {
    /// `[owners]`: each owner's first item (`start_atom_index`).
    First,
    /// `[owners, k]`: ids of items, some of the row's own owner's (`frame_atom_index`);
    /// `none`: -1 names no item.
    Own { none: bool },
}

/// Whether an integer feature over the owners of `items` (`owner_of`: each item's
/// owner) holds ids of their items: each owner's first item, by its values alone; or,
/// `[owners, k]` named for the items (`*atom*_index`), ids some of which are the own
/// owner's.
pub fn item_ids(
    name: &str,
    items: &str,
    shape: &[usize],
    v: &[f64],
    owner_of: &[Option<usize>],
) -> Option<ItemIds> {
    let stem = items.strip_suffix('s').unwrap_or(items);
    let named = name.contains(stem) && (name.ends_with("_index") || name.ends_with("_idx"));
    match shape {
        [_] => first_items(v, owner_of).then_some(ItemIds::First),
        [_, k] if named && own_item_ids(v, *k, owner_of) => Some(ItemIds::Own {
            none: v.contains(&-1.0),
        }),
        _ => None,
    }
}

/// Values outside `[0, items)` of an index feature, but `none`: how many, and the
/// first (its flat position and value).
pub fn outside(v: &[f64], items: usize, none: Option<i64>) -> Option<(usize, usize, f64)> {
    let out = |x: f64| {
        !(x >= 0.0 && x < items as f64) && Some(x as i64) != none.filter(|_| x.fract() == 0.0)
    };
    let first = v.iter().position(|&x| out(x))?;
    Some((v.iter().filter(|&&x| out(x)).count(), first, v[first]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_mask_a_flag_and_a_full_mask() {
        assert_eq!(padded_prefix(&[1.0, 1.0, 0.0]), Some(2));
        assert_eq!(padded_prefix(&[1.0, 1.0]), None);
        assert_eq!(zero_before_one(&[1.0, 0.0, 1.0]), Some(1));
        assert_eq!(zero_before_one(&[1.0, 1.0, 0.0]), None);
    }

    #[test]
    fn owner_ids_first_items_and_frames() {
        let ids = [0.0, 0.0, 1.0, 1.0, 1.0, 2.0];
        assert!(owner_ids(&ids, 3));
        assert!(!owner_ids(&ids, 4), "the last owner owns nothing");
        assert!(!owner_ids(&[1.0, 2.0], 3), "ids from 1 are no owner ids");
        let collated = [0.0, 1.0, 2.0, 2.0, 0.0, 0.0];
        assert_eq!(owner_ids_padded(&collated, 3), Some((4, Some(0.0))));
        assert_eq!(owner_ids_padded(&ids, 3), Some((6, None)));
        assert_eq!(owner_ids_padded(&[0.0, 1.0, 2.0, 2.0], 4), None);
        assert_eq!(pad_id(&collated, 4), Some(0.0));
        assert_eq!(
            pad_id(&[0.0, 1.0, 2.0, 3.0], 3),
            None,
            "a real owner in order"
        );
        let owner_of = owners_of_ids(&ids);
        assert_eq!(
            Some(owner_of.clone()),
            owners_of_counts(&[2.0, 3.0, 1.0], 6)
        );
        assert_eq!(
            owners_of_counts(&[1e18, 1.0], 6),
            None,
            "counts past the items"
        );
        assert!(
            !first_items(&[0.0, 1.0], &[Some(0), Some(1 << 40)]),
            "an owner past the vector"
        );
        assert!(first_items(&[0.0, 2.0, 5.0], &owner_of));
        assert!(!first_items(&[0.0, 1.0, 2.0], &owner_of), "serial numbers");
        assert!(own_item_ids(
            &[0.0, 1.0, -1.0, 2.0, 3.0, 4.0],
            3,
            &owner_of[..5]
        ));
        assert!(!own_item_ids(&[-1.0, -1.0], 2, &owner_of));
    }

    #[test]
    fn values_outside_the_items_but_none() {
        assert_eq!(outside(&[0.0, -1.0, 3.0], 3, None), Some((2, 1, -1.0)));
        assert_eq!(outside(&[0.0, -1.0, 2.0], 3, Some(-1)), None);
    }
}
