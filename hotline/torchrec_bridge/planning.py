"""The torchrec bridge: a Hotline profile becomes torchrec ``ParameterConstraints`` and a ``ShardingPlan``.

torchrec can plan tables as device-resident (``FUSED``) or as a device cache over host memory
(``FUSED_UVM_CACHING``) whose size is a *load factor* (cached share of the rows), and its planner reads a
:class:`~torchrec.distributed.types.CacheStatistics` per table (expected unique lookups per batch, expected
miss rate for a load factor, cacheability) to rate plans and scale caches up. torchrec has that interface
but nothing that fills it from data; a Hotline profile has exactly the data:

- **LFU** (a static set of the most popular rows, which is what a Hotline placement is): the miss rate at a
  load factor is one minus the profile's coverage of the table by its most accessed rows.
- **LRU**: the miss rate comes from the LRU stack distances of the sampled trace (``hotline.kernels.reuse``):
  an LRU cache of ``C`` rows hits exactly the accesses whose distance is below ``C``. First accesses within
  the sample count as misses (rows seen once are mostly tail rows); at load factor 1 nothing misses.

A table whose hot share (under Hotline's placement) reaches ``whole_table_share`` is kept whole on the device
(``FUSED``); the others get ``FUSED_UVM_CACHING`` with ``load_factor`` = the hot share Hotline chose. A torchrec
plan cannot say *which* rows are hot, and its serialisation drops cache parameters, so :func:`export_plan`
writes ``plan.json`` (every table, with its cache parameters and figures) and a side-car
``plan.hot_rows.npz`` (hot row ids per table and the dataset fingerprint, no pickle); :func:`load_plan` and
:func:`load_hot_rows` read them back.

Importing this module imports torchrec (about 3 s); ``hotline`` itself never does.
"""

from __future__ import annotations

import json
import math
import os
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# fbgemm-gpu-cpu and torchrec warn about their own deprecated internals on import; nothing a user can act on.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"(fbgemm_gpu|torchrec)(\.|$)")

import torch  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm  # noqa: E402
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig  # noqa: E402
from torchrec.distributed.embedding_types import EmbeddingComputeKernel  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints  # noqa: E402
from torchrec.distributed.planner.proposers import EmbeddingOffloadScaleupProposer  # noqa: E402
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation  # noqa: E402
from torchrec.distributed.planner.types import (  # noqa: E402
    HardwareConfig,
    KernelConfig,
    PlannerError,
    Topology,
    TopologyFactory,
    TrainerConfig,
)
from torchrec.distributed.types import (  # noqa: E402
    CacheParams,
    CacheStatistics,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
)

from hotline.kernels.reuse import lru_hit_counts, stack_distances  # noqa: E402
from hotline.placement import Placement, PlacementError  # noqa: E402
from hotline.units import format_size, parse_size  # noqa: E402

PLAN_FORMAT = "hotline-torchrec-plan/1"
HOT_ROWS_FORMAT = "hotline-hot-rows/1"
ALGORITHMS = {"lru": CacheAlgorithm.LRU, "lfu": CacheAlgorithm.LFU}
# Data-parallel tables are replicated dense parameters: not a place for a cache, and the enumerator only
# offers the dense kernel there (it warns for every table the constraints exclude it from).
SHARDING_TYPES = [
    ShardingType.TABLE_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.COLUMN_WISE.value,
]


class PlanError(ValueError):
    """torchrec found no plan for the tables, or a plan / hot-rows file is missing, corrupt or mismatched."""


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


# ---------------------------------------------------------------------------------------- cache statistics
class HotlineCacheStats(CacheStatistics):
    """torchrec ``CacheStatistics`` of one table, measured by a Hotline profile.

    The miss rate for a cache of ``C = floor(load_factor * rows)`` rows is ``1 - hits[min(C, len - 1)] /
    accesses``, where ``hits`` [K] is the cumulative hit count by cache size: the coverage of the C most
    popular rows (LFU) or the accesses with an LRU stack distance below C (LRU).
    """

    def __init__(
        self, rows: int, hits: np.ndarray, accesses: int, expected_lookups: float, algorithm: str = "lru"
    ):
        self.rows = int(rows)
        """Rows of the table."""
        self.hits = np.asarray(hits, dtype=np.int64)
        """Cumulative accesses served by a cache of 0, 1, 2, ... rows (hits[0] = 0, non-decreasing)."""
        self.accesses = int(accesses)
        """Accesses of the table in the profiled sample."""
        self.algorithm = algorithm
        """``lru`` or ``lfu``: which cache the curve models."""
        self._expected_lookups = float(expected_lookups)
        if self.hits.ndim != 1 or self.hits.size == 0 or self.hits[0] != 0 or (np.diff(self.hits) < 0).any():
            raise ValueError("hits must be a non-empty, non-decreasing 1-D count array starting at 0")
        if self.hits[-1] > self.accesses:
            raise ValueError(f"hits end at {self.hits[-1]}, more than the {self.accesses} accesses")
        miss = np.array([self.expected_miss_rate(x) for x in np.linspace(0.0, 1.0, 101)])
        self._cacheability = float((miss.sum() - 0.5 * (miss[0] + miss[-1])) / 100)  # trapezoid rule

    def __deepcopy__(self, memo) -> HotlineCacheStats:
        # Immutable, and the planner deep-copies every sharding option many times: share the arrays.
        return self

    @property
    def expected_lookups(self) -> float:
        """Expected distinct rows of this table in one global training batch."""
        return self._expected_lookups

    def expected_miss_rate(self, clf: float) -> float:
        """Expected share of lookups that miss a cache of ``clf * rows`` rows (1 at 0, 0 at 1)."""
        clf = min(max(float(clf), 0.0), 1.0)
        if self.accesses == 0 or clf >= 1.0:
            return 0.0
        c = min(int(math.floor(clf * self.rows)), self.hits.size - 1)
        return 1.0 - float(self.hits[c]) / self.accesses

    @property
    def cacheability(self) -> float:
        """Area under the miss-rate curve over load factors 0..1: 0 caches perfectly, 1 not at all."""
        return self._cacheability

    def __repr__(self) -> str:
        return (
            f"HotlineCacheStats({self.algorithm}, rows={self.rows}, expected_lookups={self.expected_lookups:.1f},"
            f" cacheability={self.cacheability:.3f})"
        )


def sampled_trace(profile, max_samples: int | None = None) -> np.ndarray:
    """The ids the profile sampled, in trace order, as int32 [n, T, L] (at most ``max_samples`` samples)."""
    if profile.dataset is None:
        raise PlanError("the profile has no dataset attached: the LRU curve needs its sampled trace")
    split = profile.dataset.split(profile.profiler.split)
    n = profile.num_samples if max_samples is None else min(profile.num_samples, int(max_samples))
    if profile.sample_indices is None:
        return np.ascontiguousarray(split.sparse[:n])
    return np.ascontiguousarray(split.sparse[profile.sample_indices[:n]])


def lru_hit_curves(profile, max_samples: int | None = 1 << 20) -> list[tuple[np.ndarray, int]]:
    """Per table, ``(hits, accesses)`` of an LRU cache over the profile's sampled trace (see
    :class:`HotlineCacheStats`). A uniform sample (FAE's default) shortens reuse distances compared with the
    full trace; a ``sample_batches`` profile (a contiguous prefix) gives that prefix's exact curve."""
    trace = sampled_trace(profile, max_samples)
    n, T, L = trace.shape
    per_table = np.ascontiguousarray(trace.transpose(1, 0, 2).reshape(T, n * L))
    distances = stack_distances(per_table)
    return [(lru_hit_counts(distances[t]), n * L) for t in range(T)]


def lfu_hit_curves(profile) -> list[tuple[np.ndarray, int]]:
    """Per table, ``(hits, accesses)`` of a static cache of the most accessed rows (the coverage curve)."""
    out = []
    for t in range(profile.num_tables):
        counts = profile.table_counts(t)
        ranked = np.sort(counts[counts > 0])[::-1]
        out.append((np.concatenate([[0], np.cumsum(ranked)]).astype(np.int64), profile.lookups_per_table))
    return out


def expected_unique_lookups(profile, global_batch_size: int) -> np.ndarray:
    """float64 [T]: expected distinct rows per table in a batch of ``global_batch_size`` samples, each row
    drawn independently with its sampled frequency."""
    draws = int(global_batch_size) * profile.pooling_factor
    out = np.zeros(profile.num_tables)
    for t in range(profile.num_tables):
        p = profile.table_counts(t) / float(max(1, profile.lookups_per_table))
        p = p[p > 0]
        out[t] = float(-np.expm1(draws * np.log1p(-np.minimum(p, 1.0))).sum())
    return out


def cache_stats(
    profile, algorithm: str, global_batch_size: int, lru_max_samples: int | None = 1 << 20
) -> list[HotlineCacheStats]:
    """One :class:`HotlineCacheStats` per table of ``profile`` for an ``lru`` or ``lfu`` cache."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {algorithm!r}")
    curves = lru_hit_curves(profile, lru_max_samples) if algorithm == "lru" else lfu_hit_curves(profile)
    unique = expected_unique_lookups(profile, global_batch_size)
    return [
        HotlineCacheStats(size, hits, accesses, unique[t], algorithm)
        for t, (size, (hits, accesses)) in enumerate(zip(profile.table_sizes, curves))
    ]


# ---------------------------------------------------------------------------------------- constraints
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
            pooling_factors=[float(profile.pooling_factor)],
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


# ---------------------------------------------------------------------------------------- planning
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


def plan(
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


# ---------------------------------------------------------------------------------------- files
def hot_rows_path(plan_path: str | os.PathLike) -> Path:
    """The side-car next to a plan file: ``plan.json`` -> ``plan.hot_rows.npz``."""
    p = Path(plan_path)
    return p.with_name(f"{p.stem}.hot_rows.npz")


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def export_plan(
    path: str | os.PathLike, sharding_plan: ShardingPlan, inputs: PlanInputs, config: PlanConfig
) -> tuple[Path, Path]:
    """Writes ``plan.json`` (every table under ``tables``, with cache parameters, shards and figures) and the
    side-car of hot row ids next to it; returns both paths."""
    path = Path(path)
    summary = plan_summary(sharding_plan, inputs, config)
    by_name = parameter_shardings(sharding_plan)
    tables = []
    for c, s in zip(inputs.choices, summary.to_dict(orient="records")):
        module_path, ps = by_name[c.name]
        shards = []
        if isinstance(ps.sharding_spec, EnumerableShardingSpec):
            shards = [
                {
                    "offsets": list(m.shard_offsets),
                    "sizes": list(m.shard_sizes),
                    "placement": str(m.placement),
                }
                for m in ps.sharding_spec.shards
            ]
        tables.append(
            {
                **{k: _plain(v) for k, v in s.items()},
                "name": c.name,
                "feature_names": c.feature_names,
                "module_path": module_path,
                "cache_algorithm": config.algorithm if ps.cache_params is not None else None,
                "shards": shards,
            }
        )
    doc = {
        "format": PLAN_FORMAT,
        "dataset_fingerprint": inputs.dataset_fingerprint,
        "world_size": config.world_size,
        "compute_device": config.compute_device,
        "hbm_per_device": config.hbm_per_device,
        "batch_size": inputs.batch_size,
        "embedding_dim": inputs.configs[0].embedding_dim if inputs.configs else None,
        "hot_rows_file": hot_rows_path(path).name,
        "tables": tables,
    }
    _atomic_write(path, lambda f: f.write((json.dumps(doc, indent=2) + "\n").encode()))
    side = save_hot_rows(hot_rows_path(path), inputs.placement, [c.name for c in inputs.choices])
    return path, side


def _plain(v):
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating | float):
        return None if math.isnan(float(v)) else float(v)
    return v


def load_plan(path: str | os.PathLike) -> ShardingPlan:
    """Reads a ``plan.json`` written by :func:`export_plan` back into a torchrec ``ShardingPlan``, cache
    parameters (algorithm, load factor) included (the statistics are not stored)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise PlanError(f"plan file {path} does not exist") from e
    except json.JSONDecodeError as e:
        raise PlanError(f"plan file {path} is not valid JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        raise PlanError(
            f"plan file {path}: format is {doc.get('format') if isinstance(doc, dict) else None!r}, "
            f"expected {PLAN_FORMAT!r}"
        )
    modules: dict[str, EmbeddingModuleShardingPlan] = {}
    for i, t in enumerate(doc.get("tables", [])):
        try:
            algorithm = t["cache_algorithm"]
            cache = (
                CacheParams(algorithm=ALGORITHMS[algorithm], load_factor=t["load_factor"])
                if algorithm is not None
                else None
            )
            spec = (
                EnumerableShardingSpec(
                    [ShardMetadata(s["offsets"], s["sizes"], s["placement"]) for s in t["shards"]]
                )
                if t["shards"]
                else None
            )
            ps = ParameterSharding(
                sharding_type=t["sharding"],
                compute_kernel=t["kernel"],
                ranks=list(t["ranks"]),
                sharding_spec=spec,
                cache_params=cache,
            )
            modules.setdefault(t["module_path"], EmbeddingModuleShardingPlan())[t["name"]] = ps
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"plan file {path}: tables[{i}] is malformed ({type(e).__name__}: {e})") from e
    return ShardingPlan(modules)


@dataclass
class HotRows:
    """The side-car of a plan: hot row ids per table (Hotline's placement) and the dataset they came from."""

    table_names: list[str]
    """torchrec table names, in table order."""
    table_sizes: list[int]
    """Rows per table."""
    hot_ids: list[np.ndarray]
    """Per table, int64 hot row ids in hot-slot order."""
    dataset_fingerprint: str
    """Fingerprint of the profiled dataset."""
    embedding_dim: int
    """Embedding dimension the placement was made for."""
    bytes_per_row: int
    """Device bytes per hot row."""

    def by_name(self) -> dict[str, np.ndarray]:
        """Table name -> hot row ids."""
        return dict(zip(self.table_names, self.hot_ids))

    def to_placement(self) -> Placement:
        """The Placement these hot rows describe (e.g. to build a HotlineEmbeddingBagCollection)."""
        return Placement.from_hot_ids(
            self.table_sizes,
            self.hot_ids,
            dataset_fingerprint=self.dataset_fingerprint,
            embedding_dim=self.embedding_dim,
            bytes_per_row=self.bytes_per_row,
        )


def save_hot_rows(path: str | os.PathLike, placement: Placement, table_names: Sequence[str]) -> Path:
    """Writes the hot row ids of ``placement`` per table (named ``table_names``) as .npz (no pickle)."""
    path = Path(path)
    if len(table_names) != placement.num_tables:
        raise ValueError(f"{len(table_names)} table names for {placement.num_tables} tables")
    arrays = {
        "format": np.array(HOT_ROWS_FORMAT),
        "dataset_fingerprint": np.array(placement.dataset_fingerprint),
        "table_names": np.array([str(n) for n in table_names]),
        "table_sizes": np.array(placement.table_sizes, dtype=np.int64),
        "embedding_dim": np.array(placement.embedding_dim, dtype=np.int64),
        "bytes_per_row": np.array(placement.bytes_per_row, dtype=np.int64),
    }
    for t, ids in enumerate(placement.hot_ids):
        arrays[f"hot_ids_{t}"] = ids.astype(np.int64)
    _atomic_write(path, lambda f: np.savez_compressed(f, **arrays))
    return path


def load_hot_rows(path: str | os.PathLike, dataset=None) -> HotRows:
    """Reads a side-car written by :func:`save_hot_rows` (or :func:`export_plan`); with ``dataset`` (a
    Dataset) also checks it was made from that dataset."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"hot-rows file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["format"]) != HOT_ROWS_FORMAT:
                raise PlanError(
                    f"hot-rows file {path}: format is {str(z['format'])!r}, expected {HOT_ROWS_FORMAT!r}"
                )
            names = [str(n) for n in z["table_names"]]
            sizes = [int(s) for s in z["table_sizes"]]
            hot = [z[f"hot_ids_{t}"].astype(np.int64) for t in range(len(sizes))]
            rows = HotRows(
                names,
                sizes,
                hot,
                str(z["dataset_fingerprint"]),
                int(z["embedding_dim"]),
                int(z["bytes_per_row"]),
            )
    except PlanError:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise PlanError(f"hot-rows file {path} is corrupt or not a Hotline hot-rows file: {e}") from e
    if len(names) != len(sizes):
        raise PlanError(f"hot-rows file {path}: {len(names)} table names for {len(sizes)} tables")
    for name, size, ids in zip(names, sizes, hot):
        if ids.size and (ids.min() < 0 or ids.max() >= size):
            raise PlanError(f"hot-rows file {path}: table {name} has hot ids outside [0, {size})")
    if dataset is not None and dataset.fingerprint != rows.dataset_fingerprint:
        raise PlanError(
            f"hot-rows file {path} was made for dataset fingerprint {rows.dataset_fingerprint!r}, but dataset "
            f"{dataset.path} has fingerprint {dataset.fingerprint!r}"
        )
    return rows
