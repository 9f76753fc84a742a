"""Every rank's blocks of a sample, made by featshard's byte executor on torch tensors.

The sample is validated and placed in Rust (the executor ``featshard shard`` and the
tch runtime share), reading the tensors' own memory through DLPack; each block is then
written straight into a tensor allocated for it: no padded copy of the sample,
features shared out over ``threads`` threads. The interpreter's lock stays held while
the sample's tensors are read, and each tensor's storage is checked to still hold them
first: a tensor resized or freed after placing raises ``ValueError``, never a read of
freed memory. Every number
(padded lengths, owner blocks, windows, shard-local shifts) comes from the spec crate.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.utils.dlpack import from_dlpack

from featshard import Layout, Plan, _native, paths

__all__ = ["Placement", "Slot", "Wire", "buffer_views", "dtype_name", "expand", "expand_block", "expand_on_device", "place", "rank_blocks", "release_buffers", "torch_dtype", "view_at"]

# The spec's dtypes, by the names the spec and the executor use.
_DTYPES: dict[torch.dtype, str] = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
_BY_NAME = {name: dtype for dtype, name in _DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The name the spec and the executor give ``dtype`` (torch's own name for one the
    spec has no name for, which the executor then refuses by name)."""
    return _DTYPES.get(dtype, str(dtype).removeprefix("torch."))


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a spec dtype name (as the executor's slots and tables give it)."""
    return _BY_NAME[name]

# Every rank's buffer of a placement: where each block lies, what it holds and how a
# compact block expands (the executor's contract, read from it, never computed here).
Wire = _native.BufferLayout
Slot = _native.Slot


def _value(x: Any) -> Any:
    """A tensor's DLPack capsule (on the CPU, contiguous, its values resolved), else what
    the value is (a description the executor refuses by feature name)."""
    if not isinstance(x, torch.Tensor):
        return type(x).__name__
    foreign = _foreign(x)
    if foreign is not None:
        return foreign
    if x.dtype not in _DTYPES:
        return str(x.dtype).removeprefix("torch.")
    if x.is_meta:
        return "a meta tensor (no data)"
    if x.layout != torch.strided:
        return f"a {str(x.layout).removeprefix('torch.')} tensor (make it dense: .to_dense())"
    y = _resolved(x.detach().cpu()).contiguous()
    # The storage goes along: the executor checks it still holds the tensor before
    # every read (a tensor resized or freed since would otherwise be freed memory).
    return (y.__dlpack__(), y.untyped_storage())


def _foreign(x: torch.Tensor) -> str | None:
    """What a tensor is when its memory is not its values: a DTensor (a rank's block of
    a distributed tensor), or any other tensor subclass that overrides torch's
    dispatch (a wrapper with no plain storage); None for a plain tensor."""
    from torch.distributed.tensor import DTensor

    if isinstance(x, DTensor):
        return "a DTensor (a distributed tensor's block: give the serial sample, e.g. .full_tensor())"
    dispatch = getattr(type(x), "__torch_dispatch__", None)
    if dispatch is not None and dispatch is not getattr(torch.Tensor, "__torch_dispatch__", None):
        return f"a {type(x).__name__} (a tensor subclass without plain memory: give a torch.Tensor)"
    return None


def _resolved(x: torch.Tensor) -> torch.Tensor:
    """``x`` with its values in its memory: torch's lazy marks (the negative bit of
    ``_neg_view`` and of ``.conj().imag``, the conjugate bit) applied, a zero tensor
    made. Its memory is read as bytes, and a mark left would send the unmarked values."""
    if x._is_zerotensor():
        return torch.zeros(x.shape, dtype=x.dtype)
    return x.resolve_conj().resolve_neg()


class Placement:
    """One sample validated and placed on a CP mesh. Its tensors are read when blocks
    are written: do not write or resize them while the placement is in use."""

    def __init__(self, plan: Plan, native: _native.Placement, sample: Mapping[str, Any]) -> None:
        self._plan = plan
        self._native = native
        found = native.features()
        self._features = {n: (_BY_NAME[d], tuple(s)) for n, d, s, _ in found}
        self.global_shapes: dict[str, tuple[int, ...]] = {n: tuple(g) for n, _, _, g in found}
        """Every placed feature's padded global shape (what its DTensor reports)."""
        self.passthrough: dict[str, Any] = {n: sample[n] for n in native.passthrough()}
        """Sample values carried along untouched (metadata, passed-through keys)."""

    @property
    def layout(self) -> Layout:
        """Padded lengths and owner-block positions of the sample on its mesh."""
        result: Layout = self._native.layout()
        return result

    @property
    def features(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """Every placed feature's dtype and block shape, by name."""
        return dict(self._features)

    def empty_blocks(self, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        """Uninitialised tensors for one rank's blocks (every placed feature by default)."""
        chosen = self._features if names is None else {n: self._features[n] for n in names}
        return {n: torch.empty(s, dtype=d) for n, (d, s) in chosen.items()}

    def write_blocks(
        self, coord: tuple[int, ...], outs: Mapping[str, torch.Tensor], threads: int = 1
    ) -> None:
        """Writes the blocks of the rank at CP coordinate ``coord`` into ``outs``
        (contiguous CPU tensors of each block's dtype and shape)."""
        capsules = [(n, t.__dlpack__()) for n, t in outs.items()]
        self._native.write_blocks(coord, capsules, threads)

    def blocks_at(self, coord: tuple[int, ...], threads: int = 1) -> dict[str, torch.Tensor]:
        """The blocks of the rank at ``coord``, each in a tensor of its own: on a
        domain-parallel plan, whose ranks' blocks differ in shape, that rank's shapes."""
        out = self._empty(dict(self._native.block_shapes(coord)))
        self.write_blocks(coord, out, threads)
        return out

    def padded(self, threads: int = 1, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        """Every placed feature's whole padded layout (or the named ones'): what all
        ranks' blocks make together, index values in the padded layout, shard-local ids
        not yet shifted."""
        chosen = None if names is None else set(names)
        shapes = self._native.whole_shapes()
        out = self._empty({n: padded for n, padded, _ in shapes if chosen is None or n in chosen})
        self._native.write_padded([(n, t.__dlpack__()) for n, t in out.items()], threads)
        return out

    def serial(self, threads: int = 1) -> dict[str, torch.Tensor]:
        """Every placed feature as intake made it: real items only, derived features
        made, index values as the sample gave them."""
        out = self._empty({n: serial for n, _, serial in self._native.whole_shapes()})
        self._native.write_serial([(n, t.__dlpack__()) for n, t in out.items()], threads)
        return out

    def _empty(self, shapes: Mapping[str, list[int]]) -> dict[str, torch.Tensor]:
        return {n: torch.empty(tuple(s), dtype=self._features[n][0]) for n, s in shapes.items()}

    def rank_blocks(self, coord: tuple[int, ...], threads: int = 1) -> dict[str, torch.Tensor]:
        """The blocks of the rank at CP coordinate ``coord``, every placed feature: views
        of one buffer the executor allocated (huge pages advised) and wrote, freed when
        the last of them goes."""
        return self.views(self.rank_buffer(coord, threads))

    def rank_buffer(self, coord: tuple[int, ...], threads: int = 1, *, compact: bool = False) -> torch.Tensor:
        """The blocks of the rank at ``coord`` in one uint8 tensor, laid out as
        :meth:`wire` says: what a source sends that rank. With ``compact``, each block
        with a compact form holds it (:func:`expand` makes it dense)."""
        return from_dlpack(self._native.rank_buffer(coord, threads, compact))

    def buffer_offsets(self, *, compact: bool = False) -> tuple[list[tuple[str, int]], int]:
        """Each placed feature's byte offset in a rank's buffer, and the buffer's length."""
        layout = self.wire(compact=compact)
        return [(s.name, s.offset) for s in layout.slots], layout.nbytes

    def views(self, buffer: torch.Tensor, *, compact: bool = False) -> dict[str, torch.Tensor]:
        """The blocks in a rank's buffer, by name, dense: views of it (and, with
        ``compact``, compact blocks expanded)."""
        wire = self.wire(compact=compact)
        return expand(self._plan, buffer_views(buffer, wire), wire)

    def header(self, *, compact: bool = False, sample: int | None = None) -> _native.Header:
        """What a source announces before the buffers (the same bytes as the tch
        runtime's): the sample's layout and :meth:`wire`, and its index when given."""
        return self._native.header(compact, sample)

    def wire(self, *, compact: bool = False) -> Wire:
        """What a receiver needs to read a rank's buffer: the executor's layout of it,
        every block's slot (name, dtype, shape, offset; a compact block's form and dense
        dtype and shape)."""
        return self._native.buffer_layout(compact)


def view_at(buffer: torch.Tensor, offset: int, nbytes: int, dtype: str, shape: list[int]) -> torch.Tensor:
    """The ``nbytes`` bytes of ``buffer`` from ``offset`` as a tensor of the spec dtype
    ``dtype`` and ``shape``: a view (what a slot of a rank's buffer holds)."""
    return buffer[offset : offset + nbytes].view(_BY_NAME[dtype]).view(shape)


def buffer_views(buffer: torch.Tensor, wire: Wire) -> dict[str, torch.Tensor]:
    """The blocks in a rank's buffer (``Placement.wire`` tells where), views of it: a
    compact block as it is held. Passed-through values are not blocks: see
    :func:`carried`."""
    return {s.name: view_at(buffer, s.offset, s.nbytes, s.dtype, s.shape)
            for s in wire.slots if s.global_shape is not None}


def carried(buffer: torch.Tensor, wire: Wire) -> dict[str, Any]:
    """The passed-through values in a rank's buffer (on the host): a tensor as a view
    of it, any other value unpickled from its slot."""
    out: dict[str, Any] = {}
    for s in wire.slots:
        if s.global_shape is not None:
            continue
        x = view_at(buffer, s.offset, s.nbytes, s.dtype, s.shape)
        out[s.name] = pickle.loads(x.numpy().tobytes()) if s.encoding == "pickle" else x
    return out


def expand(plan: Plan, blocks: Mapping[str, torch.Tensor], wire: Wire) -> dict[str, torch.Tensor]:
    """The dense blocks of ``blocks`` (as :func:`buffer_views` gives them, on the host):
    the executor checks every compact block and expands them all into one new buffer
    (huge pages advised: few page faults), byte for byte what the dense path sends; the
    others as they are. A block that is not its feature's compact form is a
    ``ValueError`` naming the feature."""
    out = dict(blocks)
    compact = [s for s in wire.slots if s.form is not None]
    if not compact:
        return out
    capsule, offsets = plan.expand_blocks(
        [(s.name, s.dense_shape, blocks[s.name].contiguous().__dlpack__()) for s in compact])
    buffer = from_dlpack(capsule)
    for s, at in zip(compact, offsets):
        out[s.name] = view_at(buffer, at, s.dense_nbytes, s.dense_dtype, s.dense_shape)
    return out


def expand_on_device(blocks: Mapping[str, torch.Tensor], wire: Wire, device: torch.device) -> dict[str, torch.Tensor]:
    """The dense blocks of ``blocks`` made by torch on ``device`` (a CUDA mesh's GPU):
    only the compact blocks cross to it, and each dense block is made there, byte for
    byte what the dense path sends; the others as they are."""
    out = dict(blocks)
    for s in wire.slots:
        if s.form is not None:
            out[s.name] = expand_block(blocks[s.name], s, device)
    return out


def moved_together(tensors: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """``tensors`` on ``device`` by one copy: packed into one host buffer first (laid
    out as a rank buffer is), so that many small blocks cost one transfer, not one each;
    each comes back as a view of the copy, of its dtype and shape."""
    offsets, total = _native.packed_offsets([x.numel() * x.element_size() for x in tensors.values()])
    at = dict(zip(tensors, offsets))
    host = torch.empty(total, dtype=torch.uint8)
    for name, x in tensors.items():
        _bytes_at(host, at[name], x).copy_(x)
    there = host.to(device, non_blocking=True)
    return {name: _bytes_at(there, at[name], x) for name, x in tensors.items()}


def _bytes_at(buffer: torch.Tensor, at: int, like: torch.Tensor) -> torch.Tensor:
    """The bytes of ``buffer`` from ``at`` viewed as a tensor of ``like``'s dtype and shape."""
    nbytes = like.numel() * like.element_size()
    return buffer[at : at + nbytes].view(like.dtype).view(like.shape)


def expand_block(stored: torch.Tensor, slot: Slot, device: torch.device) -> torch.Tensor:
    """One compact block's dense block, made by torch on ``device`` from ``stored`` as its
    ``slot``'s recipe says (the executor's statement of the tensor operations: a table
    of rows each stored integer picks, a scatter into zeros, entries written with a
    spare element, or a cast). Its indices and positions are trusted: the executor wrote
    or checked them. The tch runtime runs the same recipes
    (``runtime/src/dist/on_device.rs``), and both are held to the executor's vectors."""
    recipe = slot.recipe
    if recipe is None:
        raise ValueError(f"feature `{slot.name}`: no compact form to expand")
    x = stored.to(device)
    dtype = _BY_NAME[slot.dense_dtype]
    if recipe.op == "rows":
        return _picked_rows(x, recipe, dtype)
    if recipe.op == "scatter":
        return _scattered(x, recipe, dtype, tuple(slot.dense_shape))
    if recipe.op == "entries":
        return _entries(x, recipe, dtype, tuple(slot.dense_shape))
    return x.to(dtype)


def _picked_rows(x: torch.Tensor, recipe: _native.Recipe, dtype: torch.dtype) -> torch.Tensor:
    """``rows``: each integer (clamped first, when the recipe says; -1 picking the last
    row) picks a row of the recipe's table; the rows, cut to the block's elements, with
    their last axis moved to the recipe's axis. A few kernels, whatever the block."""
    shape, axis, numel = recipe.rows_shape, recipe.axis, recipe.numel
    assert shape is not None and axis is not None and numel is not None
    idx = x.long() if recipe.clamp is None else x.long().clamp(*recipe.clamp)
    rows = _table(recipe, dtype, x.device)[idx].view(-1)[:numel].view(shape)
    return rows if axis == rows.dim() - 1 else rows.movedim(-1, axis).contiguous()


def _scattered(x: torch.Tensor, recipe: _native.Recipe, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """``scatter``: zeros, then a 1 along the recipe's axis at each index naming a class."""
    axis, classes = recipe.axis, recipe.classes
    assert axis is not None and classes is not None
    real = (x >= 0) & (x < classes)
    at = torch.where(real, x, 0).long().unsqueeze(axis)
    out = torch.zeros(shape, dtype=dtype, device=x.device)
    return out.scatter_(axis, at, real.unsqueeze(axis).to(dtype))


def _entries(x: torch.Tensor, recipe: _native.Recipe, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """``entries``: zeros and one spare element, each entry's element written at its
    position (one past the last at the spare): no shape depends on the data, so the
    host never waits for the device."""
    row, numel = recipe.entry_row, recipe.numel
    assert row is not None and numel is not None
    row_bytes, value_at = row
    rows = x.contiguous().view(torch.uint8).view(-1, row_bytes)
    at = rows[:, :8].contiguous().view(torch.int64).view(-1)
    at = torch.where(at >= 0, at, numel)
    values = rows[:, value_at : value_at + dtype.itemsize].contiguous().view(dtype).view(-1)
    out = torch.zeros(numel + 1, dtype=dtype, device=x.device)
    out[at] = values
    return out[:numel].view(shape)


_TABLES: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}


def _table(recipe: _native.Recipe, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The recipe's table of rows as ``dtype`` on ``device``, made once per key."""
    key = (recipe.table_key or "", dtype, device)
    table = _TABLES.get(key)
    if table is None:
        elements, shape = recipe.table(), recipe.table_shape
        assert elements is not None and shape is not None
        table = torch.frombuffer(bytearray(elements), dtype=torch.uint8).view(shape).to(device=device, dtype=dtype)
        _TABLES[key] = table
    return table


def place(
    plan: Plan,
    features: Mapping[str, Any],
    mesh: tuple[int, ...],
    *,
    workflow: str | None = None,
    passthrough: Iterable[str] = (),
    threads: int = 1,
) -> Placement:
    """Validates a sample as the featurizer emitted it and places it on ``mesh``.

    Intake runs as the spec declares (dropped keys, incoming pads cut, unowned rows,
    derived features). Nested dicts go in as the featurizer emits them: a feature the
    spec names by a path (``constraint_feature.contact``) is read from its dict. A feature declared one-hot may be given as its indices, a sparse
    one as a ``torch.sparse_coo_tensor`` (or as ``NAME.indices`` and ``NAME.values``). Raises ``ValueError`` naming the feature and axis at fault, or
    ``TypeError`` for a spec tensor that is not a tensor.
    """
    features = paths.flat(plan, features)
    values = _as_elements(plan, features)
    native = plan.place(values, mesh, workflow, set(passthrough), threads, _objects(plan, features, values))
    return Placement(plan, native, features)


def _objects(plan: Plan, features: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, bytes | str]:
    """Each value the executor cannot read that is no feature of the spec, pickled (or
    why it does not pickle): a passed-through one rides its own slot of every rank's
    buffer as its pickle."""
    out: dict[str, bytes | str] = {}
    for name, v in values.items():
        if isinstance(v, str) and name not in plan.features:
            try:
                out[name] = pickle.dumps(features[name])
            except Exception as e:  # noqa: BLE001 - refused by name if it is passed through
                out[name] = f"{type(e).__name__}: {e}"
    return out


def _as_elements(plan: Plan, features: Mapping[str, Any]) -> dict[str, Any]:
    """``features`` as the executor takes them: each sparse feature given as a
    ``torch.sparse_coo_tensor`` as its parts, its coordinates (``[axes, n]``) and values
    as given (not coalesced: an element outside the tensor or given twice is the
    executor's to refuse, not torch's to merge) and its size; the dense form is never
    made. A key that is not text is refused by name."""
    if not isinstance(features, Mapping):
        raise TypeError(f"a sample is a mapping of feature names to tensors, not a {type(features).__name__}")
    out: dict[str, Any] = {}
    sparse = {n for n, f in plan.features.items() if f.sparse}
    for name, x in features.items():
        _check_key(name)
        if name in sparse and isinstance(x, torch.Tensor) and x.layout == torch.sparse_coo:
            out[name] = _sparse_value(x)
        else:
            out[name] = _value(x)
    return out


def _check_key(name: Any) -> None:
    """A sample key is a feature name: text the spec could declare."""
    if not isinstance(name, str):
        raise TypeError(f"sample key {name!r}: a {type(name).__name__}, but feature names are str")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"sample key {name!r}: not valid text (a lone surrogate), so no feature's name") from None


def _sparse_value(x: torch.Tensor) -> Any:
    """A sparse COO tensor's parts as ``_native.Plan.place`` takes them, else what it is."""
    if x.is_meta:
        return "a sparse meta tensor (no data)"
    y = x.detach().cpu()
    indices, values = _value(y._indices()), _value(y._values())
    if isinstance(indices, str) or isinstance(values, str):
        return f"a sparse tensor of {indices if isinstance(indices, str) else values} elements"
    return (indices, values, list(y.shape))


def rank_blocks(
    plan: Plan,
    features: Mapping[str, Any],
    mesh: tuple[int, ...],
    *,
    workflow: str | None = None,
    threads: int = 1,
) -> list[dict[str, torch.Tensor]]:
    """Every rank's blocks of one serial sample; rank ``i * cp1 + j`` holds (i, j).
    Features of nested dicts come back in their dicts."""
    placed = place(plan, features, mesh, workflow=workflow, threads=threads)
    return [
        paths.nested(plan, placed.rank_blocks(_native.coords(mesh, r), threads))
        for r in range(math.prod(mesh))
    ]


def release_buffers() -> int:
    """Gives back to the system the block memory featshard keeps for reuse. The buffers
    that hold a rank's blocks are recycled once every tensor viewing them is gone, so
    that the next sample's blocks land in memory already mapped (two are kept); call
    this when no more samples come. Returns how many buffers were kept."""
    return _native.release_buffers()
