"""Starting a domain-parallel run: the process group, PhysicsNeMo's manager, the mesh,
and a model readied for it (weights synced over the domain, DDP or FSDP2)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from featshard.blocks import dtype_name
from featshard.domain.scatter import DomainScatter
from featshard.errors import FeatureDistributionError, backend_options

__all__ = ["DomainModel", "adopt_process_group"]


class DomainModel(DomainScatter):
    """A domain-parallel plan's run setup and model wrapping."""

    def setup(
        self,
        domain: Sequence[int],
        ddp: int = 1,
        init_method: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        timeout: timedelta | None = None,
    ) -> DeviceMesh:
        """Starts this process's part of a run and returns its (dp, domain...) mesh.

        With CUDA: this process's GPU (`LOCAL_RANK`) made current, NCCL; under torchrun with
        no `init_method`, through PhysicsNeMo's own `DistributedManager.initialize()`. Without
        CUDA: gloo (PhysicsNeMo's initialiser cannot start a CPU group: see
        `adopt_process_group`). A process group started beforehand is kept. The mesh is
        built with the spec's axis names, `ddp` replicas of the domain mesh `domain`, and
        checked against the world size.
        """
        from torch.distributed.device_mesh import init_device_mesh

        try:
            names, shape, needed = self.plan.device_mesh([int(n) for n in domain], int(ddp))
        except (ValueError, OverflowError) as e:  # OverflowError: a negative size
            raise FeatureDistributionError(f"domain sizes {tuple(domain)} and ddp {ddp}: {e}") from None
        _start_group(init_method, rank, world_size, timeout)
        world = dist.get_world_size()
        if world != needed:
            raise FeatureDistributionError(
                f"world size {world}, but ddp {ddp} x domain {tuple(domain)} {self.domain_axes} needs {needed} ranks"
            )
        device = "cuda" if torch.cuda.is_available() else "cpu"
        # Its groups take the caller's timeout, not torch's 30 minutes.
        backend = ("nccl" if device == "cuda" else "gloo", backend_options(device, timeout))
        return init_device_mesh(device, tuple(shape), mesh_dim_names=tuple(names),
                                backend_override=dict.fromkeys(names, backend))

    def wrap_model(self, model: torch.nn.Module, mesh: DeviceMesh, strategy: str = "none") -> torch.nn.Module:
        """Readies a model for the (dp, domain...) mesh: its plain parameters and buffers are
        broadcast over every domain axis (each domain rank starts from the same weights: DDP
        syncs the data-parallel axis only, FSDP2 none), then `strategy`: "none", "ddp"
        (DistributedDataParallel over the data-parallel group) or "fsdp2" (`fully_shard` on
        the data-parallel mesh, after the sync). On the FSDP2 path only, the spec's
        `self.parameters` (spatial parameters: positional embeddings, RoPE tables) are first
        sharded over the domain mesh as DTensors at their placements; the others, and all
        of them on the other paths, stay plain (ShardTensor promotes them in each op)."""
        from physicsnemo.domain_parallel import sync_module_over_mesh  # type: ignore[import-untyped]

        names = tuple(mesh.mesh_dim_names or ())
        for axis in self.domain_axes:
            if axis in names and mesh[axis].size() > 1:
                sync_module_over_mesh(model, mesh[axis])
        if strategy == "none":
            return model
        dp = self.dp_axis
        if dp is None or dp not in names:
            raise FeatureDistributionError(f"strategy `{strategy}` needs the data-parallel mesh axis `{dp}` in {names}")
        if strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model, process_group=mesh[dp].get_group())
        if strategy == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            self.shard_parameters(model, mesh)
            fully_shard(model, mesh=mesh[dp])
            return model
        raise FeatureDistributionError(f"unknown strategy `{strategy}`: expected none, ddp or fsdp2")

    def shard_parameters(self, model: torch.nn.Module, mesh: DeviceMesh) -> list[str]:
        """Replaces every parameter of `model` that the spec declares (`self.parameters`, matched
        by the last part of its dotted name) by a DTensor on the domain mesh at the declared
        placements, contiguous (FSDP2 refuses others); returns their dotted names. Each is
        checked like an input (rank, dtype, channel sizes, a split axis no shorter than its
        ranks); a declared parameter the model lacks is refused by name."""
        from torch.distributed.tensor import distribute_tensor

        dmesh = self.domain_mesh(mesh)
        sizes = tuple(int(n) for n in dmesh.mesh.shape)
        found: dict[str, list[str]] = {name: [] for name in self.parameters}
        for dotted, p in list(model.named_parameters()):
            *path, attr = dotted.split(".")
            info = self.parameters.get(attr)
            if info is None:
                continue
            self._check_parameter(dotted, attr, p, sizes)
            owner = model.get_submodule(".".join(path))
            shard = distribute_tensor(p.detach().contiguous(), dmesh, list(info.placements))
            setattr(owner, attr, torch.nn.Parameter(shard, requires_grad=p.requires_grad))
            found[attr].append(dotted)
        missing = sorted(n for n, at in found.items() if not at)
        if missing:
            raise FeatureDistributionError(f"parameters {missing} of the spec are not in the model")
        return [d for at in found.values() for d in at]

    def _check_parameter(self, dotted: str, attr: str, p: torch.Tensor, sizes: Sequence[int]) -> None:
        """The executor's checks of a declared parameter (rank, dtype, channel sizes, split
        axes no shorter than their ranks), its message naming the model's dotted name."""
        try:
            self.plan.check_parameter(attr, dtype_name(p.dtype), list(p.shape), sizes)
        except ValueError as e:
            raise FeatureDistributionError(f"parameter `{dotted}`: {e}") from None


def _start_group(init_method: str | None, rank: int | None, world_size: int | None, timeout: timedelta | None) -> None:
    """The process group and PhysicsNeMo's manager, this process's GPU current (`setup`)."""
    from physicsnemo.distributed import DistributedManager  # type: ignore[import-untyped]

    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        if cuda and init_method is None and "RANK" in os.environ:
            DistributedManager.initialize()
        else:
            device = _local_device(rank) if cuda else None
            if device is not None:
                torch.cuda.set_device(device)
            dist.init_process_group(
                "nccl" if cuda else "gloo", init_method=init_method, device_id=device,
                rank=-1 if rank is None else rank, world_size=-1 if world_size is None else world_size,
                timeout=timeout,
            )
    if not DistributedManager.is_initialized() or not DistributedManager().distributed:
        adopt_process_group(_local_device(dist.get_rank()) if cuda else None)


def _local_device(rank: int | None) -> torch.device:
    local = os.environ.get("LOCAL_RANK")
    index = int(local) if local is not None else (rank or 0) % max(1, torch.cuda.device_count())
    return torch.device("cuda", index)


def adopt_process_group(device: torch.device | None = None) -> None:
    """Registers an initialised torch.distributed default group with PhysicsNeMo's
    `DistributedManager`, which `scatter_tensor` reads; `device` (this process's current
    GPU with CUDA, else the CPU) becomes the current device and the manager's.

    `DistributedManager.initialize()` passes `device_id=cpu` to `init_process_group` on a
    machine without CUDA, which torch 2.13 rejects, and PhysicsNeMo has no public way to
    register a group started otherwise: so this writes the manager's state, the fields
    its own properties read (a PhysicsNeMo that renames them fails here, by name).
    `setup()` calls it on CPU only.
    """
    from physicsnemo.distributed import DistributedManager

    if not dist.is_initialized():
        raise RuntimeError("adopt_process_group: call torch.distributed.init_process_group first")
    cuda = torch.cuda.is_available()
    dev = device or (torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu"))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    state = {
        "_is_initialized": True,
        "_distributed": True,
        "_rank": dist.get_rank(),
        "_world_size": dist.get_world_size(),
        "_local_rank": dev.index if dev.index is not None else 0,
        "_device": dev,
        "_cuda": dev.type == "cuda",
        "_initialization_method": "env",
    }
    unknown = [k for k in ("rank", "world_size", "device", "distributed") if not hasattr(DistributedManager, k)]
    if unknown:
        raise RuntimeError(f"adopt_process_group: this PhysicsNeMo's DistributedManager has no {unknown}")
    DistributedManager._shared_state.update(state)
    _register_shard_patches()


def _register_shard_patches() -> None:
    """PhysicsNeMo registers its shard-aware ops (the convolutions that exchange halos
    among them) when it is imported, but only where CUDA is available: on CPU ranks a
    convolution would then run on each shard alone, without its halo. Registered here
    where CUDA is not (the modules register on first import only)."""
    import physicsnemo.domain_parallel as pdp  # type: ignore[import-untyped]

    if not torch.cuda.is_available():
        pdp.register_custom_ops()
