"""Gradient parity of one sample: a model run serially and on its scattered ShardTensors."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from featshard.domain.model import DomainModel
from featshard.domain.scatter import mesh_device

__all__ = ["Domain"]


class Domain(DomainModel):
    """A domain-parallel plan's tables and its ShardTensor runtime: the geometry
    (:class:`~featshard.domain.tables.DomainTables`), scatter and gather
    (:class:`~featshard.domain.scatter.DomainScatter`), the run and the model
    (:class:`~featshard.domain.model.DomainModel`), and the gradient check."""

    def check_gradients(
        self,
        model_factory: Callable[[], torch.nn.Module],
        forward: Callable[[torch.nn.Module, Mapping[str, Any]], torch.Tensor],
        loss: Callable[[torch.Tensor], torch.Tensor],
        sample: Mapping[str, Any],
        mesh: DeviceMesh,
        strategy: str = "none",
        atol: float = 1e-5,
        rtol: float = 1e-4,
    ) -> None:
        """Gradient parity of one sample, checked on every rank with TF32 off.

        `forward(model, inputs)` then `loss(output)` run serially on the padded sample and,
        through `self.wrap_model(..., strategy)`, on its scattered ShardTensors. The output, the
        loss, every weight gradient and every floating-point input's gradient (which keeps
        the input's placements) must agree within `atol` + `rtol`; on the FSDP2 path the
        spec's `self.parameters` must sit at their placements on the domain. Every rank passes the
        same full `sample` (data-parallel replicas too, so that averaging keeps the serial
        gradients); `model_factory` must build the same model on every call (seed it).
        Raises AssertionError naming what differs.
        """
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dmesh = self.domain_mesh(mesh)
        sizes = tuple(int(n) for n in dmesh.mesh.shape)
        device = mesh_device(dmesh)
        serial: dict[str, Any] = {n: sample[n] for n in self.metadata if n in sample}
        for name, x in self.pad_inputs(sample, sizes, device).items():
            serial[name] = x.detach().clone().requires_grad_(x.dtype.is_floating_point)
        reference = model_factory().to(device)
        want = forward(reference, serial)
        want_loss = loss(want)
        torch.autograd.backward(want_loss)
        model = self.wrap_model(model_factory().to(device), mesh, strategy)
        is_source = dist.get_rank() == int(dmesh.mesh.flatten()[0])
        inputs = self.scatter(sample if is_source else None, mesh, requires_grad=True).inputs
        got = forward(model, inputs)
        got_loss = loss(got)
        torch.autograd.backward(got_loss)
        _close("output", got, want, atol, rtol)
        _close("loss", got_loss, want_loss, atol, rtol)
        inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
        for (name, p), (_, q) in zip(inner.named_parameters(), reference.named_parameters()):
            declared = self.parameters.get(name.split(".")[-1])
            if strategy == "fsdp2" and declared is not None:
                on_domain = tuple(getattr(p, "placements", ()))[-len(self.domain_axes) :]
                if on_domain != declared.placements:
                    raise AssertionError(f"parameter `{name}`: at {on_domain} on the domain, not {declared.placements}")
            if q.grad is None or p.grad is None:
                raise AssertionError(f"weight `{name}`: no gradient ({'distributed' if p.grad is None else 'serial'})")
            _close(f"weight `{name}` gradient", p.grad, q.grad, atol, rtol)
        for name, x in serial.items():
            if not isinstance(x, torch.Tensor) or not x.requires_grad or x.grad is None:
                continue
            g = inputs[name].grad
            if g is None:
                raise AssertionError(f"input `{name}`: no gradient on the ShardTensor")
            if tuple(g.placements) != self.features[name].placements:
                raise AssertionError(f"input `{name}`: gradient at {tuple(g.placements)}, not {self.features[name].placements}")
            _close(f"input `{name}` gradient", g, x.grad, atol, rtol)


def _full(x: Any) -> Any:
    return x.full_tensor() if hasattr(x, "full_tensor") else x


def _close(what: str, got: Any, want: torch.Tensor, atol: float, rtol: float) -> None:
    got = _full(got).detach()
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, serially {tuple(want.shape)}")
    if not torch.allclose(got, want.detach(), atol=atol, rtol=rtol):
        err = float((got - want.detach()).abs().max())
        raise AssertionError(f"{what}: differs from the serial run by up to {err:.3g}")
