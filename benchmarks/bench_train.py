"""Benchmark: training throughput of the device, hybrid and hotline modes on the same data, in one run.

Data: a synthetic dataset (``hotline.datasets.synthetic.generate``: the 26 Criteo Kaggle tables capped at
``--max-rows-per-table`` rows, Zipf ``--zipf`` ids, ``--rows`` rows), generated into ``--data`` or reused
from there when a dataset already exists. Placement for ``hotline``: ``hotline.profile`` over
``--profile-fraction`` of the training split, hot rows under ``--budget-share`` of the embedding bytes.

Configs (``--configs``):

- ``kaggle``: the reference DLRM's Kaggle model: dim 16, bottom 13-512-256-64-16, top 512-256-1;
- ``emb-heavy``: dim 64 with small MLPs (bottom 13-64-64, top 64-1), standing in for a GPU's balance,
  where moving embedding rows costs more than the dense compute.

Both use mini-batches of ``--batch`` (default 2048) samples, SGD, learning rate 0.1. Every mode gets its own
Trainer (``hotline.Trainer`` + ``TrainConfig``) built from the same seed; after ``--warmup`` steps each,
``--rounds`` rounds run ``--steps`` steps per mode, modes interleaved within a round so that load changes on
the machine hit all modes alike; every mode trains on the same batches in the same order. Reported per mode:
samples/s (median over rounds), CPU milliseconds per step (all threads: steadier than wall time on a
shared machine, but blind to overlap), ratios hotline/hybrid and hotline/device, and milliseconds per
step of each phase from ``StepStats.times``. ``hotline`` runs with look-ahead 0 (sequential), each other ``--lookahead`` K
as ``hotline_k<K>`` through the pipelined executor (``Trainer.progress``). With K > 0, data movement
(dispatch, gather, h2d, write-back) runs on worker threads beside compute: ``stall`` is the main thread's
wait for it, ``overlap`` the share of it hidden (``hotline.pipeline.executor.overlap_ratio``), and ``other`` the step
time not in the main thread's phases.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common

from hotline.datasets.format import Dataset, DatasetError
from hotline.pipeline.executor import overlap_ratio

CONFIGS: dict[str, dict] = {
    "kaggle": {"dim": 16, "bottom_mlp": [13, 512, 256, 64, 16], "top_mlp": [512, 256, 1]},
    "emb-heavy": {"dim": 64, "bottom_mlp": [13, 64, 64], "top_mlp": [64, 1]},
}
# Phases of StepStats.times, in step order, as printed; "compute" sums the popular and non-popular passes.
PHASES = ("dispatch", "gather", "h2d", "compute", "sparse_update", "write_back", "dense_update")
MOVEMENT = ("dispatch", "gather", "h2d", "write_back")


def default_data_dir(rows: int, cap: int, zipf: float, seed: int) -> Path:
    base = Path(os.environ.get("HOTLINE_CACHE") or Path.home() / ".cache" / "hotline").expanduser()
    return base / f"bench-train-r{rows}-c{cap}-z{zipf}-s{seed}"


def open_or_generate(path: Path, args) -> tuple[Dataset, float, bool]:
    """The dataset at ``path`` if one is there, else a new synthetic one; returns (dataset, seconds, reused)."""
    if (path / "meta.json").is_file():
        try:
            return Dataset(path), 0.0, True
        except DatasetError as e:
            print(f"{path}: {e}; generating it again", flush=True)
    from hotline.datasets.synthetic import generate

    t0 = time.perf_counter()
    generate(
        path,
        args.rows,
        seed=args.seed,
        max_rows_per_table=args.max_rows_per_table,
        zipf=args.zipf,
        progress=False,
        overwrite=True,
    )  # fmt: skip - the benchmark's own cache, unreadable: made again
    return Dataset(path), time.perf_counter() - t0, False


def phase_ms(times: dict[str, float], steps: int) -> dict[str, float]:
    """Milliseconds per step of each phase (``compute`` sums the popular and non-popular passes)."""
    out = {p: 0.0 for p in PHASES}
    for k, v in times.items():
        key = "compute" if k.endswith("compute") else k
        out[key] = out.get(key, 0.0) + 1e3 * v / steps
    return out


def main_thread_ms(phases: dict[str, float]) -> float:
    """Milliseconds per step the main thread spends in the reported phases. With the executor, data
    movement (dispatch, gather, h2d, write-back) runs on worker threads and the main thread's share of it is
    ``stall`` (waiting); without it, every phase is on the main thread."""
    if "stall" not in phases:
        return sum(phases.values())
    return sum(v for k, v in phases.items() if k not in MOVEMENT)


def run_config(name: str, args, dataset: Dataset, workdir: Path) -> dict:
    """Builds one Trainer per mode for config ``name``, runs them interleaved, returns the figures."""
    import hotline
    from hotline import TrainConfig, Trainer

    cfg = CONFIGS[name]
    dim = cfg["dim"]
    bytes_per_row = 4 * dim  # SGD: no optimizer state per row
    budget = int(args.budget_share * dataset.total_rows * bytes_per_row)
    t0 = time.perf_counter()
    prof = hotline.profile(dataset, sample_fraction=args.profile_fraction, mini_batch_size=args.batch,
                           embedding_dim=dim, seed=args.seed, progress=False)  # fmt: skip
    placement = prof.placement(budget)
    placement_path = placement.save(workdir / f"placement-{name}.npz")
    profile_s = time.perf_counter() - t0

    variants = []  # (label, mode, lookahead)
    for mode in args.modes:
        if mode != "hotline":
            variants.append((mode, mode, 0))
            continue
        for k in args.lookahead:
            variants.append(("hotline" if k == 0 else f"hotline_k{k}", "hotline", k))

    needed = args.warmup + args.rounds * args.steps
    batches = list(dataset.train.batches(args.batch, num_batches=needed, drop_last=True))
    if len(batches) < needed:
        raise SystemExit(
            f"{dataset.path}: the training split has {len(batches)} full batches of {args.batch}; "
            f"{needed} are needed (--warmup + --rounds * --steps): use more --rows or a new --data"
        )

    trainers, setup_s = {}, {}
    for label, mode, k in variants:
        t0 = time.perf_counter()
        config = TrainConfig(
            mode=mode,
            embedding_dim=dim,
            bottom_mlp=list(cfg["bottom_mlp"]),
            top_mlp=list(cfg["top_mlp"]),
            mini_batch_size=args.batch,
            learning_rate=0.1,
            optimizer="sgd",
            threads=args.threads,
            progress=False,
            placement_path=str(placement_path) if mode == "hotline" else None,
            lookahead=k,
            seed=args.seed,
        )
        trainers[label] = Trainer(config, dataset)
        setup_s[label] = time.perf_counter() - t0
        for batch in batches[: args.warmup]:
            trainers[label].step(batch)

    rounds: dict[str, list[dict]] = {label: [] for label in trainers}
    for r in range(args.rounds):
        chunk = batches[args.warmup + r * args.steps : args.warmup + (r + 1) * args.steps]
        for label, trainer in trainers.items():
            times: dict[str, float] = {}
            counters: dict[str, float] = {}
            loss = 0.0
            c0, t0 = time.process_time(), time.perf_counter()
            for stats in trainer.progress(iter(chunk)):
                loss += float(stats.loss_sum)
                for k, v in stats.times.items():
                    times[k] = times.get(k, 0.0) + v
                for k, v in stats.counters.items():
                    counters[k] = counters.get(k, 0.0) + v
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            samples = args.steps * args.batch
            rounds[label].append(
                {
                    "wall_s": wall,
                    "samples_per_s": samples / wall,
                    "cpu_ms_per_step": 1e3 * cpu / args.steps,
                    "loss": loss / samples,
                    "phase_ms": phase_ms(times, args.steps),
                    "counters_per_step": {k: v / args.steps for k, v in counters.items()},
                }
            )
    for trainer in trainers.values():
        trainer.close()
    trainers.clear()
    gc.collect()

    modes = []
    for label, runs in rounds.items():
        mid = sorted(runs, key=lambda x: x["samples_per_s"])[len(runs) // 2]  # the median round
        step_ms = 1e3 * mid["wall_s"] / args.steps
        phases = dict(mid["phase_ms"])
        stall = phases.get("stall")
        phases["other"] = step_ms - main_thread_ms(phases)
        counters = mid["counters_per_step"]
        modes.append(
            {
                "config": name,
                "mode": label,
                "samples_per_s": statistics.median(x["samples_per_s"] for x in runs),
                "samples_per_s_rounds": [x["samples_per_s"] for x in runs],
                "step_ms": step_ms,
                "cpu_ms_per_step": mid["cpu_ms_per_step"],
                "setup_s": setup_s[label],
                "loss": mid["loss"],
                "popular_share": counters.get("popular_samples", float("nan")) / args.batch
                if "popular_samples" in counters
                else None,
                "working_set_rows": counters.get("working_set_rows"),
                "overlap": overlap_ratio({k: v for k, v in phases.items() if k != "other"})
                if stall is not None
                else None,
                **{f"{p}_ms": v for p, v in phases.items()},
            }
        )
    by = {m["mode"]: m["samples_per_s"] for m in modes}
    ratios = {}
    for m in modes:
        if m["mode"].startswith("hotline"):
            for base in ("hybrid", "device"):
                if base in by:
                    ratios[f"{m['mode']}/{base}"] = m["samples_per_s"] / by[base]
    return {
        "config": name,
        "embedding_dim": dim,
        "bottom_mlp": cfg["bottom_mlp"],
        "top_mlp": cfg["top_mlp"],
        "hot_rows": placement.num_hot,
        "hot_bytes": placement.hot_bytes,
        "budget_bytes": budget,
        "profile_s": profile_s,
        "modes": modes,
        "ratios": ratios,
    }


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--data", type=Path, default=None, help="dataset directory (reused if present)")
    p.add_argument("--rows", type=int, default=150_000, help="rows of a generated dataset")
    p.add_argument("--max-rows-per-table", type=int, default=1_000_000, help="cap on Kaggle table sizes")
    p.add_argument("--zipf", type=float, default=1.05, help="Zipf exponent of a generated dataset")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--modes", nargs="+", default=["device", "hybrid", "hotline"],
                   choices=["device", "hybrid", "hotline"])  # fmt: skip
    p.add_argument("--lookahead", type=int, nargs="+", default=[0, 2], help="hotline look-aheads")
    p.add_argument("--batch", type=int, default=2048, help="samples per mini-batch")
    p.add_argument("--steps", type=int, default=8, help="timed steps per mode per round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    p.add_argument("--budget-share", type=float, default=0.10, help="hot budget, share of embedding bytes")
    p.add_argument("--profile-fraction", type=float, default=0.25, help="share of train profiled")
    p.set_defaults(warmup=3)
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.max_rows_per_table, args.batch = 4000, 2000, 64
        args.steps, args.rounds, args.warmup = 2, 1, 1
    threads = common.setup_threads(args.threads)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        data = args.data or default_data_dir(args.rows, args.max_rows_per_table, args.zipf, args.seed)
        if args.smoke and args.data is None:
            data = Path(tmp) / "data"
        dataset, gen_s, reused = open_or_generate(Path(data), args)
        print(f"data: {dataset.path} ({'reused' if reused else f'generated in {gen_s:.1f} s'}): "
              f"{len(dataset.train):,} train rows, {dataset.total_rows:,} embedding rows", flush=True)  # fmt: skip
        results = [run_config(name, args, dataset, Path(tmp)) for name in args.configs]
    rows = [m for r in results for m in r["modes"]]
    common.print_table(
        rows,
        [
            ("config", "config", ""),
            ("mode", "mode", ""),
            ("samples_per_s", "samples/s", ".0f"),
            ("step_ms", "ms/step", ".1f"),
            ("cpu_ms_per_step", "cpu ms", ".1f"),
            *[(f"{ph}_ms", ph, ".1f") for ph in (*PHASES, "stall", "other")],
            ("overlap", "overlap", ".2f"),
            ("popular_share", "popular", ".2f"),
            ("working_set_rows", "cold rows", ".0f"),
        ],
        title=f"training throughput: batch {args.batch}, {args.steps} steps x {args.rounds} rounds per mode "
        f"(median), {threads} threads; phases in ms per step",
    )
    for r in results:
        ratios = ", ".join(f"{k} {v:.2f}x" for k, v in r["ratios"].items())
        print(f"{r['config']}: {r['hot_rows']:,} hot rows ({r['hot_bytes'] / 2**20:.1f} MiB of a "
              f"{r['budget_bytes'] / 2**20:.1f} MiB budget); {ratios}")  # fmt: skip
    report = {
        "benchmark": "train",
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "json"},
        "machine": common.machine_info(threads),
        "data": {
            "path": str(dataset.path),
            "reused": reused,
            "generate_s": gen_s,
            "train_rows": len(dataset.train),
            "embedding_rows": dataset.total_rows,
        },  # fmt: skip
        "results": results,
        "total_s": time.perf_counter() - t0,
    }
    common.write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
