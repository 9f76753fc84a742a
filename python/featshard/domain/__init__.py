"""ShardTensor scatter and gather of a domain-parallel plan (PhysicsNeMo).

One sample's spatial axes are split over the plan's domain mesh with PhysicsNeMo's
``ShardTensor``: uneven axes take ``torch.chunk`` pieces (no padding), the others are
padded to even shards. The batch axis must be 1 per domain group: scale the batch over
the data-parallel axis. :class:`Domain` reads its tables from the plan IR and every
number of the layout (chunk pieces, padded lengths, global shapes, windows, the shard
rule) from the plan's native geometry; a generated ``<module>.py`` binds one to its
plan file. Under torchrun::

    d = Domain(Plan("weather.yaml"))
    mesh = d.setup(domain=(...), ddp=...)                           # process group, device, mesh
    model = d.wrap_model(model.to(mesh_device(mesh)), mesh, "ddp")  # synced, wrapped
    s = d.scatter(sample if is_source else None, mesh)              # ShardTensors from one rank
    s = d.scatter_local(*d.safetensors_source(path), mesh)          # or each rank reads its part
    outputs = d.gather_outputs(model_outputs, s.lengths)            # full tensors

:meth:`Domain.check_gradients` runs a model serially and on the scattered inputs and
compares outputs, weight gradients and input gradients.
"""

from __future__ import annotations

from featshard import chunk_sizes
from featshard.domain.gradients import Domain
from featshard.domain.model import adopt_process_group
from featshard.domain.scatter import Reader, Scattered, mesh_device
from featshard.domain.tables import FeatureInfo, SemanticInfo
from featshard.errors import FeatureDistributionError

__all__ = [
    "Domain",
    "FeatureDistributionError",
    "FeatureInfo",
    "Reader",
    "Scattered",
    "SemanticInfo",
    "adopt_process_group",
    "chunk_sizes",
    "mesh_device",
]
