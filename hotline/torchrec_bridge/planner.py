"""A drop-in for torchrec's ``EmbeddingShardingPlanner`` that plans Hotline's collections too.

torchrec's planner prices Hotline's ``customized_kernel`` by the figure ``sharding.register_planner_prices``
gives it, but its storage estimate counts every row of a table in the compute device's memory: on CUDA it
refuses tables larger than HBM that Hotline holds mostly in host memory. :class:`HotlinePlanner` takes the
planner's arguments and has its two verbs: every
``HotlineEmbeddingBagCollection`` of the model gets Hotline's layout (:func:`~hotline.torchrec_bridge.sharding.
hotline_sharding_plan`: cold rows sharded over every rank, hot rows replicated), and torchrec's planner, built
from the same arguments, plans every other module with the other sharders::

    planner = tb.HotlinePlanner(topology=Topology(world_size=N, compute_device="cuda"), batch_size=B)
    plan = planner.collective_plan(model, sharders, pg)
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders)
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from hotline.torchrec_bridge.sharding import (
    HotlineEmbeddingBagCollectionSharder,
    find_collections,
    hotline_sharding_plan,
)


class HotlinePlanner:
    """torchrec's ``EmbeddingShardingPlanner`` arguments in, its ``plan`` / ``collective_plan`` out, with Hotline's
    collections planned by Hotline (see the module docstring)."""

    def __init__(self, topology=None, *args: Any, **kwargs: Any):
        self._topology = topology
        self._args, self._kwargs = args, kwargs

    def _split(self, module: nn.Module, sharders: list[ModuleSharder]) -> tuple[ShardingPlan, list]:
        ours = [s for s in sharders if isinstance(s, HotlineEmbeddingBagCollectionSharder)]
        others = [s for s in sharders if not isinstance(s, HotlineEmbeddingBagCollectionSharder)]
        found = find_collections(module)
        if found and not ours:
            raise ValueError(
                f"{type(module).__name__} holds HotlineEmbeddingBagCollections ({', '.join(found)}) but the sharders "
                "have no HotlineEmbeddingBagCollectionSharder"
            )
        world = self._topology.world_size if self._topology is not None else _world_size()
        device = self._topology.compute_device if self._topology is not None else "cpu"
        plan = hotline_sharding_plan(module, world, device, found) if found else ShardingPlan({})
        kinds = tuple(s.module_type for s in others)
        rest = kinds and any(isinstance(m, kinds) for m in module.modules())
        return plan, others if rest else []

    def _torchrec(self) -> EmbeddingShardingPlanner:
        return EmbeddingShardingPlanner(self._topology, *self._args, **self._kwargs)

    def plan(self, module: nn.Module, sharders: list[ModuleSharder]) -> ShardingPlan:
        plan, others = self._split(module, sharders)
        if others:
            plan.plan.update(self._torchrec().plan(module, others).plan)
        return plan

    def collective_plan(self, module: nn.Module, sharders: list[ModuleSharder], pg=None) -> ShardingPlan:
        """:meth:`plan` with torchrec's part planned on rank 0 and broadcast (Hotline's is the same everywhere)."""
        plan, others = self._split(module, sharders)
        if others:
            plan.plan.update(self._torchrec().collective_plan(module, others, pg).plan)
        return plan


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
