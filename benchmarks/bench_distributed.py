"""Benchmark: data-parallel training on N = 1 and 2 gloo ranks: samples/s and the bytes each rank sends per step.

Data: a synthetic dataset (the 26 Criteo Kaggle tables capped at ``--max-rows-per-table`` rows, Zipf
``--zipf`` ids, ``--rows`` rows), generated into a cache directory or reused. ``hotline`` places the rows a
profile of the run's own batches ranks best, under one budget per target coverage of ``--coverages`` (the
smallest budget whose coverage of the run's lookups reaches it: 70%, 85%, 95% by default, so the cold path
runs). Model: dim ``--dim``, bottom 13-64-``dim``, top 64-1, SGD.

For each N in ``--nprocs`` the ranks are started once (``hotline.distributed.spawn``: fresh processes, gloo on
127.0.0.1, ``--threads`` // N torch/numba threads each, so that every N uses the same cores) and train each
mode of ``--modes`` for ``--steps`` global steps of ``--batch`` samples (``hotline`` once per look-ahead of
``--lookaheads`` and budget; the other modes with look-ahead 0). Reported from rank 0: the coverage (rank 0's
lookups that hit hot rows), popular share and cold rows per step (all ranks) the run measured, a run at
coverage >= 99.9% marked saturated; samples/s over the steps after the
first ``--warmup-steps``, ratio to N = 1 of the same mode and look-ahead, the bytes rank 0 sent per step by
kind (ring all-reduce of the dense gradients, the hot-row gradients all-gathered, the cold-row ids / rows /
gradients all-to-all, the stale rows fetched again under look-ahead), the stale rows per step (all ranks),
and the largest difference of any parameter from the N = 1 run relative to its scale (exactness check).

On a 2-core machine N = 2 cannot be faster than N = 1 (the same two cores, plus the collectives): the
figure is reported, not tuned for.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import common
import numpy as np
from ranks import spawn, train_and_dump

from hotline import TrainConfig
from hotline.datasets.format import Dataset

KINDS = (
    "dense_allreduce",
    "sparse_allgather",
    "hot_allgather",
    "cold_ids",
    "cold_rows",
    "cold_grads",
    "cold_refresh",
    "control",
)


def _dataset(args, root: Path) -> Dataset:
    from hotline.datasets.synthetic import generate

    path = root / f"dist-r{args.rows}-c{args.max_rows_per_table}-z{args.zipf}-s{args.seed}"
    if (path / "meta.json").is_file():
        return Dataset(path)
    generate(path, args.rows, seed=args.seed, max_rows_per_table=args.max_rows_per_table, zipf=args.zipf,
             progress=False)  # fmt: skip
    return Dataset(path)


def _hot(budget: dict | None) -> int | None:
    return budget["hot_rows"] if budget else None


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--nprocs", type=int, nargs="+", default=[1, 2], help="numbers of ranks to compare")
    p.add_argument("--modes", nargs="+", default=["device", "hybrid", "hotline"])
    p.add_argument("--lookaheads", type=int, nargs="+", default=[0], help="look-aheads of the hotline mode")
    p.add_argument("--rows", type=int, default=120_000, help="samples in the synthetic dataset")
    p.add_argument("--max-rows-per-table", type=int, default=50_000)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--dim", type=int, default=64, help="embedding dim")
    p.add_argument("--batch", type=int, default=2048, help="global mini-batch size")
    p.add_argument("--steps", type=int, default=40, help="global steps per mode")
    p.add_argument("--warmup-steps", type=int, default=5, help="first steps not timed")
    p.add_argument(
        "--coverages",
        type=float,
        nargs="+",
        default=[0.70, 0.85, 0.95],
        help="target coverages of the run's lookups; one hot-tier budget each",
    )
    p.add_argument("--data", type=Path, default=None, help="dataset cache directory (default: a temp dir)")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.max_rows_per_table, args.batch, args.steps, args.warmup_steps = 3000, 500, 128, 6, 1
        args.dim = 8
    common.setup_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ds = _dataset(args, args.data or tmp)
        import hotline

        # The run's own batches (what it touches) pick the budgets; held-out figures come from the next ones.
        prof = hotline.profile(ds, sample_batches=args.steps, mini_batch_size=args.batch, embedding_dim=args.dim,
                               seed=args.seed, progress=False)  # fmt: skip
        budgets = common.budgets_for_coverage(prof, args.coverages)
        placements = {
            b["hot_rows"]: prof.placement(b["budget_bytes"]).save(tmp / f"p{b['hot_rows']}.npz")
            for b in budgets
        }
        train_rows, table_rows, num_tables = len(ds.train), ds.total_rows, ds.num_tables
        results, dumps = [], {}
        runs = [
            (m, k, b)
            for m in args.modes
            for k in (args.lookaheads if m == "hotline" else [0])
            for b in (budgets if m == "hotline" else [None])
        ]
        for n in args.nprocs:
            jobs = []
            for mode, k, b in runs:
                cfg = TrainConfig(
                    mode=mode,
                    embedding_dim=args.dim,
                    bottom_mlp=[13, 64, args.dim],
                    top_mlp=[64, 1],
                    mini_batch_size=args.batch,
                    num_batches=args.steps,
                    progress=False,
                    placement_path=str(placements[b["hot_rows"]]) if b else None,
                    lookahead=k,
                    seed=args.seed,
                )
                jobs.append((cfg, str(ds.path), str(tmp / f"{mode}-k{k}-n{n}-{_hot(b)}.npz")))
            t0 = time.perf_counter()
            spawn(n, train_and_dump, jobs, threads=max(1, args.threads // n))
            wall = time.perf_counter() - t0
            for mode, k, b in runs:
                z = dict(np.load(tmp / f"{mode}-k{k}-n{n}-{_hot(b)}.npz"))
                dumps[(mode, k, n, _hot(b))] = z
                seen = z["measured"][args.warmup_steps :].sum(axis=0)
                seen = common.measured(
                    dict(zip(z["measured_kinds"].tolist(), seen.tolist())),
                    (len(z["measured"]) - args.warmup_steps) * args.batch,
                    len(z["measured"]) - args.warmup_steps,
                )
                ends = z["step_end_s"][args.warmup_steps - 1 :]
                steps = len(ends) - 1
                elapsed = float(ends[-1] - ends[0])
                sent = dict(zip(z["bytes_kinds"].tolist(), z["bytes_sent"].mean(axis=0).tolist()))
                row = {
                    "mode": mode,
                    "lookahead": k,
                    "nproc": n,
                    "hot_rows": _hot(b),
                    "target": b["target"] if b else None,
                    **seen,
                    "samples_per_s": steps * args.batch / elapsed if elapsed > 0 else 0.0,
                    "ms_per_step": 1e3 * statistics.median(np.diff(ends)) if steps else 0.0,
                    "spawn_wall_s": wall,
                    "stale_rows_per_step": float(z["stale_rows"].mean()) if len(z["stale_rows"]) else 0.0,
                    **{f"bytes_{k}": sent.get(f"bytes_sent_{k}", 0.0) for k in KINDS},
                }
                row["bytes_total"] = sum(row[f"bytes_{k}"] for k in KINDS)
                results.append(row)
        for row in results:
            key = (row["mode"], row["lookahead"], row["hot_rows"])
            same = [r for r in results if (r["mode"], r["lookahead"], r["hot_rows"]) == key]
            base = next((r for r in same if r["nproc"] == 1), None)
            row["vs_n1"] = row["samples_per_s"] / base["samples_per_s"] if base else None
            row["note"] = "SATURATED (not a hotline result)" if row["saturated"] else ""
            ref = dumps.get((*key[:2], 1, key[2]))
            if ref is not None:
                got = dumps[(*key[:2], row["nproc"], key[2])]
                params = [k for k in ref if k.startswith(("model.", "embedding."))]
                row["max_rel_diff_vs_n1"] = max(
                    float(np.abs(got[k] - ref[k]).max() / max(np.abs(ref[k]).max(), 1e-12)) for k in params
                )
    kib = [(f"bytes_{k}", k, ".1f") for k in KINDS if any(r[f"bytes_{k}"] for r in results)]
    for r in results:
        for k, _, _ in kib:
            r[k + "_kib"] = r[k] / 1024
    common.print_table(
        results,
        [
            ("mode", "mode", ""),
            ("lookahead", "K", ""),
            ("nproc", "N", ""),
            ("hot_rows", "hot rows", ""),
            ("coverage", "coverage", ".3f"),
            ("popular_share", "popular", ".3f"),
            ("cold_rows_per_step", "cold rows/step", ".0f"),
            ("samples_per_s", "samples/s", ".0f"),
            ("vs_n1", "vs N=1", ".2f"),
            ("ms_per_step", "ms/step", ".1f"),
            *[(k + "_kib", name + " KiB", f) for k, name, f in kib],
            ("stale_rows_per_step", "stale/step", ".1f"),
            ("max_rel_diff_vs_n1", "max rel diff", ".1e"),
            ("note", "", ""),
        ],
        title=f"bytes = sent by rank 0 per step; batch {args.batch}, dim {args.dim}, {table_rows} rows",
    )
    report = {
        "benchmark": "bench_distributed",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": common.machine_info(args.threads),
        "dataset": {"rows": train_rows, "table_rows": table_rows, "tables": num_tables},
        "budgets": budgets,
        "results": results,
    }
    common.write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
