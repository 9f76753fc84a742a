"""Boltz-shaped serial samples built from the generated module's tables."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch


def random_sample(
    placements: ModuleType,
    n_tokens: int,
    seed: int,
    *,
    atoms_per_token: tuple[int, int] = (0, 5),
    msa_rows: int = 5,
    templates: int = 2,
    ensemble: int = 2,
    sparse_density: float = 0.05,
) -> dict[str, torch.Tensor]:
    """A Boltz-shaped serial sample: uneven atoms per token, zero-atom tokens, an R-set;
    sparse features nonzero at `sparse_density` of their elements (real samples: 0.5%)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(atoms_per_token[0], atoms_per_token[1], (n_tokens,), generator=g)
    if n_tokens > 1:
        counts[0] = 0  # a zero-atom token
    counts[-1] = max(int(counts[-1]), 1)
    n_atoms = int(counts.sum())
    token_of_atom = torch.arange(n_tokens).repeat_interleave(counts)
    with_atoms = [t for t in range(n_tokens) if int(counts[t]) > 0]
    first_atom = torch.cumsum(counts, 0) - counts
    rset_tokens = with_atoms[::2]
    lengths = {"tokens": n_tokens, "atoms": n_atoms, "rset": len(rset_tokens), "msa": msa_rows,
               "ensemble": ensemble, "disto_ensemble": 1, "templates": templates}
    # Constraint lists have lengths of their own; one of them is empty.
    for i, sem in enumerate(s for s, info in placements.SEMANTICS.items() if s not in lengths):
        lengths[sem] = 0 if i == 0 else 1 + i % 3
    incoming_masks = {i[1] for i in (info.incoming for info in placements.SEMANTICS.values())
                      if i is not None and i[0] == "mask"}
    sample: dict[str, torch.Tensor] = {}
    for name in sorted(placements.WORKFLOWS["inference"]):
        if name in placements.METADATA_FEATURES or name in placements.DERIVED:
            continue  # metadata is not a tensor; the pipeline makes derived features
        axes = placements.FEATURE_AXIS_SEMANTICS[name]
        shape = [lengths[s] if s is not None else int(c)
                 for s, c in zip(axes, placements.CHANNEL_SIZES[name])]
        dtype = placements.DTYPES[name]
        role = placements.INDEX_FEATURES.get(name)
        if name in incoming_masks:
            x = torch.ones(shape, dtype=dtype)  # every item is real
        elif role is not None and role.one_hot is None and role.of == "atoms":
            x = torch.randint(0, max(n_atoms, 1), shape, generator=g, dtype=dtype)
        elif name in placements.ONE_HOT:
            x = one_hot_rows(shape, placements.ONE_HOT[name], dtype, g)
        elif dtype == torch.bool or name in placements.MASKS:
            x = (torch.rand(shape, generator=g) > 0.5).to(dtype)
        elif name in placements.RANGES:
            lo, hi = placements.RANGES[name]
            x = torch.randint(lo, hi + 1, shape, generator=g, dtype=dtype)
        elif dtype.is_floating_point:
            x = torch.rand(shape, generator=g, dtype=torch.float64).to(dtype) + 0.5
        else:
            x = torch.randint(1, 7, shape, generator=g, dtype=dtype)
        if name in placements.SPARSE:
            x = x * (torch.rand(shape, generator=g) < sparse_density).to(dtype)  # mostly zero, as bonds are
        sample[name] = x
    sample["atom_counts_per_token"] = counts
    sample["token_index"] = torch.arange(n_tokens)
    sample["residue_index"] = torch.randint(0, n_tokens, (n_tokens,), generator=g)
    sample["atom_to_token"] = torch.nn.functional.one_hot(token_of_atom, n_tokens).to(torch.int64)
    rep = torch.zeros(n_tokens, n_atoms, dtype=torch.int64)
    for t in with_atoms:
        rep[t, int(first_atom[t])] = 1
    sample["token_to_rep_atom"] = rep
    r = torch.zeros(len(rset_tokens), n_atoms, dtype=torch.int64)
    for i, t in enumerate(rset_tokens):
        r[i, int(first_atom[t])] = 1
    sample["r_set_to_rep_atom"] = r
    sample["frames_idx"] = torch.randint(0, max(n_atoms, 1), (ensemble, n_tokens, 3), generator=g)
    return sample


def one_hot_rows(shape: list[int], axis: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """A one-hot feature along `axis`: each row one random class, or none (a pad row)."""
    classes = shape[axis]
    rows = shape[:axis] + shape[axis + 1 :]
    idx = torch.randint(0, classes + 1, rows, generator=g)
    return torch.nn.functional.one_hot(idx, classes + 1)[..., :classes].movedim(-1, axis).to(dtype).contiguous()


REAL = Path(__file__).resolve().parents[1] / "data" / "real"
REAL_NAMES = ("prot60_nomsa", "prot60_smiles", "boltz_cp/prot60_nomsa", "boltz_cp/prot60_smiles")


def real_samples() -> list[dict[str, torch.Tensor]]:
    """The real Boltz-2 featurizer samples of tests/data/real, as emitted."""
    from safetensors.torch import load_file

    return [load_file(str(REAL / f"{name}.safetensors")) for name in REAL_NAMES]


ONE_HOT = ("res_type", "disto_target", "contact_conditioning", "ref_element", "ref_atom_name_chars",
           "atom_backbone_feat", "template_restype")
# One-hot maps: each row's 1 marks the item it points at.
ONE_HOT_MAPS = ("atom_to_token", "token_to_rep_atom", "r_set_to_rep_atom")


def as_indices(sample: dict[str, torch.Tensor], dtype: torch.dtype = torch.int16) -> dict[str, torch.Tensor]:
    """The sample as a featurizer that skips its final one-hot calls emits it: each
    declared one-hot feature as each row's class, each one-hot map as each row's item,
    -1 for a row with none."""
    out = dict(sample)
    for name in ONE_HOT + ONE_HOT_MAPS:
        x = sample[name]
        out[name] = torch.where(x.sum(-1) == 1, x.argmax(-1), -1).to(dtype)
    return out


# Masks (validated 0 or 1) a featurizer may emit as bool, and ranged ids it may emit as
# uint8: `msa` in [0, 32], `mol_type` in [0, 3].
MASKS = ("msa_mask", "affinity_token_mask", "atom_pad_mask", "template_mask", "template_mask_cb",
         "template_mask_frame", "token_disto_mask", "token_pad_mask", "token_resolved_mask", "pair_mask")
RANGED = ("msa", "mol_type")


def as_narrow(sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The sample with its masks as bool and its ranged ids as uint8, the narrowest types
    that hold their values (a featurizer that skips its final casts emits them so)."""
    out = dict(sample)
    for name in MASKS:
        if name in out:
            out[name] = out[name].bool()
    for name in RANGED:
        out[name] = out[name].to(torch.uint8)
    return out


SPARSE = ("token_bonds", "type_bonds", "contact_threshold")


def as_elements(sample: dict[str, torch.Tensor], *, pairs: bool = False) -> dict[str, torch.Tensor]:
    """The sample's sparse features as their nonzero elements: a
    ``torch.sparse_coo_tensor`` each, or (``pairs``, as a safetensors file holds them)
    ``NAME.indices`` and ``NAME.values``."""
    out = dict(sample)
    for name in SPARSE:
        coo = out.pop(name).to_sparse()
        if pairs:
            out[f"{name}.indices"], out[f"{name}.values"] = coo.indices(), coo.values()
        else:
            out[name] = coo
    return out
