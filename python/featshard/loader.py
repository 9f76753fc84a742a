"""A loader that keeps a CP mesh fed: samples made off the critical path.

Under context parallelism every rank of a group waits for one sample. The synchronous
path (:class:`featshard.data.DistributedFeatureDataset` in a ``DataLoader`` with
``num_workers=0``) has the group's source featurize while the whole group idles.
:class:`FeatureLoader` takes that work off the step, three ways that combine:

- **workers**: each sample is fetched, validated and placed in ``num_workers`` worker
  processes (the ``DataLoader`` machinery, ``prefetch_factor`` samples each), every
  rank's buffer written there into shared memory; the main process only sends bytes;
- **spread**: the k-th sample of a CP group's sequence is made by its rank
  ``k % P``, so a group of P ranks makes P samples in the time one took; the samples,
  their order and the DP split are the sampler's, unchanged;
- **prefetch**: a thread distributes (and collates) the next ``prefetch`` steps while
  the model computes, on featshard's own gloo groups, never on the model's.

Every collective is issued in one order on every rank: each step is
:func:`featshard.distribute.distribute_prepared` (or ``distribute_features``) from that
step's source, and the world agrees on its failure, so a sample that fails in a worker
(after ``retries``, as today) is raised on every rank at that sample's step.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.data import DataLoader, Dataset

from featshard import Plan
from featshard.data import (
    DpSampler,
    FailedSample,
    PreshardedDataset,
    check_retries,
    collate,
    cpu_mesh_like,
    fetch_with_retries,
)
from featshard.distribute import (
    CpGroup,
    Prepared,
    cp_group,
    distribute_features,
    distribute_prepared,
    expansion_device,
    mesh_dims,
    prepare_sample,
)
from featshard.errors import StepsStopped, default_timeout, failure_of, timeout_of

__all__ = ["FeatureLoader"]


class _Preparing(Dataset[Prepared]):
    """A serial dataset's samples as a worker makes them ready for their step: fetched
    (with retries), validated and placed, every rank's buffer written into shared
    memory; a failure is carried, not raised, to be raised on every rank."""

    def __init__(self, plan: Plan, serial: Dataset[Any], sizes: tuple[int, ...], *, retries: int,
                 workflow: str | None, threads: int, compact: bool) -> None:
        self.plan, self.serial, self.sizes = plan, serial, sizes
        self.retries, self.workflow, self.threads, self.compact = retries, workflow, threads, compact

    def __len__(self) -> int:
        return len(self.serial)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Prepared:
        try:
            features = fetch_with_retries(self.serial, index, self.retries)
        except Exception as e:  # noqa: BLE001 - raised on every rank at its step
            return Prepared(None, None, failure_of(e))
        return prepare_sample(self.plan, features, self.sizes, workflow=self.workflow,
                              threads=self.threads, compact=self.compact)


def _as_is(x: Any) -> Any:
    """The DataLoader's collate for prepared samples: none (a module function, so that
    worker processes can be handed it)."""
    return x


class _Raised(NamedTuple):
    """What the prefetch thread passes on when its step failed: raised in the caller."""

    error: BaseException


_END = object()


class FeatureLoader:
    """The distributed samples (or DP batches) of ``dataset`` on every rank of ``mesh``,
    in the order of :class:`~featshard.data.DpSampler` (``shuffle``, ``seed``,
    :meth:`set_epoch`, ``drop_last``).

    ``dataset`` is a serial dataset (the featurizer's output per index) or a
    :class:`~featshard.data.PreshardedDataset`. ``batch_size=None`` yields single
    samples (DTensors on the CP mesh); an integer yields DP batches
    (:func:`~featshard.data.collate`, which needs a DP axis on ``mesh``).

    - ``num_workers`` (serial datasets): worker processes that fetch, validate and
      place samples, each ``prefetch_factor`` ahead; 0 makes each sample on its step.
    - ``spread``: the group's ranks take turns as the source (sample ``k`` of the
      group's sequence from its rank ``k % P``), each featurizing only its own turns.
    - ``prefetch``: steps distributed (and collated) ahead by a thread while the caller
      computes, at most this many held; 0 distributes on the caller's thread. A
    pre-sharded dataset reads each rank's next files ahead the same way.

    Every rank must iterate the same steps. Held at once, beyond the caller's: on a
    source, ``num_workers * prefetch_factor`` prepared samples (every rank's buffers of
    each), and ``prefetch`` finished steps. Worker processes end with the iteration,
    at its end, on an exception or when the iterator is dropped; an iteration dropped
    early first lets its thread finish the steps it has under way (every rank's thread
    takes part in them), at most ``prefetch`` of them.
    """

    def __init__(
        self,
        plan: Plan,
        dataset: Dataset[Any],
        mesh: DeviceMesh,
        *,
        batch_size: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        num_workers: int = 0,
        prefetch_factor: int = 2,
        prefetch: int = 0,
        spread: bool = True,
        retries: int = 0,
        workflow: str | None = None,
        threads: int = 1,
        compact: bool = True,
        timeout: timedelta | None = None,
    ) -> None:
        check_retries(retries)
        for name, value, least in (("num_workers", num_workers, 0), ("prefetch_factor", prefetch_factor, 1),
                                   ("prefetch", prefetch, 0),
                                   ("batch_size", 1 if batch_size is None else batch_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"FeatureLoader: {name} must be an integer of at least {least}, got {value!r}")
        if batch_size is not None and mesh_dims(plan, mesh)[0] is None:
            raise ValueError(f"FeatureLoader: batch_size needs a DP axis `{plan.dp_axis}` on the mesh"
                             " (collate stacks the samples of DP replicas); give batch_size=None")
        self.plan, self.dataset, self.mesh = plan, dataset, mesh
        self.batch_size = batch_size
        self.sampler = DpSampler(plan, dataset, mesh, shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.num_workers, self.prefetch_factor, self.prefetch = num_workers, prefetch_factor, prefetch
        self.spread, self.retries, self.workflow = spread, retries, workflow
        self.threads, self.compact, self.timeout = threads, compact, timeout
        self._collate_mesh: DeviceMesh | None = None
        # Steps the caller took of the iteration under way, and those the next one skips.
        self._taken = 0
        self._resume = 0
        self._waited: list[float] = []

    # Lightning reads a loader's sampler (``set_epoch``) and its batch sampler: steps
    # are batched here, by ``batch_size``.
    batch_sampler = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose permutation the next iteration draws (training)."""
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        n = len(self.sampler)
        return n if self.batch_size is None else -(-n // self.batch_size)

    @property
    def counters(self) -> dict[str, float]:
        """This rank's counters of the iteration under way (or the last), for logging:
        ``steps`` taken by the caller, and how long the caller waited for them in all
        (``stall_s``), the longest (``stall_max_s``) and the median (``stall_median_s``)
        of its waits, in seconds: the time the model step did not run for want of data."""
        waits = sorted(self._waited)
        return {
            "steps": float(self._taken),
            "stall_s": sum(waits),
            "stall_max_s": waits[-1] if waits else 0.0,
            "stall_median_s": waits[len(waits) // 2] if waits else 0.0,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where the iteration stands: its epoch, the steps the caller has taken of it
        (steps made ahead by workers or the thread are not taken) and what decides its
        order. Saved with a checkpoint (Lightning saves it when the loader has one),
        :meth:`load_state_dict` makes the next iteration resume after those steps."""
        return {"epoch": self.sampler.epoch, "steps": self._taken, "order": self._order_terms()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The next iteration resumes where ``state`` (:meth:`state_dict`) stood: the same
        epoch, its first ``steps`` steps skipped (never fetched), every later one as an
        uninterrupted iteration gives it. A state of another order (dataset length,
        shuffle, seed, drop_last, spread, batch size) is refused by name."""
        try:
            epoch, steps, order = int(state["epoch"]), int(state["steps"]), str(state["order"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"FeatureLoader.load_state_dict: not a loader's state ({e!r}): {state!r}") from e
        before = self.sampler.epoch
        self.sampler.set_epoch(epoch)
        if order != self._order_terms():
            self.sampler.set_epoch(before)
            raise ValueError(f"FeatureLoader.load_state_dict: the state is of another order: {order}; "
                             f"this loader's is {self._order_terms()}")
        if not 0 <= steps <= len(self):
            raise ValueError(f"FeatureLoader.load_state_dict: {steps} steps taken, of an epoch of {len(self)}")
        self._resume = steps

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # Collective setup on the caller's thread, in one order on every rank: the CP
        # groups, then (batches made ahead) a gloo mesh whose dp group collate may use
        # while the model uses its own.
        group = cp_group(self.plan, self.mesh, timeout=self.timeout)
        if self.batch_size is not None and self.prefetch > 0 and self._collate_mesh is None:
            self._collate_mesh = cpu_mesh_like(self.mesh, timeout=self.timeout)
        indices = list(self.sampler)
        # A resumed iteration skips the steps taken before; their samples are not made.
        skip, self._resume = self._resume, 0
        self._taken = skip
        start = skip * (self.batch_size or 1)
        # Set once this rank's caller stops: its thread's next step stops every rank's.
        stopping = threading.Event()
        samples = self._samples(group, indices, _Order(self._order_terms(), stopping), start)
        steps = samples if self.batch_size is None else self._batches(samples)
        if self.prefetch > 0:
            steps = _ahead(steps, self.prefetch, expansion_device(group.mesh), stopping)
        return self._counted(steps)

    def _counted(self, steps: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """``steps`` as the caller takes them, each counted into :meth:`state_dict` and
        the wait for it into :attr:`counters`."""
        self._waited = []
        try:
            while True:
                asked = time.perf_counter()
                try:
                    step = next(steps)
                except StopIteration:
                    return
                self._waited.append(time.perf_counter() - asked)
                self._taken += 1
                yield step
        finally:
            close: Callable[[], None] | None = getattr(steps, "close", None)
            if close is not None:
                close()

    def _order_terms(self) -> str:
        """What decides which sample each step holds, agreed by every rank at every
        step (with its number): ranks drawing different sequences are every rank's
        named error, never different samples delivered as one."""
        s = self.sampler
        return (f"samples={s.n} shuffle={s.seed is not None} seed={s.seed} epoch={s.epoch}"
                f" drop_last={s.drop_last} spread={self.spread} batch_size={self.batch_size}")

    def _samples(self, group: CpGroup, indices: Sequence[int], order: _Order, start: int
                 ) -> Iterator[dict[str, Any]]:
        """The samples from position ``start`` of the sequence on (a resumed iteration's),
        each made by the source its position gives, as in an uninterrupted one."""
        if isinstance(self.dataset, PreshardedDataset):
            presharded = self.dataset
            return (presharded[i] for i in indices[start:])
        ranks, me = group.ranks, dist.get_rank()
        sources = [ranks[k % len(ranks)] if self.spread else ranks[0] for k in range(len(indices))]
        mine = [i for k, (i, s) in enumerate(zip(indices, sources)) if s == me and k >= start]
        if self.num_workers == 0:
            return self._made_on_step(group, indices, sources, order, start)
        # The workers start here, on the caller's thread, before any thread of ours.
        made = iter(DataLoader(
            _Preparing(self.plan, self.dataset, tuple(group.mesh.mesh.shape), retries=self.retries,
                       workflow=self.workflow, threads=self.threads, compact=self.compact),
            batch_size=None, sampler=mine, num_workers=self.num_workers,
            prefetch_factor=self.prefetch_factor, collate_fn=_as_is,
            # A worker that never returns ends the source's wait before its peers'
            # collective gives up, so that every rank raises the same named error.
            timeout=0.8 * _seconds(group),
        ))
        return self._made_ahead(group, sources, made, order, start)

    def _made_on_step(self, group: CpGroup, indices: Sequence[int], sources: Sequence[int], order: _Order,
                      start: int) -> Iterator[dict[str, Any]]:
        """Each sample fetched by its source on its step (the synchronous path)."""
        for k in range(start, len(indices)):
            index, src = indices[k], sources[k]
            features: Any = None
            stop = order.stopping.is_set()
            if dist.get_rank() == src and not stop:
                try:
                    features = fetch_with_retries(self.dataset, index, self.retries)
                except Exception as e:  # noqa: BLE001 - reported to every rank by distribute
                    features = FailedSample(e)
            yield distribute_features(self.plan, features, self.mesh, src, workflow=self.workflow,
                                      threads=self.threads, group=group, compact=self.compact,
                                      sampler=order.at(k), stop=stop)

    def _made_ahead(self, group: CpGroup, sources: Sequence[int], made: Iterator[Prepared], order: _Order,
                    start: int) -> Iterator[dict[str, Any]]:
        """Each sample as its source's workers prepared it, sent on its step."""
        try:
            for k in range(start, len(sources)):
                src = sources[k]
                stop = order.stopping.is_set()
                prepared = _next_prepared(made) if dist.get_rank() == src and not stop else None
                yield distribute_prepared(self.plan, prepared, self.mesh, src, workflow=self.workflow,
                                          group=group, sampler=order.at(k), stop=stop)
        finally:
            # Ends the worker processes now (at the end, on an error, or when dropped).
            shutdown = getattr(made, "_shutdown_workers", None)
            if callable(shutdown):
                shutdown()

    def _batches(self, samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        assert self.batch_size is not None
        mesh = self._collate_mesh if self._collate_mesh is not None else self.mesh
        batch: list[dict[str, Any]] = []
        for sample in samples:
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield collate(self.plan, batch, self.mesh, group_mesh=mesh)
                batch = []
        if batch:
            yield collate(self.plan, batch, self.mesh, group_mesh=mesh)


def _seconds(group: CpGroup) -> float:
    """The timeout of the group's collectives, in seconds (the caller's, by default)."""
    found = timeout_of(group.group)
    return (found if found is not None else default_timeout()).total_seconds()


class _Order(NamedTuple):
    """What decides each step's sample (agreed at every step with its number), and
    whether this rank's caller has stopped."""

    terms: str
    stopping: threading.Event

    def at(self, k: int) -> str:
        return f"{self.terms} step={k}"


def _next_prepared(made: Iterator[Prepared]) -> Prepared:
    """The next sample the workers made; a worker that fails or times out is this
    source's failure at the step, which every rank then raises."""
    try:
        return next(made)
    except Exception as e:  # noqa: BLE001 - raised on every rank at this step
        return Prepared(None, None, failure_of(e))


def _ahead(steps: Iterator[dict[str, Any]], depth: int, device: torch.device | None,
           stop: threading.Event) -> Iterator[dict[str, Any]]:
    """``steps`` made by a thread, at most ``depth`` ahead of the caller. On a CUDA mesh
    the thread works on a stream of its own; the caller's stream waits for it before a
    step is handed over. A step's failure is raised in the caller at that step.

    Once the caller stops (``stop``), the thread hands nothing more over: its next
    step stops every rank's (:class:`~featshard.errors.StepsStopped`, raised where a
    caller still reads), so no rank starts a step the others will not take, and the
    caller waits only for the step under way."""
    held: queue.Queue[Any] = queue.Queue(maxsize=depth)

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                held.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        # On a CUDA mesh, a stream of the thread's own: the caller's stream waits on
        # each step's event before it is handed over.
        side = None
        if device is not None:
            torch.cuda.set_device(device)
            side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        try:
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                for step in steps:
                    event = side.record_event() if side is not None else None
                    # Once the caller stopped nothing is handed over, and the next
                    # step votes every rank's stop.
                    put((step, event))
            put(_END)
        except BaseException as e:  # noqa: BLE001 - raised in the caller at this step
            if not (stop.is_set() and isinstance(e, StepsStopped)):
                put(_Raised(e))
            ended.append(e)
        finally:
            close: Callable[[], None] | None = getattr(steps, "close", None)
            if close is not None:
                close()

    ended: list[BaseException] = []
    thread = threading.Thread(target=run, name="featshard-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = held.get()
            if item is _END:
                return
            if isinstance(item, _Raised):
                raise item.error
            step, event = item
            if event is not None:
                torch.cuda.current_stream(device).wait_event(event)
                _record_on_current(step, device)
            yield step
    except GeneratorExit:
        stop.set()
        thread.join()
        # A failure of the step under way when the caller left is not lost (a stop
        # every rank agreed on is none).
        left = [e for e in ended if not isinstance(e, StepsStopped)]
        if left:
            raise left[0] from None
        raise
    finally:
        stop.set()
        thread.join()


def _record_on_current(step: Mapping[str, Any], device: torch.device | None) -> None:
    """Marks every block of ``step`` as used by the caller's stream, so that the caching
    allocator does not hand its memory to the thread's stream while the caller's
    kernels may still read it."""
    current = torch.cuda.current_stream(device)
    for x in step.values():
        local = x.to_local() if hasattr(x, "to_local") else x
        if isinstance(local, torch.Tensor) and local.is_cuda:
            local.record_stream(current)
        elif isinstance(x, Mapping):
            _record_on_current(x, device)
