"""A sharding plan for a whole model: every embedding-bag collection inside it, for torchrec's kernels or Hotline's.

:func:`plan_model` finds the collections of any model (``sparse_arch.embedding_bag_collection`` in torchrec's
DLRM, or several anywhere), checks their tables against the profile's (in module order), and plans them:

- ``target="torchrec"``: torchrec's ``EmbeddingShardingPlanner`` over the model with Hotline's constraints
  (``FUSED`` or ``FUSED_UVM_CACHING`` sized from the profile, as :func:`plan`);
- ``target="hotline"``: every table on Hotline's sharder (``row_wise`` / ``customized_kernel`` on every rank),
  with the hot rows Hotline chose. The model may still hold torchrec's collections: the plan names module
  paths, and the user builds ``HotlineEmbeddingBagCollection(tables, placement=hot_rows.to_placement())`` at
  those paths before ``DistributedModelParallel``.

Either plan goes through ``export_plan`` / ``load_plan`` (plan.json keeps each table's module path, kernel,
cache parameters and shards; plan.hot_rows.npz the hot rows) and straight into ``DistributedModelParallel``.
"""

from __future__ import annotations

import dataclasses

from torch import nn
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_modules import EmbeddingBagCollectionInterface

from hotline.torchrec_bridge.cache_stats import PlanError
from hotline.torchrec_bridge.planning import PlanConfig, PlanInputs, constraints_from_profile, plan_inputs
from hotline.torchrec_bridge.sharding import KERNEL, find_collections, hotline_sharding_plan

TARGETS = ("torchrec", "hotline")


def model_tables(model: nn.Module) -> tuple[dict[str, nn.Module], list]:
    """The embedding-bag collections of ``model`` by module path, and their tables' configs in module order."""
    found = find_collections(model, EmbeddingBagCollectionInterface)
    if not found:
        raise PlanError(f"{type(model).__name__} holds no embedding-bag collection to plan")
    return found, [c for m in found.values() for c in m.embedding_bag_configs()]


def plan_model(model: nn.Module, profile, config: PlanConfig, target: str = "torchrec", placement=None,
               sharders=None) -> tuple[ShardingPlan, PlanInputs]:  # fmt: skip
    """The plan of every collection inside ``model`` and the inputs behind it (see the module docstring)."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    found, configs = model_tables(model)
    sizes = [int(c.num_embeddings) for c in configs]
    if sizes != [int(s) for s in profile.table_sizes]:
        names = [f"{c.name}[{c.num_embeddings}]" for c in configs]
        raise PlanError(
            f"the model's tables {names} (in module order) do not match the profile's table sizes "
            f"{list(profile.table_sizes)}"
        )
    if (
        target == "hotline"
    ):  # a Hotline placement is a static most-accessed set: the LFU statistics describe it
        config = dataclasses.replace(config, algorithm="lfu", scaleup=False)
    inputs = constraints_from_profile(profile, config, placement, [c.name for c in configs],
                                      [c.feature_names[0] if c.feature_names else c.name for c in configs])  # fmt: skip
    inputs.configs = list(configs)
    for choice, c in zip(inputs.choices, configs):
        choice.feature_names = list(c.feature_names or [c.name])
    if target == "hotline":
        for choice in inputs.choices:
            choice.kernel, choice.load_factor = KERNEL, choice.hot_rows / choice.rows
        return hotline_sharding_plan(
            model, int(config.world_size), config.compute_device, kinds=found
        ), inputs
    from hotline.torchrec_bridge.module import HotlineEmbeddingBagCollection

    hotline_paths = [p for p, m in found.items() if isinstance(m, HotlineEmbeddingBagCollection)]
    if hotline_paths:
        raise PlanError(
            f"{hotline_paths[0]} is Hotline's collection: plan it with target='hotline' (torchrec's kernels plan "
            "torchrec's EmbeddingBagCollection)"
        )
    return plan_inputs(inputs, config, module=model, sharders=sharders), inputs


def plan(first, second, *args, **kwargs):
    """A torchrec ``ShardingPlan``, two ways:

    - ``plan(model, profile, config=PlanConfig(), target="torchrec" | "hotline", placement=None)``: every
      embedding-bag collection inside ``model`` (see :func:`plan_model`); returns ``(plan, inputs)``;
    - ``plan(inputs, config, module=None, sharders=None)``: torchrec's planner on Hotline's constraints
      (:func:`plan_inputs`); returns the plan.
    """
    if isinstance(first, PlanInputs):
        return plan_inputs(first, second, *args, **kwargs)
    config = args[0] if args else kwargs.pop("config", None)
    return plan_model(first, second, config if config is not None else PlanConfig(), *args[1:], **kwargs)
