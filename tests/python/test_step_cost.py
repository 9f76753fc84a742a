"""The distribution step's fixed cost, held by count: every collective and point-to-point
message a step issues on each rank, and the size of the world's votes (gloo reduces a
vector of two values in a couple of rounds, one as long as the world in a ring of
2 (n - 1)). A collective added to the step, or a vote grown, fails here; the figures
this saves are benches/README.md's (the step's fixed cost)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from conftest import start_ranks

HERE = Path(__file__).resolve().parent

# Per step, on a CP group of P ranks with its source at CP rank 0: two votes over the
# world (the terms before any rank waits on another, the outcome after); the source
# sends each other rank its header's length, its header and its buffer.
VOTES = 2
VOTE_VALUES = 2
MESSAGES_PER_RECEIVER = 3


def _worker(rank: int, world: int, store: str, shape: tuple[int, ...], spec: str, results: str) -> None:
    sys.path[:0] = [str(HERE)]
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    import featshard
    from featshard.distribute import cp_group, distribute_features
    from test_protenix import nested_sample

    plan = featshard.Plan(spec)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "cp"))
    group = cp_group(plan, mesh)
    sample = nested_sample() if rank == group.ranks[0] else None
    distribute_features(plan, sample, mesh, group=group)  # the first step makes nothing new
    issued: Counter[str] = Counter()
    values: list[int] = []
    real = {name: getattr(dist, name) for name in ("all_reduce", "all_gather", "broadcast", "send", "recv",
                                                   "isend", "irecv", "barrier", "all_gather_object",
                                                   "broadcast_object_list", "scatter", "gather")}

    def counted(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            issued[name] += 1
            if name == "all_reduce":
                values.append(int(args[0].numel()))
            return real[name](*args, **kwargs)
        return call

    for name in real:
        setattr(dist, name, counted(name))
    try:
        distribute_features(plan, sample, mesh, group=group)
    finally:
        for name, f in real.items():
            setattr(dist, name, f)
    out = {"rank": rank, "source": rank == group.ranks[0], "issued": dict(issued), "values": values,
           "group": len(group.ranks)}
    Path(results, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def test_a_step_issues_two_small_votes_and_three_messages_a_receiver(tmp_path: Path) -> None:
    # dp 2 x cp 3: the world's votes span both replicas, the messages stay in a group.
    from test_protenix import spec_file

    shape = (2, 3)
    spec = spec_file(True, tmp_path)
    start_ranks(_worker, (6, str(tmp_path / "store"), shape, str(spec), str(tmp_path)), 6)
    outs = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(6)]
    for o in outs:
        receivers = o["group"] - 1
        want = {"all_reduce": VOTES}
        if o["source"]:
            want["send"] = MESSAGES_PER_RECEIVER * receivers
        else:
            want["recv"] = MESSAGES_PER_RECEIVER
        assert o["issued"] == want, o
        assert o["values"] == [VOTE_VALUES] * VOTES, o
