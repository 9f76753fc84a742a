//! A map delivered in the other form than the sample gives it (`index: {deliver: ...}`):
//! the declared feature rewritten into the delivered one, which is what every later
//! step (inference, the plan, the executors) sees, with the given form kept beside it.

use crate::diag::SpecError;
use crate::ir::{Axis, AxisKind, CoShard, GivenForm, IndexScope, PadValue, Role, TensorFeature};
use crate::loc::Loc;
use crate::syntax::DeliverForm;

/// `t` as delivered in `form` (`ids` or `one_hot`), declared at `at`.
pub(crate) fn delivered(
    t: TensorFeature,
    form: &str,
    at: Loc,
) -> Result<TensorFeature, Box<SpecError>> {
    let Role::Index(ix) = &t.role else {
        return Err(Box::new(SpecError::new(
            "`deliver` applies to an index",
            at,
        )));
    };
    let one_hot_map = ix.one_hot == Some(1) && t.axes.len() == 2;
    let id_vector = ix.one_hot.is_none() && t.axes.len() == 1;
    let Some(wanted) = DeliverForm::parse(form) else {
        return Err(Box::new(
            SpecError::new(format!("unknown delivery form `{form}`"), at)
                .help("one of `ids` (an id vector per row), `one_hot` (a one-hot map)"),
        ));
    };
    match wanted {
        DeliverForm::Ids if id_vector => Ok(t),
        DeliverForm::OneHot if one_hot_map => Ok(t),
        DeliverForm::Ids if one_hot_map => Ok(as_ids(t)),
        DeliverForm::OneHot if id_vector => as_one_hot(t, at),
        _ => Err(Box::new(SpecError::new(
            format!("`deliver: {form}` changes the form of a map: a one-hot map `[rows, items]` (`one_hot: 1`) or an integer id vector `[rows]`"),
            at,
        ))),
    }
}

/// A one-hot map `[rows, items]` delivered as the `int64` id of each row's item, `-1`
/// for none: its owner axis and co-sharding go, pads are `-1`.
fn as_ids(mut t: TensorFeature) -> TensorFeature {
    t.given = Some(GivenForm::OneHot { dtype: t.dtype });
    t.axes.truncate(1);
    t.coshard.clear();
    t.dtype = crate::ir::DType::Int64;
    t.pad = PadValue::Int(GivenForm::NONE);
    if let Role::Index(ix) = &mut t.role {
        ix.one_hot = None;
        ix.none = Some(GivenForm::NONE);
    }
    t
}

/// An id vector `[rows]` delivered as the one-hot map `[rows, items]`, its item axis
/// co-sharded with its rows (a diagonal block on a tile, whole on one axis), so its
/// columns are shard-local.
fn as_one_hot(mut t: TensorFeature, at: Loc) -> Result<TensorFeature, Box<SpecError>> {
    let Role::Index(ix) = &mut t.role else {
        unreachable!("checked by the caller");
    };
    if !t.dtype.is_integer() {
        return Err(Box::new(SpecError::new(
            format!("an id vector is integers, not {}", t.dtype),
            t.dtype_loc,
        )));
    }
    if ix.scope != IndexScope::ShardLocal {
        return Err(Box::new(
            SpecError::new(
                format!(
                    "a one-hot map's columns are shard-local (a diagonal block on a tile); declared `scope: {}`",
                    ix.scope.name()
                ),
                at,
            )
            .help("declare `scope: shard_local`"),
        ));
    }
    t.given = Some(GivenForm::Ids {
        dtype: t.dtype,
        none: ix.none.take(),
    });
    ix.one_hot = Some(1);
    t.axes.push(Axis {
        kind: AxisKind::Semantic(ix.of.clone()),
        loc: at,
    });
    t.coshard = vec![CoShard {
        axis: 1,
        follows: 0,
        loc: at,
    }];
    t.pad = PadValue::Int(0);
    Ok(t)
}
