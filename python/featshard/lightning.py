"""A Lightning data module over serial datasets: each stage's loader a
:class:`featshard.loader.FeatureLoader`, each batch moved to the model's mesh by
:func:`featshard.data.to_device_mesh`. A module of its own above both, so neither the
data pipeline nor the loader imports the other back."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.data import Dataset

from featshard import Plan
from featshard.data import check_count, check_retries, to_device_mesh
from featshard.distribute import mesh_dims
from featshard.loader import FeatureLoader

__all__ = ["lightning_datamodule"]


def lightning_datamodule(
    plan: Plan,
    mesh: DeviceMesh,
    train: Dataset[Any] | None = None,
    val: Dataset[Any] | None = None,
    predict: Dataset[Any] | None = None,
    *,
    batch_size: int = 1,
    retries: int = 0,
    seed: int = 0,
    workflow: str | None = None,
    timeout: timedelta | None = None,
    num_workers: int = 0,
    prefetch_factor: int = 2,
    prefetch: int = 0,
    spread: bool = True,
) -> Any:
    """A ``LightningDataModule`` over serial datasets, or pre-sharded ones
    (:class:`PreshardedDataset`, whose samples each rank reads from its own rank files),
    for each stage (lightning must be importable).

    ``mesh`` is the model's mesh, (cp0, cp1) or (dp, cp0, cp1), on any device. Each
    stage's loader is a :class:`featshard.loader.FeatureLoader`: samples made in
    ``num_workers`` worker processes per rank (``prefetch_factor`` each), by the CP
    group's ranks in turn (``spread``), and ``prefetch`` steps distributed and collated
    ahead while the model computes (on featshard's own gloo groups); with the defaults,
    each sample is made on its step, as a ``DataLoader`` with ``num_workers=0`` does.
    Each sample moves from its source over gloo groups the pipeline creates itself,
    whatever the default backend is (NCCL cannot move CPU tensors), compact (see
    :func:`~featshard.distribute.distribute_features`): on a CUDA mesh each rank
    expands its compact blocks on its GPU, so only they cross PCIe, and the other blocks
    are copied there. DP collate pads and stacks the blocks where they are, agreeing on
    lengths over the dp group. Training data is shuffled by seed and epoch, validation
    and prediction data kept in order; all are split over DP replicas and distributed
    per CP group, as ``workflow`` (one of the spec's, or every feature for None).
    ``transfer_batch_to_device`` leaves a batch already on ``mesh`` and the target
    device as it is; a single sample from a (cp0, cp1) mesh gains the leading batch axis
    of 1 the model expects (the plan's DP placements without the dp axis) and its
    metadata becomes lists, as a collated batch's. The groups featshard makes take
    ``timeout`` (by default the caller's default group's).
    """
    check_retries(retries)
    check_count("seed", seed)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"lightning_datamodule: batch_size must be an integer of at least 1, got {batch_size!r}")
    # The ignores keep mypy --strict clean with and without lightning installed.
    try:
        import lightning.pytorch as pl  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        try:
            import pytorch_lightning as pl  # type: ignore[no-redef,import-not-found,unused-ignore]
        except ImportError as e:
            raise ImportError("lightning_datamodule needs `lightning` or `pytorch_lightning`") from e
    batched = mesh_dims(plan, mesh)[0] is not None

    def loader(serial: Dataset[Any] | None, shuffle: bool) -> FeatureLoader:
        if serial is None:
            raise ValueError("no dataset was given for this stage")
        return FeatureLoader(plan, serial, mesh, batch_size=batch_size if batched else None, shuffle=shuffle,
                             seed=seed, num_workers=num_workers, prefetch_factor=prefetch_factor,
                             prefetch=prefetch, spread=spread, retries=retries, workflow=workflow,
                             timeout=timeout)

    class FeatureDataModule(pl.LightningDataModule):  # type: ignore[misc,unused-ignore]
        def train_dataloader(self) -> FeatureLoader:
            return loader(train, shuffle=True)

        def val_dataloader(self) -> FeatureLoader:
            return loader(val, shuffle=False)

        def predict_dataloader(self) -> FeatureLoader:
            return loader(predict, shuffle=False)

        def transfer_batch_to_device(
            self, batch: Any, device: torch.device, dataloader_idx: int
        ) -> Any:
            return to_device_mesh(plan, batch, mesh, device)

    return FeatureDataModule()
