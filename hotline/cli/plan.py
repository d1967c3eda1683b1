"""``hotline plan DATASET``: profile a dataset and turn it into a torchrec sharding plan plus hot-row side-car."""

from __future__ import annotations

import argparse
from pathlib import Path

from hotline.cli.args import (
    SubParsers,
    add_embedding,
    add_force,
    add_output,
    add_progress,
    add_sampling,
    add_threads,
    error,
    sample_fraction,
)
from hotline.table_layout import OPTIMIZERS, bytes_per_row
from hotline.units import format_size, size_arg


def add_parser(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="turn a profile into a torchrec sharding plan (ParameterConstraints with cache statistics)",
        description="Profile a dataset and run torchrec's EmbeddingShardingPlanner for its DLRM "
        "(sparse_arch.embedding_bag_collection): per table a device kernel or a UVM cache whose load factor is "
        "Hotline's hot share, with CacheStatistics from the profile; --target hotline plans Hotline's sharder. "
        "Writes plan.json and plan.hot_rows.npz (hot row ids per table).",
    )
    parser.add_argument("dataset", metavar="DATASET", help="dataset directory (from `hotline data ...`)")
    parser.add_argument(
        "--placement", type=Path, default=None, metavar="FILE", help="hot rows from `hotline profile --out`"
    )
    for flag, kw in (
        ("--world-size", dict(type=int, default=1, metavar="N", help="number of devices (default 1)")),
        ("--hbm-per-gpu", dict(type=size_arg, default="16GiB", metavar="SIZE", help="memory per device (default 16GiB)")),
        ("--compute-device", dict(default="cuda", choices=["cuda", "cpu"], help="topology to plan for (default cuda)")),
        ("--algorithm", dict(default="lru", choices=["lru", "lfu"], help="cache algorithm (default lru)")),
        ("--batch-size", dict(type=int, default=None, metavar="B", help="per-rank batch size (default --mini-batch-size)")),
        ("--target", dict(default="torchrec", choices=["torchrec", "hotline"],
                          help="torchrec's kernels (FUSED / FUSED_UVM_CACHING) or Hotline's sharder (default torchrec)")),
    ):  # fmt: skip
        parser.add_argument(flag, **kw)
    parser.add_argument("--no-scaleup", action="store_true", help="keep Hotline's load factors as they are")
    add_sampling(parser)
    add_embedding(parser)
    add_output(parser, "--out", "write plan.json and its side-car")
    add_force(parser)
    add_threads(parser, "Numba threads")
    add_progress(parser)
    parser.set_defaults(func=run, declare=declare)


def declare(args: argparse.Namespace):
    """Outputs (the plan and its hot-rows side-car) and inputs for the output policy (:mod:`hotline.outputs`)."""
    import os

    from hotline.outputs import Output
    from hotline.torchrec_bridge.plan_files import hot_rows_path

    side = None if args.out is None else hot_rows_path(os.path.realpath(args.out))
    outputs = [Output("--out", args.out), Output("--out (its hot-rows side-car)", side)]
    return outputs, [("DATASET", args.dataset), ("--placement", args.placement)]


def _table_text(summary) -> str:
    def lf(v):
        return "-" if v is None or v != v else f"{v:.3f}"

    df = summary.copy()
    df["load factor"] = [f"{lf(a)} -> {lf(b)}" for a, b in zip(df.hotline_load_factor, df.load_factor)]
    df["hit rate"] = df.expected_hit_rate.map("{:.1%}".format)
    df["HBM"] = df.hbm_bytes.map(format_size)
    df["ranks"] = df.ranks.map(lambda r: ",".join(map(str, r)))
    df = df.rename(columns={"hot_rows": "hot rows", "expected_unique_lookups": "unique/batch"})
    df["unique/batch"] = df["unique/batch"].map("{:.1f}".format)
    cols = [
        "table",
        "rows",
        "hot rows",
        "kernel",
        "sharding",
        "ranks",
        "load factor",
        "hit rate",
        "HBM",
        "unique/batch",
    ]
    return df[cols].to_string(index=False)


def _dlrm_on_meta(configs):
    """torchrec's DLRM over torchrec's collection, on the meta device (nothing allocated): what is planned."""
    import torch
    from torchrec import EmbeddingBagCollection
    from torchrec.models.dlrm import DLRM

    meta = torch.device("meta")
    dim = configs[0].embedding_dim
    return DLRM(embedding_bag_collection=EmbeddingBagCollection(tables=configs, device=meta), dense_in_features=1,
                dense_arch_layer_sizes=[dim], over_arch_layer_sizes=[1, 1], dense_device=meta)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    import logging

    from hotline.datasets.format import Dataset, DatasetError
    from hotline.pipeline.threads import set_numba_threads
    from hotline.placement import Placement, PlacementError
    from hotline.profiling.profiler import profile

    if args.threads:
        set_numba_threads(args.threads)
    # torchrec logs planner warnings meant for its developers (topology construction, proposer internals).
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    from hotline import torchrec_bridge as bridge

    try:
        config = bridge.PlanConfig(  # its bounds are checked before the dataset is read
            world_size=args.world_size,
            hbm_per_device=args.hbm_per_gpu,
            compute_device=args.compute_device,
            batch_size=args.batch_size,
            algorithm=args.algorithm,
            scaleup=not args.no_scaleup,
        )
        dataset = Dataset(args.dataset)
        placement = Placement.load(args.placement, dataset=dataset) if args.placement else None
        dim = placement.embedding_dim if placement else args.embedding_dim
        optimizer = args.optimizer
        if placement is not None:
            optimizer = next(
                (o for o in OPTIMIZERS if bytes_per_row(dim, o) == placement.bytes_per_row), "sgd"
            )
        prof = profile(
            dataset,
            sample_fraction=sample_fraction(args),
            sample_batches=args.sample_batches,
            mini_batch_size=args.mini_batch_size,
            seed=args.seed,
            embedding_dim=dim,
            optimizer=optimizer,
            progress=not args.no_progress,
        )
        model = _dlrm_on_meta(bridge.embedding_bag_configs(prof.table_sizes, dim))
        sharding_plan, inputs = bridge.plan(model, prof, config, target=args.target, placement=placement)
        summary = bridge.plan_summary(sharding_plan, inputs, config)
    except (DatasetError, PlacementError, bridge.PlanError, ValueError, OSError) as e:
        return error("plan", e)

    source = f"placement {args.placement}" if placement is not None else "hot rows chosen by Hotline"
    kernels = f"{config.algorithm.upper()} caches" if args.target == "torchrec" else "Hotline's sharder"
    print(
        f"torchrec plan for {config.world_size} x {format_size(config.hbm_per_device)} {config.compute_device} "
        f"devices, {kernels}, per-rank batch {inputs.batch_size}; {source} "
        f"({inputs.placement.num_hot:,} of {sum(prof.table_sizes):,} rows hot)"
    )
    print(_table_text(summary))
    print(
        f"HBM for embeddings: {format_size(int(summary.hbm_bytes.sum()))} over {config.world_size} device(s)"
    )
    if args.out is not None:
        try:
            plan_path, side = bridge.export_plan(
                args.claim.path("--out"), sharding_plan, inputs, config, force=True
            )
        except OSError as e:  # an unwritable or full output location: one line, no traceback
            return error("plan", e)
        print(f"plan written to {plan_path} ({len(inputs.choices)} tables), hot rows to {side}")
    return 0
