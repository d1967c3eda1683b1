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
The sharder takes the optimizer ``apply_optimizer_in_backward`` gave the tables (or its own ``fused_params``),
as torchrec's does; the sharded module's ``state_dict`` and fused optimizer hold row-wise ShardedTensors with
torchrec's sharded keys (``sharded_state``), so torch.distributed.checkpoint saves, loads and reshards them.

The plan entry of a table is torchrec's ``ParameterSharding`` with sharding type ``row_wise`` and compute
kernel ``customized_kernel`` on every rank (what torchrec offers a backend it does not ship).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
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
from hotline.tiers.sparse_optim import SparseOptimizer
from hotline.torchrec_bridge.collection_core import (
    CollectionCore,
    TieredCollectionMixin,
    in_backward_request,
    start_host_copy,
)
from hotline.torchrec_bridge.fused_optim import sparse_optimizer, state_names, state_views
from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection
from hotline.torchrec_bridge.sharded_state import (
    SHARDED_STATE_NAMES,
    ShardedFusedOptimizer,
    from_blocks,
    local_block,
    sharded_tensor,
    to_blocks,
)

KERNEL = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
SHARDING = ShardingType.ROW_WISE.value


class ShardedHotlineEmbeddingBagCollection(
    TieredCollectionMixin,
    ShardedModule[KJTList, KeyedTensor, KeyedTensor, NullShardedModuleContext],
    FusedOptimizerModule,
):
    """A HotlineEmbeddingBagCollection sharded over the ranks of ``env`` (see the module docstring)."""

    def __init__(self, module: HotlineEmbeddingBagCollection, env: ShardingEnv, device: torch.device | None = None,
                 optimizer: SparseOptimizer | None = None, update_in_backward: bool | None = None):  # fmt: skip
        super().__init__()
        world, rank = int(env.world_size), int(env.rank)
        self._pg = env.process_group
        src = module._core
        meta = src.device.type == "meta"  # no rows yet: each rank makes its own with torchrec's init
        tables, states = ({}, {}) if meta else src.export()  # the module's current rows
        old = module.fused_optimizer.current_rule()
        rule = optimizer if optimizer is not None else old
        device = torch.device(device) if device is not None else torch.device("cpu") if meta else src.device
        comm = bridge_comm(rank, world, device)
        core = CollectionCore(src.configs, [np.asarray(h) for h in module.placement.hot_ids],
                              None if meta else [tables[c.name] for c in src.configs], rule, comm, device,
                              src.is_weighted, src.max_lookups if meta else max(g._capacity for g in src.groups),
                              init=torchrec_init)  # fmt: skip
        if any(s.size for s in states.values()) and state_names(rule) == state_names(old):
            core.load(tables, states)
        if world > 1 and not meta:  # every replica of a hot row from the rank that owns it: the ranks agree
            for grp in core.groups:  # (built from meta, the tiers read them from their owners already)
                grp.load_hot_from_host()
        src.close()  # the unsharded module's host rows are not needed any more
        self.placement = module.placement
        in_backward = module.update_in_backward if update_in_backward is None else update_in_backward
        self._init_tables(core, in_backward)
        self._in_backward_checked = True  # the sharder has read apply_optimizer_in_backward's request
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
        awaitable is torchrec's own kind, so its train pipelines can fuse it with other modules' input dists.
        A device KJT's ids start their copy to the host here (the lookup reads them there), so under a train
        pipeline the copy overlaps the step before and the lookup waits for that copy only."""
        return KJTListSplitsAwaitable([NoWait(NoWait(start_host_copy(features)))], ctx)

    def compute(self, ctx: NullShardedModuleContext, dist_input: KJTList) -> KeyedTensor:
        return self._tiered_forward(dist_input[0])

    def output_dist(self, ctx: NullShardedModuleContext, output: KeyedTensor) -> LazyAwaitable[KeyedTensor]:
        return LazyNoWait(output)

    def prefetch(self, dist_input: KJTList, forward_stream=None, ctx=None) -> None:
        """Fetches the cold rows of a coming training batch now (the look-ahead), under the claim rule: rows
        the step still in flight will update are read again just before this batch computes."""
        self._core.prefetch(dist_input[0])

    # -- torchrec's sharded state --------------------------------------------------------------------------------
    def _tables(self):
        """(config, group, position in the group, this rank's rows of the table in the group's host arrays)."""
        core = self._core
        for t, c in enumerate(core.configs):
            g, i = core.where[t]
            grp = core.groups[g]
            yield c, grp, int(grp.layout.offsets[i]), grp.local_rows(i)

    def _sharded(self, local: torch.Tensor, lo: int, n: int) -> ShardedTensor:
        comm = self._core.comm
        block = to_blocks(comm, local, lo, n).contiguous()
        return sharded_tensor(block, n, comm.rank, comm.world_size, self._pg)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """``embedding_bags.<table>.weight`` as torchrec's sharded collection saves it: a row-wise ShardedTensor,
        each rank its block of rows (hot rows' current values merged in; no rank gathers a whole table)."""
        self._core.sync_to_host()
        for c, grp, lo, rows in self._tables():
            n = int(c.num_embeddings)
            destination[f"{prefix}embedding_bags.{c.name}.weight"] = self._sharded(
                grp.host_weight[rows], lo, n
            )

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):  # fmt: skip
        """Takes the ShardedTensors of :meth:`state_dict` (after torch.distributed.checkpoint loaded into them,
        from any world size or torchrec's sharded collection) or full tables (a one-process checkpoint)."""
        comm = self._core.comm
        N, r = comm.world_size, comm.rank
        rows_of = []
        for c, grp, lo, rows in self._tables():
            key = f"{prefix}embedding_bags.{c.name}.weight"
            if key not in state_dict:
                missing_keys.append(key)
                continue
            w, n, dim = state_dict[key], int(c.num_embeddings), int(c.embedding_dim)
            if isinstance(w, ShardedTensor):
                if tuple(w.shape) != (n, dim):
                    error_msgs.append(f"size mismatch for {key}: the ShardedTensor is {tuple(w.shape)}, the table "
                                      f"{(n, dim)}")  # fmt: skip
                    continue
                try:
                    block = local_block(w, n, r, N, key)
                except ValueError as e:
                    error_msgs.append(str(e))
                    continue
                mine = from_blocks(comm, block, lo, n)
            else:
                w = w.full_tensor() if hasattr(w, "full_tensor") else w
                if tuple(w.shape) != (n, dim):
                    error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(w.shape)}, the "
                                      f"table is {(n, dim)}")  # fmt: skip
                    continue
                mine = w.detach().cpu()[(r - lo) % N :: N]
            rows_of.append((grp, rows, mine))
        if len(rows_of) == len(self._core.configs):
            with torch.no_grad():
                for grp, rows, mine in rows_of:
                    grp.host_weight[rows] = mine.to(torch.float32)
                for grp in self._core.groups:
                    grp.load_hot_from_host(weights=True, state=False)

    def _new_fused_optimizer(self, bags: nn.ModuleDict, states) -> ShardedFusedOptimizer:
        params = {f"embedding_bags.{name}.weight": view.weight for name, view in bags.items()}
        return ShardedFusedOptimizer(params, self._core.optimizer, self._apply_update, self._optimizer_state,
                                     self._load_optimizer_state)  # fmt: skip

    def _state_views(self):
        """(parameter, table config, lo, its state views by torchrec's sharded names) of every table."""
        core = self._core
        for c, grp, lo, rows in self._tables():
            views = state_views(core.optimizer, grp.host_state[rows], int(c.embedding_dim))
            param = self._modules["embedding_bags"][c.name].weight
            yield param, c, lo, {f"{c.name}.{SHARDED_STATE_NAMES[k]}": v for k, v in views.items()}

    def _optimizer_state(self) -> dict:
        self._core.sync_to_host()
        state = {}
        for param, c, lo, views in self._state_views():
            if views:
                state[param] = {k: self._sharded(v, lo, int(c.num_embeddings)) for k, v in views.items()}
        return state

    @torch.no_grad()
    def _load_optimizer_state(self, built: dict) -> None:
        comm = self._core.comm
        for param, c, lo, views in self._state_views():
            n = int(c.num_embeddings)
            for k, view in views.items():
                block = local_block(built[param][k], n, comm.rank, comm.world_size, k)
                view.copy_(from_blocks(comm, block, lo, n))
        self._after_optimizer_load()

    def sharded_parameter_names(self, prefix: str = ""):
        for name, _ in self.named_parameters(prefix):
            yield name


def bridge_comm(rank: int, world: int, device: torch.device) -> Comm:
    """The collection's own groups (their collectives never interleave with DDP's on the default group): gloo
    on a CPU; on CUDA an NCCL group for the hot rows' gradients (device tensors: the exchange reads nothing back)
    beside a gloo group for the host tensors (cold rows, ids, counts). A collective: every rank calls it."""
    if world == 1:
        return Comm()
    import torch.distributed as dist

    if device.type == "cuda" and dist.is_nccl_available():
        return Comm(
            rank, world, dist.new_group(backend="nccl"), dist.new_group(backend="gloo"), backend="nccl"
        )
    return Comm(rank, world, dist.new_group(backend="gloo"))


def torchrec_init(config, count: int) -> np.ndarray:
    """``count`` new rows of a table as torchrec's sharded kernels initialise a shard: uniform in the config's
    ``[weight_init_min, weight_init_max]`` (default +-sqrt(1 / num_embeddings)) from torch's generator."""
    w = torch.empty((count, int(config.embedding_dim)), dtype=torch.float32)
    w.uniform_(config.get_weight_init_min(), config.get_weight_init_max())
    return w.numpy()


def _rowwise_adagrad() -> type:
    from torchrec.optim import RowWiseAdagrad

    return RowWiseAdagrad


_TORCH_CLASSES = {"sgd": lambda: torch.optim.SGD, "rowwise-adagrad": _rowwise_adagrad,
                  "adagrad": lambda: torch.optim.Adagrad, "adam": lambda: torch.optim.Adam}  # fmt: skip
"""The optimizer class torchrec's planner knows each of Hotline's sparse rules by (it sizes the state)."""


def register_planner_prices() -> None:
    """Lets torchrec's own planner (``DistributedModelParallel`` without a plan) price Hotline's kernel.

    torchrec prices a compute kernel by a bandwidth per device (bytes/ms) from a table with no entry for
    ``customized_kernel``, and its hardware config's ``kernel_device_bandwidths`` (the table's overrides) is where
    a kernel it does not ship is given one. Hotline's: on a CPU rows are read from host memory (torchrec's figure
    for its fused CPU kernel), on CUDA hot rows from HBM and the rest from host memory (its figure for UVM
    caching). Entries already there (a user's own) are kept. Called when this module is imported."""
    from torchrec.distributed.planner import constants as k
    from torchrec.distributed.planner.estimator.types import HardwarePerfConfig

    table = HardwarePerfConfig.kernel_device_bandwidths
    table.setdefault(("cpu", KERNEL), k.DDR_MEM_BW)
    caching = k.UVM_CACHING_RATIO * k.HBM_MEM_BW + (1 - k.UVM_CACHING_RATIO) * k.HBM_TO_DDR_MEM_BW
    table.setdefault(("cuda", KERNEL), caching / 10)


register_planner_prices()


_FUSED_PARAM_NAMES = {"optimizer": None, "learning_rate": "lr", "lr": "lr", "eps": "eps", "beta1": "beta1",
                      "beta2": "beta2", "weight_decay": "weight_decay"}  # fmt: skip


def requested_optimizer(module: HotlineEmbeddingBagCollection, fused_params: dict | None,
                        where: str = "the collection") -> SparseOptimizer | None:  # fmt: skip
    """The fused rule torchrec would give the sharded tables: ``apply_optimizer_in_backward``'s class and kwargs
    on the tables' parameters over the sharder's ``fused_params`` (torchrec's precedence); None when neither
    names one (the module's own rule stays). ``eps`` defaults to fbgemm's 1e-8, as under torchrec's sharder."""
    fused = dict(fused_params or {})
    unknown = sorted(set(fused) - set(_FUSED_PARAM_NAMES))
    if unknown:
        raise ValueError(f"fused_params {unknown} are not supported by Hotline's sharder (it takes "
                         f"{', '.join(_FUSED_PARAM_NAMES)})")  # fmt: skip
    kind = fused.pop("optimizer", None)
    kwargs = {_FUSED_PARAM_NAMES[k]: v for k, v in fused.items()}
    request = in_backward_request(module._modules["embedding_bags"])
    if request is not None:
        kind = request[0]
        kwargs.update(request[1])
    if kind is None:
        if kwargs:
            raise ValueError(f"fused_params of Hotline's sharder set {sorted(fused)} for {where} but no "
                             "'optimizer' (an EmbOptimType)")  # fmt: skip
        return None
    kwargs.setdefault("eps", 1e-8)  # fbgemm's TBE default, what torchrec's sharded kernels use
    return sparse_optimizer(kind, kwargs, int(module.embedding_bag_configs()[0].embedding_dim))


class HotlineEmbeddingBagCollectionSharder(ModuleSharder[HotlineEmbeddingBagCollection]):
    """torchrec's ModuleSharder for :class:`HotlineEmbeddingBagCollection` (``row_wise`` /
    ``customized_kernel``): hot rows replicated, cold rows sharded by row over the ranks.

    ``fused_params`` (as torchrec's ``EmbeddingBagCollectionSharder(fused_params)``): ``optimizer`` (an
    ``EmbOptimType`` or an optimizer class), ``learning_rate``, ``eps``, ``beta1``, ``beta2``, ``weight_decay``;
    the sharded tables then update inside ``backward()``, as torchrec's fused kernels do.
    ``apply_optimizer_in_backward`` on the tables' parameters takes precedence, as in torchrec."""

    def __init__(self, fused_params: dict[str, Any] | None = None, qcomm_codecs_registry: dict | None = None):
        super().__init__(qcomm_codecs_registry)
        self._fused_params = dict(fused_params or {})

    @property
    def fused_params(self) -> dict[str, Any]:
        return self._fused_params

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
        rule = requested_optimizer(module, self._fused_params, where)
        return ShardedHotlineEmbeddingBagCollection(
            module, env, dev, rule, True if rule is not None else None
        )

    def shardable_parameters(self, module: HotlineEmbeddingBagCollection) -> dict[str, nn.Parameter]:
        """The tables' parameters. torchrec's planner sizes a table's optimizer state by the first class
        ``apply_optimizer_in_backward`` gave it; a table without one is offered as an alias (the same rows, no
        copy) naming the rule the sharded tables will apply."""
        out = {}
        rule = None
        for name, view in module._modules["embedding_bags"].items():
            w = view.weight
            if not getattr(w, "_optimizer_classes", None):
                if rule is None:
                    rule = requested_optimizer(module, self._fused_params) or module.optimizer
                w = nn.Parameter(w.detach(), requires_grad=False)
                w._optimizer_classes = [_TORCH_CLASSES[rule.kind]()]
            out[name] = w
        return out

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
