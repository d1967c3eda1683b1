"""Benchmark: one DLRM trained four ways on the same batches, side by side: torchrec's EmbeddingBagCollection
(dense gradients), torchrec's FusedEmbeddingBagCollection (fbgemm's CPU kernels, update in backward), Hotline's
collection under DistributedModelParallel with Hotline's sharder, and Hotline's own trainer.

Equal work: the same synthetic dataset (``hotline.datasets.synthetic.generate``: the 26 Criteo Kaggle tables
capped at ``--max-rows-per-table``, Zipf ``--zipf`` ids), mini-batches of ``--batch``, embedding dim ``--dim``,
bottom MLP 13-64-dim, top MLP 64-1 (torchrec's DLRM, or Hotline's with the same layers), SGD with learning
rate 0.1 everywhere. Hotline's two variants use one placement: ``hotline.profile`` over ``--profile-fraction``
of the training split, hot rows under ``--budget-share`` of the embedding bytes. After ``--warmup`` steps
each, ``--rounds`` rounds run ``--steps`` steps per variant, variants interleaved within a round so load
changes on a shared machine hit all alike. Reported per variant: samples/s (median over rounds) and, for
Hotline's, the measured hot-lookup share, popular-sample share and cold rows per step beside it; the ratio of
Hotline's collection to torchrec's fused one is the figure the torchrec issue targets (within 10%).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import common


def variants(dataset, placement, placement_path, args):
    """label -> (step function over a prepared batch, figures function or None)."""
    import torch
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

    from hotline import TrainConfig, Trainer
    from hotline import torchrec_bridge as tb

    configs = tb.embedding_bag_configs(dataset.table_sizes, args.dim)
    bottom, top = [64, args.dim], [64, 1]

    def dlrm(ebc):
        torch.manual_seed(args.seed)
        return DLRM(embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=bottom,
                    over_arch_layer_sizes=top)  # fmt: skip

    def loop(model, opts):
        def step(b):
            logits = model(b["dense"], b["kjt"]).squeeze(1)
            torch.nn.functional.binary_cross_entropy_with_logits(logits, b["labels"]).backward()
            for o in opts:
                o.step()
                o.zero_grad()

        return step

    out = {}
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    dense_model = dlrm(ebc)
    out["torchrec_ebc_dense"] = (loop(dense_model, [torch.optim.SGD(dense_model.parameters(), lr=0.1)]), None)

    fused = FusedEmbeddingBagCollection(configs, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.1})
    fused_model = dlrm(fused)
    dense_params = [p for n, p in fused_model.named_parameters() if "embedding_bags" not in n]
    out["torchrec_fused_ebc"] = (loop(fused_model, [torch.optim.SGD(dense_params, lr=0.1)]), None)

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    ours = tb.HotlineEmbeddingBagCollection(configs, placement, optimizer_type=torch.optim.SGD,
                                            optimizer_kwargs={"lr": 0.1}, max_lookups=args.batch * len(configs))  # fmt: skip
    model = dlrm(ours)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   plan=tb.hotline_sharding_plan(model, 1), device=torch.device("cpu"),
                                   sharders=[tb.HotlineEmbeddingBagCollectionSharder()])  # fmt: skip
    dense = {n: p for n, p in dmp.named_parameters() if "embedding_bags" not in n}
    opt = CombinedOptimizer(
        [dmp.fused_optimizer, KeyedOptimizerWrapper(dense, lambda ps: torch.optim.SGD(ps, lr=0.1))]
    )
    sharded = dmp.module.sparse_arch.embedding_bag_collection
    counts = {}
    run_dmp = loop(dmp, [opt])

    def dmp_step(b):
        run_dmp(b)
        for k, v in sharded.last_stats.items():
            counts[k] = counts.get(k, 0) + v

    out["hotline_collection_dmp"] = (dmp_step, counts)

    config = TrainConfig(mode="hotline", embedding_dim=args.dim, bottom_mlp=[13, *bottom], top_mlp=list(top),
                         mini_batch_size=args.batch, learning_rate=0.1, optimizer="sgd", threads=args.threads,
                         progress=False, placement_path=str(placement_path), lookahead=0, seed=args.seed)  # fmt: skip
    trainer = Trainer(config, dataset)
    tcounts = {}

    def trainer_step(b):
        stats = trainer.step(b["batch"])
        for k, v in stats.counters.items():
            tcounts[k] = tcounts.get(k, 0) + v
        tcounts["samples"] = tcounts.get("samples", 0) + stats.samples

    out["hotline_trainer"] = (trainer_step, tcounts)
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def figures(counts: dict | None, steps: int) -> dict:
    """Hot-lookup share, popular-sample share and cold rows per step of a Hotline variant's counted steps."""
    if not counts or not counts.get("lookups"):
        return {"hot_lookup_share": None, "popular_sample_share": None, "cold_rows_per_step": None}
    return {
        "hot_lookup_share": counts["hot_lookups"] / counts["lookups"],
        "popular_sample_share": counts["popular_samples"] / max(1, counts["samples"]),
        "cold_rows_per_step": counts["working_set_rows"] / max(1, steps),
    }


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--rows", type=int, default=60_000, help="training rows of the synthetic dataset")
    p.add_argument("--max-rows-per-table", type=int, default=100_000, help="cap on every table's rows")
    p.add_argument("--zipf", type=float, default=1.05, help="Zipf exponent of the ids")
    p.add_argument("--dim", type=int, default=16, help="embedding dim")
    p.add_argument("--batch", type=int, default=2048, help="mini-batch size")
    p.add_argument("--steps", type=int, default=4, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds (variants interleaved in each)")
    p.add_argument("--profile-fraction", type=float, default=0.25, help="share of the train split profiled")
    p.add_argument(
        "--budget-share", type=float, default=0.05, help="hot bytes as a share of the embedding bytes"
    )
    p.add_argument("--data", type=Path, default=None, help="dataset directory (generated there if absent)")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.max_rows_per_table, args.batch, args.steps, args.rounds, args.warmup = (
            3000,
            500,
            128,
            2,
            1,
            1,
        )
    common.setup_threads(args.threads)

    import hotline
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate
    from hotline.torchrec_bridge import kjt_from_sparse

    with tempfile.TemporaryDirectory() as tmp:
        path = args.data or Path(tmp) / "ds"
        if not (path / "meta.json").exists():
            generate(path, args.rows, seed=args.seed, max_rows_per_table=args.max_rows_per_table, zipf=args.zipf,
                     progress=False)  # fmt: skip
        dataset = Dataset(path)
        prof = hotline.profile(dataset, sample_fraction=args.profile_fraction, mini_batch_size=args.batch,
                               embedding_dim=args.dim, seed=args.seed, progress=False)  # fmt: skip
        placement = prof.placement(int(args.budget_share * dataset.total_rows * 4 * args.dim))
        placement_path = placement.save(Path(tmp) / "placement.npz")
        needed = args.warmup + args.rounds * args.steps
        raw = list(dataset.train.batches(args.batch, num_batches=needed, drop_last=True))
        if len(raw) < needed:
            raise SystemExit(
                f"{needed} batches of {args.batch} needed, the training split has {len(raw)}: use --rows"
            )
        features = [f"cat_{t}" for t in range(dataset.num_tables)]
        import torch

        batches = [{"batch": b, "dense": torch.from_numpy(b.dense), "labels": torch.from_numpy(b.labels),
                    "kjt": kjt_from_sparse(b.sparse, features)} for b in raw]  # fmt: skip
        runs = variants(dataset, placement, placement_path, args)
        for step, _ in runs.values():
            for b in batches[: args.warmup]:
                step(b)
        for _, counts in runs.values():
            if counts is not None:
                counts.clear()
        rates = {label: [] for label in runs}
        for r in range(args.rounds):
            chunk = batches[args.warmup + r * args.steps : args.warmup + (r + 1) * args.steps]
            for label, (step, _) in runs.items():
                t0 = time.perf_counter()
                for b in chunk:
                    step(b)
                rates[label].append(len(chunk) * args.batch / (time.perf_counter() - t0))
        steps = args.rounds * args.steps
        rows = []
        for label, (_, counts) in runs.items():
            rows.append({"variant": label, "samples_per_s": statistics.median(rates[label]),
                         **figures(counts, steps)})  # fmt: skip
        by = {r["variant"]: r["samples_per_s"] for r in rows}
        ratio = by["hotline_collection_dmp"] / by["torchrec_fused_ebc"]
        load = common.load_average()
        common.print_table(
            rows,
            [
                ("variant", "variant", ""),
                ("samples_per_s", "samples/s", ".0f"),
                ("hot_lookup_share", "hot-lookup share", ".3f"),
                ("popular_sample_share", "popular samples", ".3f"),
                ("cold_rows_per_step", "cold rows/step", ".0f"),
            ],  # fmt: skip
            title=f"DLRM dim {args.dim}, batch {args.batch}, {dataset.num_tables} tables, "
            f"{dataset.total_rows:,} rows, {placement.num_hot:,} hot; load average {load}",
        )
        print(f"Hotline's collection under DMP / torchrec's fused collection: {ratio:.2f}x (target: >= 0.90)")
        payload = {"results": rows, "ratio_hotline_dmp_to_fused": ratio, "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()} | {"data": str(path)},
                   "machine": common.machine_info(args.threads)}  # fmt: skip
        common.write_json(args.json, payload)
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        return payload


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
