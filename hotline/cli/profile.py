"""``hotline profile DATASET``: count row accesses over a sample, print per-table skew, write a placement."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hotline.units import format_size, size_arg


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="count embedding-row accesses over a sample and place the popular rows under an HBM budget",
        description="Count accesses per (table, row) over a sample of a dataset split, rank the rows of all "
        "tables by popularity, and choose the hot rows that fit an HBM budget.",
    )
    parser.add_argument("dataset", help="dataset directory (from `hotline data ...`)")
    sample = parser.add_mutually_exclusive_group()
    sample.add_argument(
        "--sample-fraction",
        type=float,
        default=None,
        metavar="F",
        help="profile a uniform random share F of the split, without replacement (default 0.05, as in FAE)",
    )
    sample.add_argument(
        "--sample-batches",
        type=int,
        default=None,
        metavar="N",
        help="profile the first N mini-batches instead (Hotline's learning phase)",
    )
    parser.add_argument(
        "--mini-batch-size", type=int, default=128, metavar="B", help="mini-batch size (default 128)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random sample (default 0)")
    parser.add_argument("--split", default="train", choices=["train", "val", "test"], help="split to profile")
    parser.add_argument(
        "--hbm-budget",
        type=size_arg,
        default=None,
        metavar="SIZE",
        help="device bytes for hot rows, e.g. 256MiB, 2GiB, 1GB or plain bytes (required for --out)",
    )
    parser.add_argument(
        "--embedding-dim",
        "--arch-sparse-feature-size",
        dest="embedding_dim",
        type=int,
        default=16,
        metavar="D",
        help="embedding dimension (DLRM's --arch-sparse-feature-size; default 16): a hot row costs D*4 bytes",
    )
    parser.add_argument(
        "--optimizer",
        default="sgd",
        choices=["sgd", "rowwise-adagrad"],
        help="optimizer whose state is kept with hot rows (default sgd: none; rowwise-adagrad: 4 bytes per row)",
    )
    parser.add_argument(
        "--always-hot", type=int, nargs="+", default=[], metavar="TABLE", help="tables to keep hot whole"
    )
    parser.add_argument("--out", type=Path, default=None, metavar="FILE", help="write the placement (.npz)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the summary as JSON")
    parser.add_argument(
        "--curve-csv", type=Path, default=None, metavar="FILE", help="write the budget curve as CSV"
    )
    parser.add_argument("--num-threads", type=int, default=None, help="Numba threads (default: all cores)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.set_defaults(func=run)


def _table_text(stats) -> str:
    df = stats.copy()
    fmt = {
        "hot_pct": "{:.2f}".format,
        "coverage": "{:.1%}".format,
        "top1pct_share": "{:.1%}".format,
        "zipf_exponent": "{:.2f}".format,
    }
    for col, f in fmt.items():
        if col in df:
            df[col] = df[col].map(f)
    df = df.rename(
        columns={
            "accessed_rows": "accessed",
            "hot_rows": "hot rows",
            "hot_pct": "hot %",
            "top1pct_share": "top-1% share",
            "zipf_exponent": "zipf s",
        }
    )
    return df.drop(columns=["lookups"]).to_string(index=False)


def run(args: argparse.Namespace) -> int:
    import numba

    from hotline.datasets.format import DatasetError
    from hotline.placement import PlacementError
    from hotline.profiler import Profiler

    if args.num_threads is not None:
        numba.set_num_threads(args.num_threads)
    if (args.out is not None or args.always_hot) and args.hbm_budget is None:
        print("hotline profile: error: --out and --always-hot need --hbm-budget", file=sys.stderr)
        return 2
    try:
        profiler = Profiler(
            sample_fraction=0.05 if args.sample_fraction is None else args.sample_fraction,
            sample_batches=args.sample_batches,
            mini_batch_size=args.mini_batch_size,
            seed=args.seed,
            embedding_dim=args.embedding_dim,
            optimizer=args.optimizer,
            split=args.split,
            progress=not args.no_progress,
        )
        prof = profiler.profile(args.dataset)
        placement = prof.placement(args.hbm_budget, args.always_hot) if args.hbm_budget is not None else None
        summary = prof.summary(args.hbm_budget, args.always_hot) if args.hbm_budget is not None else None
    except (DatasetError, PlacementError, ValueError, OSError) as e:
        print(f"hotline profile: error: {e}", file=sys.stderr)
        return 2

    print(
        f"{args.dataset}: {prof.num_samples:,} samples of split {args.split!r} profiled "
        f"({prof.total_lookups:,} lookups, {prof.num_accessed:,} of {sum(prof.table_sizes):,} rows accessed) "
        f"in {prof.timings['count_s'] + prof.timings['rank_s']:.1f} s"
    )
    print(_table_text(prof.table_stats(args.hbm_budget, args.always_hot)))
    if summary is not None:
        B = prof.mini_batch_size
        print(
            f"\nHBM budget {format_size(summary['hbm_budget_bytes'])} at {summary['bytes_per_row']} B/row: "
            f"{summary['hot_rows']:,} hot rows ({format_size(summary['hot_bytes'])})\n"
            f"  access coverage        {summary['access_coverage']:.2%}\n"
            f"  popular-sample share   {summary['popular_sample_share']:.2%}"
            f"  (~{summary['expected_popular_samples_per_batch']:.1f} of {B} per mini-batch)\n"
            f"  per mini-batch of {B}: expected unique cold rows {summary['expected_cold_rows_per_batch']:.1f}"
            f" of {summary['expected_unique_rows_per_batch']:.1f} unique\n"
            f"  host->device bytes per mini-batch: hybrid {format_size(summary['hybrid_bytes_per_batch'])} "
            f"(all lookups), {format_size(round(summary['hybrid_unique_bytes_per_batch']))} (unique rows); "
            f"Hotline {format_size(round(summary['hotline_bytes_per_batch']))} (unique cold rows)"
        )
    try:  # an unwritable or full output location is the user's to fix: one line, no traceback
        if placement is not None and args.out is not None:
            placement.save(args.out)
            print(f"placement written to {args.out}")
        if summary is not None and args.json is not None:
            args.json.write_text(json.dumps(summary, indent=2) + "\n")
            print(f"summary written to {args.json}")
        if args.curve_csv is not None:
            prof.curve().to_csv(args.curve_csv, index=False)
            print(f"budget curve written to {args.curve_csv}")
    except OSError as e:
        print(f"hotline profile: error: {e}", file=sys.stderr)
        return 2
    return 0
