"""Hotline profile -> torchrec ParameterConstraints -> a ShardingPlan from torchrec's planner (see the package docstring)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.proposers import EmbeddingOffloadScaleupProposer
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    HardwareConfig,
    KernelConfig,
    PlannerError,
    Topology,
    TopologyFactory,
    TrainerConfig,
)
from torchrec.distributed.types import (
    CacheParams,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
)

from hotline.placement import Placement, PlacementError
from hotline.torchrec_bridge.cache_stats import ALGORITHMS, HotlineCacheStats, PlanError, cache_stats
from hotline.units import format_size, parse_size

PLAN_FORMAT = "hotline-torchrec-plan/1"
HOT_ROWS_FORMAT = "hotline-hot-rows/1"
# Data-parallel tables are replicated dense parameters: not a place for a cache, and the enumerator only
# offers the dense kernel there (it warns for every table the constraints exclude it from).
SHARDING_TYPES = [
    ShardingType.TABLE_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.COLUMN_WISE.value,
]


def default_names(num_tables: int) -> tuple[list[str], list[str]]:
    """Table and feature names of torchrec's DLRM examples: ``t_cat_0``.., ``cat_0``.."""
    return [f"t_cat_{t}" for t in range(num_tables)], [f"cat_{t}" for t in range(num_tables)]


def embedding_bag_configs(
    table_sizes: Sequence[int],
    embedding_dim: int,
    table_names: Sequence[str] | None = None,
    feature_names: Sequence[str] | None = None,
) -> list[EmbeddingBagConfig]:
    """One torchrec ``EmbeddingBagConfig`` per table (one feature each, sum pooling)."""
    names, features = default_names(len(table_sizes))
    names = list(table_names or names)
    features = list(feature_names or features)
    if len(names) != len(table_sizes) or len(features) != len(table_sizes):
        raise ValueError(
            f"{len(table_sizes)} tables but {len(names)} table names and {len(features)} feature names"
        )
    return [
        EmbeddingBagConfig(name=n, embedding_dim=int(embedding_dim), num_embeddings=int(r), feature_names=[f])
        for n, r, f in zip(names, table_sizes, features)
    ]


MAX_WORLD_SIZE = 1024
"""The most devices one plan is made for: torchrec's planner time grows with the device count (over a minute for
512 on two busy cores), and at a million it prints nothing for hours."""


@dataclass
class PlanConfig:
    """Where and how to plan: the devices, their memory, and how Hotline's hot share maps to torchrec."""

    world_size: int = 1
    """Number of devices (ranks)."""
    hbm_per_device: int | str = "16GiB"
    """Memory of each device, bytes or a size like '80GiB'."""
    compute_device: str = "cuda"
    """'cuda' (planning needs no GPU) or 'cpu' (every table FUSED in host memory; no caches)."""
    batch_size: int | None = None
    """Per-rank batch size the planner assumes; default the profile's mini-batch size."""
    algorithm: str = "lru"
    """Cache algorithm of FUSED_UVM_CACHING tables: 'lru' (torchrec's scale-up proposer models only LRU) or 'lfu'."""
    reserved_share: float = 0.15
    """Share of each device's memory torchrec reserves for dense parameters and activations."""
    hot_budget_share: float = 0.8
    """Share of the unreserved memory Hotline fills with hot rows (the rest holds cache metadata and I/O)."""
    whole_table_share: float = 0.9
    """A table whose hot share reaches this is kept whole on the device (FUSED) instead of cached."""
    min_load_factor: float = 0.001
    """Smallest cache load factor (torchrec drops caches of load factor 0 from scale-up)."""
    scaleup: bool = True
    """Use torchrec's EmbeddingOffloadScaleupProposer for LRU caches (it grows caches into spare memory)."""
    lru_max_samples: int | None = 1 << 20
    """Samples of the profiled trace used for the LRU curve (the stack-distance pass is O(n log n))."""

    def __post_init__(self) -> None:
        if int(self.world_size) < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}")
        if int(self.world_size) > MAX_WORLD_SIZE:
            raise ValueError(
                f"world_size (--world-size) must be at most {MAX_WORLD_SIZE}, got {self.world_size}: torchrec's "
                "planner takes longer the more devices; plan one group of nodes and repeat its plan"
            )
        self.hbm_per_device = parse_size(self.hbm_per_device)
        if self.hbm_per_device <= 0:
            raise ValueError("hbm_per_device must be positive")
        if self.compute_device not in ("cuda", "cpu"):
            raise ValueError(f"compute_device must be 'cuda' or 'cpu', got {self.compute_device!r}")
        if self.batch_size is not None and int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {self.algorithm!r}")
        for name in ("reserved_share", "hot_budget_share", "whole_table_share", "min_load_factor"):
            v = float(getattr(self, name))
            if not (0.0 <= v <= 1.0) or (name != "reserved_share" and v == 0.0):
                raise ValueError(f"{name} must be in (0, 1] (reserved_share in [0, 1]), got {v}")

    @property
    def hot_budget(self) -> int:
        """Bytes of hot rows over all devices that Hotline places."""
        usable = self.world_size * self.hbm_per_device * (1.0 - self.reserved_share)
        return int(usable * self.hot_budget_share)


@dataclass
class TableChoice:
    """What the bridge chose for one table."""

    name: str
    """torchrec table name."""
    feature_names: list[str]
    """Features looked up in it."""
    rows: int
    """Rows of the table."""
    hot_rows: int
    """Rows Hotline's placement makes hot."""
    kernel: str
    """torchrec compute kernel asked for: 'fused' or 'fused_uvm_caching'."""
    load_factor: float | None
    """Cache load factor (hot share) for a cached table, else None."""
    stats: HotlineCacheStats
    """The profile's cache statistics of the table."""


@dataclass
class PlanInputs:
    """Everything torchrec's planner needs from Hotline: tables, constraints, and the placement behind them."""

    configs: list[EmbeddingBagConfig]
    """One EmbeddingBagConfig per table."""
    constraints: dict[str, ParameterConstraints]
    """Per table name."""
    choices: list[TableChoice]
    """Per table, in table order."""
    placement: Placement
    """Hot rows per table."""
    bytes_per_row: int
    """Device bytes per row (embedding plus optimizer state)."""
    pooling_factor: int
    """Lookups per table per sample."""
    dataset_fingerprint: str = ""
    """Fingerprint of the dataset the profile came from."""
    batch_size: int = 128
    """Per-rank batch size assumed."""
    figures: dict = field(default_factory=dict)
    """Hotline's own figures (budget, hot rows) for reports."""


def choose_placement(profile, budget: int, whole_table_share: float) -> Placement:
    """Hotline's hot rows under ``budget`` bytes, with tables whose hot share reaches ``whole_table_share``
    made hot whole (their never-sampled rows too; the largest dropped first if they do not all fit), then,
    smallest first, any other table whose missing rows fit the budget that is left."""
    placement = profile.placement(budget)
    whole = [
        t
        for t, (h, n) in enumerate(zip(placement.hot_ids, profile.table_sizes))
        if h.size >= whole_table_share * n
    ]
    while whole:
        try:
            placement = profile.placement(budget, always_hot=whole)
            break
        except PlacementError:
            whole.remove(max(whole, key=lambda t: profile.table_sizes[t]))
    # Budget left over means every sampled row is hot already: spend it on keeping small tables whole.
    spare = budget - placement.hot_bytes
    extra = sorted(
        (t for t in range(profile.num_tables) if t not in whole),
        key=lambda t: profile.table_sizes[t],
    )
    added = False
    for t in extra:
        cost = (profile.table_sizes[t] - placement.hot_ids[t].size) * placement.bytes_per_row
        if cost <= spare:
            whole.append(t)
            spare -= cost
            added = True
    return profile.placement(budget, always_hot=whole) if added else placement


def constraints_from_profile(
    profile,
    config: PlanConfig,
    placement: Placement | None = None,
    table_names: Sequence[str] | None = None,
    feature_names: Sequence[str] | None = None,
) -> PlanInputs:
    """torchrec ``ParameterConstraints`` per table from a Hotline profile (and, optionally, a placement made
    from it; default: :func:`choose_placement` under ``config.hot_budget``)."""
    if placement is None:
        placement = choose_placement(profile, config.hot_budget, config.whole_table_share)
    elif placement.table_sizes != list(profile.table_sizes):
        raise PlacementError(
            f"placement has table sizes {placement.table_sizes}, the profile {list(profile.table_sizes)}"
        )
    batch = int(config.batch_size or profile.mini_batch_size)
    dim = int(profile.profiler.embedding_dim)
    configs = embedding_bag_configs(profile.table_sizes, dim, table_names, feature_names)
    stats = cache_stats(profile, config.algorithm, batch * config.world_size, config.lru_max_samples)
    choices, constraints = [], {}
    for t, cfg in enumerate(configs):
        rows, hot = cfg.num_embeddings, int(placement.hot_ids[t].size)
        share = hot / rows
        cached = config.compute_device == "cuda" and share < config.whole_table_share
        kernel = EmbeddingComputeKernel.FUSED_UVM_CACHING if cached else EmbeddingComputeKernel.FUSED
        load_factor = max(share, config.min_load_factor) if cached else None
        cache_params = (
            CacheParams(algorithm=ALGORITHMS[config.algorithm], load_factor=load_factor, stats=stats[t])
            if cached
            else None
        )
        constraints[cfg.name] = ParameterConstraints(
            sharding_types=list(SHARDING_TYPES),
            compute_kernels=[kernel.value],
            pooling_factors=[float(profile.table_lookups[t]) / max(1, profile.num_samples)],  # L_t (measured)
            cache_params=cache_params,
        )
        choices.append(
            TableChoice(cfg.name, list(cfg.feature_names), rows, hot, kernel.value, load_factor, stats[t])
        )
    return PlanInputs(
        configs=configs,
        constraints=constraints,
        choices=choices,
        placement=placement,
        bytes_per_row=int(profile.bytes_per_row),
        pooling_factor=int(profile.pooling_factor),
        dataset_fingerprint=placement.dataset_fingerprint,
        batch_size=batch,
        figures={"hot_budget_bytes": placement.hbm_budget_bytes, "hot_rows": placement.num_hot},
    )


def topology(config: PlanConfig) -> Topology:
    """The torchrec Topology of ``config``: ``world_size`` devices of ``hbm_per_device`` bytes each."""
    cap = int(config.hbm_per_device)
    return TopologyFactory.create_topology(
        TrainerConfig(
            world_size=int(config.world_size), local_world_size=int(config.world_size), hbm_cap_bytes=cap
        ),
        hardware_config=HardwareConfig(hbm_cap_bytes=cap),
        kernel_config=KernelConfig(compute_device=config.compute_device),
    )


def plan_inputs(
    inputs: PlanInputs, config: PlanConfig, module: torch.nn.Module | None = None, sharders=None
) -> ShardingPlan:
    """Runs torchrec's ``EmbeddingShardingPlanner`` on ``module`` (default: an EmbeddingBagCollection of
    ``inputs.configs`` on the meta device) with Hotline's constraints; returns the ``ShardingPlan``.

    With LRU caches and ``config.scaleup`` the proposer is ``EmbeddingOffloadScaleupProposer``, which starts
    from Hotline's load factors and grows caches into spare memory by the profile's cacheability."""
    if module is None:
        module = EmbeddingBagCollection(tables=inputs.configs, device=torch.device("meta"))
    sharders = sharders or [EmbeddingBagCollectionSharder()]
    cached = any(c.load_factor is not None for c in inputs.choices)
    proposer = (
        [EmbeddingOffloadScaleupProposer()]
        if cached and config.scaleup and config.algorithm == "lru"
        else None
    )
    planner = EmbeddingShardingPlanner(
        topology=topology(config),
        batch_size=inputs.batch_size,
        storage_reservation=FixedPercentageStorageReservation(float(config.reserved_share)),
        proposer=proposer,
        constraints=inputs.constraints,
        debug=False,
    )
    try:
        return planner.plan(module, sharders)
    except PlannerError as e:
        raise PlanError(
            f"torchrec found no plan on {config.world_size} x {format_size(config.hbm_per_device)} "
            f"{config.compute_device} devices: {str(e).splitlines()[0]}"
        ) from e


def parameter_shardings(sharding_plan: ShardingPlan) -> dict[str, tuple[str, ParameterSharding]]:
    """Table name -> (module path, ParameterSharding) over every module of a plan."""
    out = {}
    for path, module_plan in sharding_plan.plan.items():
        for name, ps in module_plan.items():
            out[name] = (path, ps)
    return out


def plan_summary(sharding_plan: ShardingPlan, inputs: PlanInputs, config: PlanConfig):
    """A pandas DataFrame, one row per table: kernel, sharding, ranks, Hotline's load factor, the plan's,
    expected hit rate of the device copy, and the bytes it keeps in HBM (0 on a CPU topology)."""
    import pandas as pd

    by_name = parameter_shardings(sharding_plan)
    rows = []
    for c in inputs.choices:
        if c.name not in by_name:
            raise PlanError(f"table {c.name} is not in the sharding plan")
        _, ps = by_name[c.name]
        lf = ps.cache_params.load_factor if ps.cache_params is not None else None
        caching = ps.compute_kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING.value
        device_rows = math.ceil((lf or 0.0) * c.rows) if caching else c.rows
        if ps.compute_kernel == EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value:  # Hotline's sharder: hot rows
            caching, lf, device_rows = True, c.hot_rows / c.rows, c.hot_rows
        rows.append(
            {
                "table": c.name,
                "rows": c.rows,
                "kernel": ps.compute_kernel,
                "sharding": ps.sharding_type,
                "ranks": list(ps.ranks or []),
                "hot_rows": c.hot_rows,
                "hotline_load_factor": c.load_factor,
                "load_factor": lf if caching else None,
                "expected_hit_rate": 1.0 - c.stats.expected_miss_rate(lf) if caching else 1.0,
                "hbm_bytes": device_rows * inputs.bytes_per_row if config.compute_device == "cuda" else 0,
                "expected_unique_lookups": c.stats.expected_lookups,
                "cacheability": c.stats.cacheability,
            }
        )
    return pd.DataFrame(rows)
