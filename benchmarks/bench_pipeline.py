"""Pipeline benchmark: device / hybrid / hotline K=0 / hotline K=2 training side by side on the same data.

Every mode trains the same model on the same batches in one process (each from the same initial weights);
samples/s are measured over the steps after a warm-up. Two configs, as the project guide asks:

- ``emb-heavy`` (default): dim 64 and small MLPs, where moving embedding rows dominates (a GPU's balance);
- ``kaggle``: the Kaggle DLRM (dim 16, 13-512-256-64-16, 512-256-1), where the MLPs take most of a CPU step.

Run: ``python benchmarks/bench_pipeline.py --config emb-heavy --json pipeline.json``
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

CONFIGS = {
    "emb-heavy": {
        "embedding_dim": 64,
        "bottom_mlp": [13, 64, 64],
        "top_mlp": [64, 1],
        "mini_batch_size": 4096,
    },
    "kaggle": {
        "embedding_dim": 16,
        "bottom_mlp": [13, 512, 256, 64, 16],
        "top_mlp": [512, 256, 1],
        "mini_batch_size": 2048,
    },
}
MODES = {
    "device": {"mode": "device"},
    "hybrid": {"mode": "hybrid"},
    "hotline_k0": {"mode": "hotline", "lookahead": 0},
    "hotline_k2": {"mode": "hotline", "lookahead": 2},
}
PHASES = (
    "dispatch",
    "gather",
    "h2d",
    "popular_compute",
    "non_popular_compute",
    "compute",
    "sparse_update",
    "dense_update",
    "write_back",
    "stall",
)


def make_data(args, root: Path):
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate

    if args.data:
        return Dataset(args.data)
    rows = int(args.batch * (args.steps + args.warmup_steps) * 7 / 6) + 1000
    path = generate(
        root / "data",
        rows,
        seed=args.seed,
        max_rows_per_table=args.max_rows_per_table,
        zipf=args.zipf,
        progress=not args.smoke,
    )
    return Dataset(path)


def make_placement(dataset, args, cfg, root: Path) -> tuple[str, dict]:
    from hotline.profiling.profiler import profile

    emb_bytes = dataset.total_rows * cfg["embedding_dim"] * 4
    budget = int(emb_bytes * args.hbm_fraction)
    prof = profile(
        dataset,
        embedding_dim=cfg["embedding_dim"],
        optimizer=args.optimizer,
        mini_batch_size=args.batch,
        seed=args.seed,
        progress=False,
        sample_fraction=args.sample_fraction,
    )
    placement = prof.placement(budget)
    path = root / "placement.npz"
    placement.save(path)
    return str(path), prof.summary(budget)


def run_mode(name, dataset, args, cfg, placement_path, device: str = "cpu") -> dict:
    import torch

    from hotline import TrainConfig, Trainer
    from hotline.pipeline.executor import overlap_ratio

    config = TrainConfig(
        **{**cfg, "mini_batch_size": args.batch},
        **MODES[name],
        optimizer=args.optimizer,
        learning_rate=0.01,
        placement_path=placement_path,
        progress=False,
        threads=args.threads,
        worker_threads=args.worker_threads,
        num_batches=args.steps + args.warmup_steps,
        device=device,
    )
    trainer = Trainer(config, dataset)
    times: dict[str, float] = {}
    try:
        stats_iter = trainer.progress(trainer.batches())
        for _ in range(args.warmup_steps):
            next(stats_iter)
        t0 = time.perf_counter()
        samples = 0
        popular = working = 0.0
        for s in stats_iter:
            if device == "cuda":
                torch.cuda.synchronize()
            samples += s.samples
            popular += s.counters.get("popular_samples", 0)
            working += s.counters.get("working_set_rows", 0)
            for k, v in s.times.items():
                times[k] = times.get(k, 0.0) + v
        elapsed = time.perf_counter() - t0
    finally:
        trainer.close()
    steps = args.steps
    rec = {
        "mode": name,
        "samples_per_s": samples / elapsed,
        "step_ms": 1e3 * elapsed / steps,
        "stall_share": times.get("stall", 0.0) / elapsed if "stall" in times else None,
        "overlap_ratio": overlap_ratio(times) if "stall" in times else None,
        "popular_share": popular / max(samples, 1) if name.startswith("hotline") else None,
        "working_set_rows": working / steps if name != "device" else None,
    }
    rec.update({f"{k}_ms": 1e3 * times[k] / steps for k in PHASES if k in times})
    return rec


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--config", choices=sorted(CONFIGS), default="emb-heavy")
    p.add_argument("--modes", default=",".join(MODES), help="comma list of " + ",".join(MODES))
    p.add_argument("--steps", type=int, default=30, help="timed steps per mode")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=0, help="mini-batch size (default: the config's)")
    p.add_argument("--max-rows-per-table", type=int, default=1_000_000)
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument(
        "--hbm-fraction", type=float, default=0.10, help="HBM budget as a share of embedding bytes"
    )
    p.add_argument("--sample-fraction", type=float, default=0.25, help="share of train rows profiled")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "rowwise-adagrad"])
    p.add_argument("--worker-threads", type=int, default=1, help="numba threads of the look-ahead worker")
    p.add_argument("--data", help="an existing dataset directory instead of generating one")
    args = p.parse_args(argv)
    cfg = dict(CONFIGS[args.config])
    if args.smoke:
        args.steps, args.warmup_steps, args.max_rows_per_table = 4, 1, 2000
        args.batch = args.batch or 128
    args.batch = args.batch or cfg["mini_batch_size"]
    common.setup_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench_pipeline_") as tmp:
        root = Path(tmp)
        dataset = make_data(args, root)
        placement_path, summary = make_placement(dataset, args, cfg, root)
        rows = [run_mode(m, dataset, args, cfg, placement_path) for m in args.modes.split(",")]
    by = {r["mode"]: r for r in rows}
    ratios = {}
    for a, b in (
        ("hotline_k2", "hotline_k0"),
        ("hotline_k2", "hybrid"),
        ("hotline_k0", "hybrid"),
        ("hotline_k2", "device"),
        ("hotline_k0", "device"),
    ):
        if a in by and b in by:
            ratios[f"{a}/{b}"] = by[a]["samples_per_s"] / by[b]["samples_per_s"]
    common.print_table(
        rows,
        [
            ("mode", "mode", ""),
            ("samples_per_s", "samples/s", ".0f"),
            ("step_ms", "ms/step", ".1f"),
            ("stall_share", "stall", ".2f"),
            ("overlap_ratio", "overlap", ".2f"),
            ("popular_share", "popular", ".2f"),
            ("working_set_rows", "ws rows", ".0f"),
            ("gather_ms", "gather", ".2f"),
            ("dispatch_ms", "dispatch", ".2f"),
            ("write_back_ms", "wb", ".2f"),
        ],
        title=f"config {args.config}, batch {args.batch}, {dataset.num_tables} tables, "
        f"{dataset.total_rows:,} rows, HBM budget {args.hbm_fraction:.0%} of embedding bytes",
    )
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")
    payload = {
        "config": args.config,
        "batch": args.batch,
        "ratios": ratios,
        "placement": {
            k: summary[k]
            for k in ("hbm_budget_bytes", "hot_rows", "access_coverage", "popular_sample_share")
            if k in summary
        },
        **by,
        "machine": common.machine_info(args.threads),
    }
    common.write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
