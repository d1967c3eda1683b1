"""plan.json and its plan.hot_rows.npz side-car: written atomically, read back into torchrec objects."""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torchrec.distributed.types import (
    CacheParams,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ParameterSharding,
    ShardingPlan,
    ShardMetadata,
)

from hotline._io import atomic_write, write_json
from hotline._paths import check_file
from hotline.placement import Placement
from hotline.torchrec_bridge.planning import (
    ALGORITHMS,
    HOT_ROWS_FORMAT,
    PLAN_FORMAT,
    PlanConfig,
    PlanError,
    PlanInputs,
    parameter_shardings,
    plan_summary,
)


def hot_rows_path(plan_path: str | os.PathLike) -> Path:
    """The side-car next to a plan file: ``plan.json`` -> ``plan.hot_rows.npz``."""
    p = Path(plan_path)
    return p.with_name(f"{p.stem}.hot_rows.npz")


def export_plan(
    path: str | os.PathLike, sharding_plan: ShardingPlan, inputs: PlanInputs, config: PlanConfig,
    force: bool = False,
) -> tuple[Path, Path]:  # fmt: skip
    """Writes ``plan.json`` (every table under ``tables``, with cache parameters, shards and figures) and the
    side-car of hot row ids next to it; returns both paths. Existing files are replaced only with ``force``
    (:func:`hotline.outputs.guard`)."""
    from hotline.outputs import guard

    path = guard("export_plan path", path, force=force)  # a link's target
    guard("its hot-rows file", hot_rows_path(path), force=force)  # beside what is written
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
    write_json(path, doc)
    side = save_hot_rows(hot_rows_path(path), inputs.placement, [c.name for c in inputs.choices], force=True)
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
    path = check_file(path, "plan file", PlanError)
    try:
        doc = json.loads(path.read_text())
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


def save_hot_rows(
    path: str | os.PathLike, placement: Placement, table_names: Sequence[str], force: bool = False
) -> Path:
    """Writes the hot row ids of ``placement`` per table (named ``table_names``) as .npz (no pickle); an
    existing file is replaced only with ``force`` (:func:`hotline.outputs.guard`)."""
    from hotline.outputs import guard

    path = guard("save_hot_rows path", path, force=force)
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
    atomic_write(path, lambda f: np.savez_compressed(f, **arrays))
    return path


def load_hot_rows(path: str | os.PathLike, dataset=None) -> HotRows:
    """Reads a side-car written by :func:`save_hot_rows` (or :func:`export_plan`); with ``dataset`` (a
    Dataset) also checks it was made from that dataset."""
    path = Path(path)
    check_file(path, "hot-rows file", PlanError)
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
