"""Hotline's collection under torchrec's DistributedModelParallel: a sharder, its sharded module, their plan.

``DistributedModelParallel(model, sharders=[HotlineEmbeddingBagCollectionSharder()], plan=hotline_sharding_plan(
model, world_size))`` replaces every :class:`~hotline.torchrec_bridge.module.HotlineEmbeddingBagCollection`
with a :class:`ShardedHotlineEmbeddingBagCollection`, as Hotline's own N-rank training lays rows out: the hot
rows replicated on every rank (their gradients exchanged, every replica updated alike), the cold rows sharded
by fused row over the ranks (``hotline.tiers.sharded_store.ShardedColdStore``; one rank keeps them all in a
``LocalColdStore``). Inputs and outputs stay data-parallel: ``input_dist`` passes the rank's own KJT on,
``compute`` looks its rows up (fetching cold rows from their owners), ``output_dist`` hands the pooled
KeyedTensor back; ``prefetch`` runs the look-ahead fetch for ``PrefetchTrainPipelineSparseDist``. The
embedding gradients are divided by the world size when torchrec's gradient division is on (its default), as
DDP averages the dense ones, so N ranks of batch B train like one process on the global batch of N * B.

The plan entry of a table is torchrec's ``ParameterSharding`` with sharding type ``row_wise`` and compute
kernel ``customized_kernel`` on every rank (what torchrec offers a backend it does not ship).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torchrec.distributed.embedding_sharding import KJTListSplitsAwaitable
from torchrec.distributed.embedding_types import EmbeddingComputeKernel, KJTList
from torchrec.distributed.types import (
    EmbeddingModuleShardingPlan,
    LazyAwaitable,
    LazyNoWait,
    ModuleSharder,
    NoWait,
    NullShardedModuleContext,
    ParameterSharding,
    ShardedModule,
    ShardingEnv,
    ShardingPlan,
    ShardingType,
)
from torchrec.optim.fused import FusedOptimizerModule
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from hotline.distributed.comm import Comm
from hotline.torchrec_bridge.collection_core import CollectionCore, TieredCollectionMixin
from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection

KERNEL = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
SHARDING = ShardingType.ROW_WISE.value


class ShardedHotlineEmbeddingBagCollection(
    TieredCollectionMixin,
    ShardedModule[KJTList, KeyedTensor, KeyedTensor, NullShardedModuleContext],
    FusedOptimizerModule,
):
    """A HotlineEmbeddingBagCollection sharded over the ranks of ``env`` (see the module docstring)."""

    def __init__(
        self, module: HotlineEmbeddingBagCollection, env: ShardingEnv, device: torch.device | None = None
    ):
        super().__init__()
        world, rank = int(env.world_size), int(env.rank)
        if world > 1:
            import torch.distributed as dist

            # Our own gloo group: its collectives never interleave with DDP's on the default group.
            comm = Comm(rank, world, dist.new_group(backend="gloo"))
        else:
            comm = Comm()
        src = module._core
        tables, states = src.export()  # the module's current rows (identical on every rank)
        rule = module.fused_optimizer.current_rule()
        device = torch.device(device) if device is not None else src.device
        core = CollectionCore(src.configs, [np.asarray(h) for h in module.placement.hot_ids],
                              [tables[c.name] for c in src.configs], rule, comm, device, src.is_weighted,
                              max(g._capacity for g in src.groups))  # fmt: skip
        if any(s.size for s in states.values()):
            core.load(tables, states)
        src.close()  # the unsharded module's host rows are not needed any more
        self.placement = module.placement
        self._init_tables(core, module.update_in_backward)
        self._in_backward_checked = module._in_backward_checked
        self._fused_optimizer.iteration = module.fused_optimizer.iteration  # Adam's bias correction goes on

    @property
    def device(self) -> torch.device:
        return self._core.device

    @property
    def unsharded_module_type(self) -> type[HotlineEmbeddingBagCollection]:
        return HotlineEmbeddingBagCollection

    def _grad_scale(self) -> float:
        from torchrec.distributed.comm_ops import get_gradient_division

        N = self._core.comm.world_size
        return 1.0 / N if N > 1 and get_gradient_division() else 1.0

    # -- torchrec's ShardedModule -----------------------------------------------------------------------------
    def create_context(self) -> NullShardedModuleContext:
        return NullShardedModuleContext()

    def input_dist(
        self, ctx: NullShardedModuleContext, features: KeyedJaggedTensor
    ) -> KJTListSplitsAwaitable:
        """Nothing to distribute: every rank looks its own batch up (cold rows come from their owners). The
        awaitable is torchrec's own kind, so its train pipelines can fuse it with other modules' input dists."""
        return KJTListSplitsAwaitable([NoWait(NoWait(features))], ctx)

    def compute(self, ctx: NullShardedModuleContext, dist_input: KJTList) -> KeyedTensor:
        return self._tiered_forward(dist_input[0])

    def output_dist(self, ctx: NullShardedModuleContext, output: KeyedTensor) -> LazyAwaitable[KeyedTensor]:
        return LazyNoWait(output)

    def prefetch(self, dist_input: KJTList, forward_stream=None, ctx=None) -> None:
        """Fetches the cold rows of a coming training batch now (the look-ahead), under the claim rule: rows
        the step still in flight will update are read again just before this batch computes."""
        self._core.prefetch(dist_input[0])

    def sharded_parameter_names(self, prefix: str = ""):
        for name, _ in self.named_parameters(prefix):
            yield name


class HotlineEmbeddingBagCollectionSharder(ModuleSharder[HotlineEmbeddingBagCollection]):
    """torchrec's ModuleSharder for :class:`HotlineEmbeddingBagCollection` (``row_wise`` /
    ``customized_kernel``): hot rows replicated, cold rows sharded by row over the ranks."""

    @property
    def module_type(self) -> type[HotlineEmbeddingBagCollection]:
        return HotlineEmbeddingBagCollection

    def shard(self, module: HotlineEmbeddingBagCollection, params: EmbeddingModuleShardingPlan, env: ShardingEnv,
              device: torch.device | None = None, module_fqn: str | None = None) -> ShardedHotlineEmbeddingBagCollection:  # fmt: skip
        where = module_fqn or "the collection"
        for c in module.embedding_bag_configs():
            ps = params.get(c.name)
            if ps is None:
                raise ValueError(f"the sharding plan of {where} has no entry for table {c.name!r}")
            if ps.compute_kernel != KERNEL or ps.sharding_type != SHARDING:
                raise ValueError(
                    f"table {c.name!r} of {where}: Hotline's sharder needs sharding type {SHARDING!r} and compute "
                    f"kernel {KERNEL!r}, the plan says {ps.sharding_type!r} / {ps.compute_kernel!r}"
                )
        dev = device if device is not None and torch.device(device).type != "meta" else None
        return ShardedHotlineEmbeddingBagCollection(module, env, dev)

    def shardable_parameters(self, module: HotlineEmbeddingBagCollection) -> dict[str, nn.Parameter]:
        return {name: view.weight for name, view in module._modules["embedding_bags"].items()}

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return [SHARDING]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        return [KERNEL]


def find_collections(
    model: nn.Module, kind: type | tuple = HotlineEmbeddingBagCollection
) -> dict[str, nn.Module]:
    """Module path -> module of every ``kind`` inside ``model`` (not looking inside a found one)."""
    found: dict[str, nn.Module] = {}

    def walk(m: nn.Module, path: str) -> None:
        if isinstance(m, kind):
            found[path] = m
            return
        for name, child in m.named_children():
            walk(child, f"{path}.{name}" if path else name)

    walk(model, "")
    return found


def hotline_parameter_sharding(
    num_embeddings: int, dim: int, world_size: int, device_type: str = "cpu"
) -> ParameterSharding:
    """torchrec's ParameterSharding of one table under Hotline's sharder: row-wise over every rank, the
    customized kernel (the row ranges describe the table's size only: Hotline shards by fused row modulo N)."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata

    bounds = [num_embeddings * r // world_size for r in range(world_size + 1)]
    shards = [
        ShardMetadata(
            shard_offsets=[bounds[r], 0],
            shard_sizes=[bounds[r + 1] - bounds[r], dim],
            placement=f"rank:{r}/{device_type}",
        )  # fmt: skip
        for r in range(world_size)
    ]
    return ParameterSharding(sharding_type=SHARDING, compute_kernel=KERNEL, ranks=list(range(world_size)),
                             sharding_spec=EnumerableShardingSpec(shards))  # fmt: skip


def hotline_sharding_plan(model: nn.Module, world_size: int, device_type: str = "cpu",
                          kinds: dict[str, nn.Module] | None = None) -> ShardingPlan:  # fmt: skip
    """A ShardingPlan that hands every HotlineEmbeddingBagCollection inside ``model`` (or the collections of
    ``kinds``, path -> module) to Hotline's sharder."""
    found = kinds if kinds is not None else find_collections(model)
    if not found:
        raise ValueError(f"{type(model).__name__} holds no HotlineEmbeddingBagCollection to shard")
    plan: dict[str, Any] = {}
    for path, module in found.items():
        plan[path] = EmbeddingModuleShardingPlan(
            {
                c.name: hotline_parameter_sharding(
                    int(c.num_embeddings), int(c.embedding_dim), world_size, device_type
                )
                for c in module.embedding_bag_configs()
            }  # fmt: skip
        )
    return ShardingPlan(plan)
