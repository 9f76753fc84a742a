//! The ownership forest, built once: every semantic's chain of owners, nearest first.
//!
//! [`crate::check`] proves the chains acyclic and bounded and reports where they are
//! not; everything after (the check of co-sharded pairs, the plan's roots, the plan's
//! semantic order) reads them from here instead of walking owners again. A walk stops
//! after as many steps as there are semantics, so a cycle that a check reports is
//! never followed forever.

use std::collections::BTreeMap;

use crate::ir::Spec;

/// Each semantic's owners, nearest first.
pub(crate) struct OwnerChains<'a> {
    chains: BTreeMap<&'a str, Vec<&'a str>>,
}

impl<'a> OwnerChains<'a> {
    /// The chains of a spec's semantics; an owner that is not declared ends a chain.
    pub fn of(spec: &'a Spec) -> Self {
        let owner_of = |name: &str| {
            let s = spec.semantics.get(name)?;
            let o = s.owner.as_ref()?;
            spec.semantics
                .get_key_value(&o.owner.name)
                .map(|(k, _)| k.as_str())
        };
        let chains = spec
            .semantics
            .keys()
            .map(|name| (name.as_str(), chain(name, owner_of, spec.semantics.len())))
            .collect();
        OwnerChains { chains }
    }

    /// `name`'s owners, nearest first.
    pub fn owners(&self, name: &str) -> &[&'a str] {
        self.chains.get(name).map_or(&[], Vec::as_slice)
    }

    /// Whether `owner` is an ancestor of `item`.
    pub fn owns(&self, owner: &str, item: &str) -> bool {
        self.owners(item).contains(&owner)
    }

    /// Whether one of `a` and `b` owns the other, or they are one semantic.
    pub fn related(&self, a: &str, b: &str) -> bool {
        a == b || self.owns(a, b) || self.owns(b, a)
    }
}

/// The owners of `start` by `owner_of`, nearest first, at most `bound` of them.
pub(crate) fn chain<'a>(
    start: &str,
    owner_of: impl Fn(&str) -> Option<&'a str>,
    bound: usize,
) -> Vec<&'a str> {
    let mut out: Vec<&'a str> = Vec::new();
    let mut cur = owner_of(start);
    while let Some(o) = cur {
        if out.len() >= bound {
            break;
        }
        out.push(o);
        cur = owner_of(o);
    }
    out
}
