"""A featurizer's nested feature dicts (``{"constraint_feature": {"contact": x}}``) and
the spec's paths for their features (``constraint_feature.contact``): flattened on the
way in, nested again on the way out. Only a dict on the path of a feature the spec
declares is opened; every other value is kept as it is. The names are the spec's: this
module moves keys, it decides nothing about a feature."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from featshard import _native

__all__ = ["flat", "nested"]

# What joins a nested feature's path: the spec's, read from the native module.
SEP = _native.PATH


class _Named(Protocol):
    @property
    def features(self) -> Mapping[str, Any]: ...


def _dicts(plan: _Named) -> set[str]:
    """Every dict a feature's path goes through (``a`` and ``a.b`` for ``a.b.c``)."""
    out: set[str] = set()
    for name in plan.features:
        parts = name.split(SEP)
        out.update(SEP.join(parts[:k]) for k in range(1, len(parts)))
    return out


def flat(plan: _Named, features: Mapping[str, Any]) -> Mapping[str, Any]:
    """``features`` with each nested dict on a spec feature's path replaced by its
    entries, keyed by their paths; ``features`` itself when the spec has no paths."""
    dicts = _dicts(plan)
    if not dicts or not isinstance(features, Mapping):
        return features
    out: dict[Any, Any] = {}

    given: dict[Any, str] = {}

    def walk(d: Mapping[Any, Any], path: str) -> None:
        for k, v in d.items():
            key = f"{path}{SEP}{k}" if path else k
            if isinstance(k, str) and isinstance(v, Mapping) and key in dicts:
                walk(v, key)
                continue
            # A nested value and a flat key of one path: which is meant is not ours to guess.
            where = f"`{k}` in the dict `{path}`" if path else f"`{key}`"
            if key in given:
                raise ValueError(f"feature `{key}`: given twice, as {given[key]} and {where}: give it once")
            given[key], out[key] = where, v

    walk(features, "")
    return out


def nested(plan: _Named, features: Mapping[str, Any]) -> dict[str, Any]:
    """``features`` with each spec feature named by a path put back in its nested dict,
    as the featurizer emitted it and the model reads it."""
    out: dict[str, Any] = {}
    for name, x in features.items():
        parts = name.split(SEP) if name in plan.features else [name]
        into = out
        for k, part in enumerate(parts[:-1]):
            into = into.setdefault(part, {})
            if not isinstance(into, dict):
                raise TypeError(f"`{SEP.join(parts[:k + 1])}` holds feature `{name}`, but is a value of its own")
        into[parts[-1]] = x
    return out
