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

import warnings

# fbgemm-gpu-cpu and torchrec warn about their own deprecated internals on import; nothing a user can act on.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"(fbgemm_gpu|torchrec)(\.|$)")

from hotline.torchrec_bridge.cache_stats import (  # noqa: E402
    HotlineCacheStats,
    cache_stats,
    expected_unique_lookups,
    lfu_hit_curves,
    lru_hit_curves,
    sampled_trace,
)
from hotline.torchrec_bridge.fused_optim import HotlineFusedOptimizer, sparse_optimizer  # noqa: E402
from hotline.torchrec_bridge.model_plans import model_tables, plan, plan_model  # noqa: E402
from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection, kjt_from_sparse  # noqa: E402
from hotline.torchrec_bridge.pipelines import CpuPrefetchTrainPipelineSparseDist  # noqa: E402
from hotline.torchrec_bridge.plan_files import (  # noqa: E402
    HotRows,
    export_plan,
    hot_rows_path,
    load_hot_rows,
    load_plan,
    save_hot_rows,
)
from hotline.torchrec_bridge.planner import HotlinePlanner  # noqa: E402
from hotline.torchrec_bridge.planning import (  # noqa: E402
    ALGORITHMS,
    PlanConfig,
    PlanError,
    PlanInputs,
    TableChoice,
    choose_placement,
    constraints_from_profile,
    default_names,
    embedding_bag_configs,
    parameter_shardings,
    plan_inputs,
    plan_summary,
    topology,
)
from hotline.torchrec_bridge.sharding import (  # noqa: E402
    HotlineEmbeddingBagCollectionSharder,
    ShardedHotlineEmbeddingBagCollection,
    find_collections,
    hotline_sharding_plan,
)

__all__ = [
    "ALGORITHMS",
    "CpuPrefetchTrainPipelineSparseDist",
    "HotlineEmbeddingBagCollection",
    "HotlineEmbeddingBagCollectionSharder",
    "HotlineFusedOptimizer",
    "HotlinePlanner",
    "ShardedHotlineEmbeddingBagCollection",
    "find_collections",
    "hotline_sharding_plan",
    "kjt_from_sparse",
    "model_tables",
    "plan_inputs",
    "plan_model",
    "sparse_optimizer",
    "HotRows",
    "HotlineCacheStats",
    "PlanConfig",
    "PlanError",
    "PlanInputs",
    "TableChoice",
    "cache_stats",
    "choose_placement",
    "constraints_from_profile",
    "default_names",
    "embedding_bag_configs",
    "expected_unique_lookups",
    "export_plan",
    "hot_rows_path",
    "lfu_hit_curves",
    "load_hot_rows",
    "load_plan",
    "lru_hit_curves",
    "parameter_shardings",
    "plan",
    "plan_summary",
    "sampled_trace",
    "save_hot_rows",
    "topology",
]
