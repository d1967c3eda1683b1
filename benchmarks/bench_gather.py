"""Benchmark: gathering a working set of cold rows (and writing it back), Numba kernels against torch.

A host table of ``--rows`` rows (one per ``--dims`` entry) and a working set of ``--working-set`` unique
rows, drawn as a dispatcher makes them: Zipf(``--zipf``) lookups scattered over the table by a permutation,
deduplicated, in first-occurrence order. Timed, into / from preallocated buffers:

- gather: ``hotline.kernels.gather.gather_rows(table, rows, out)`` against
  ``torch.index_select(table, 0, rows, out=buf)``;
- write-back: ``hotline.kernels.gather.scatter_rows(table, rows, src)`` against ``table.index_copy_(0, rows,
  src)``;
- the same for a 1-D optimizer-state array (row-wise Adagrad's one float per row): ``dim`` = ``state``.

Reported: rows/s, GB/s of row payload (rows x dim x 4 bytes) and hotline over torch; the gather target is
>= 0.8 of index_select's rows/s.
"""

from __future__ import annotations

import sys

import common
import numpy as np
import torch

from hotline.datasets.synthetic import sample_zipf
from hotline.kernels.gather import gather_rows, scatter_rows

TARGET_RATIO = 0.8


def working_set(rng: np.random.Generator, rows: int, n: int, zipf: float) -> np.ndarray:
    """``n`` unique rows (int64) in first-occurrence order of Zipf lookups scattered by a permutation."""
    perm = rng.permutation(rows)
    draws = 2 * n
    while True:
        ids = perm[sample_zipf(rng, rows, zipf, draws)]
        uniq, first = np.unique(ids, return_index=True)
        if uniq.shape[0] >= n or draws > 64 * rows:
            return ids[np.sort(first)][:n].astype(np.int64)
        draws *= 2


def run_dim(args, dim: int | None, rows_idx: np.ndarray, rng: np.random.Generator) -> list[dict]:
    """Gather and write-back timings for a [rows, dim] table (dim None: a 1-D state array)."""
    shape = (args.rows,) if dim is None else (args.rows, dim)
    table = rng.standard_normal(shape, dtype=np.float32)
    n = rows_idx.shape[0]
    out = np.empty((n,) + shape[1:], np.float32)
    t_table, t_idx, t_out = torch.from_numpy(table), torch.from_numpy(rows_idx), torch.from_numpy(out)

    gather_rows(table, rows_idx, out)
    if not np.array_equal(out, table[rows_idx]):
        raise AssertionError("gather_rows disagrees with table[rows]")
    src = out + np.float32(1.0)
    t_src = torch.from_numpy(src)
    scatter_rows(table, rows_idx, src)
    if not np.array_equal(table[rows_idx], src):
        raise AssertionError("scatter_rows disagrees with table[rows] = src")

    row_bytes = 4 * (1 if dim is None else dim)
    methods = (
        ("gather", "hotline", lambda: gather_rows(table, rows_idx, out)),
        ("gather", "torch", lambda: torch.index_select(t_table, 0, t_idx, out=t_out)),
        ("write-back", "hotline", lambda: scatter_rows(table, rows_idx, src)),
        ("write-back", "torch", lambda: t_table.index_copy_(0, t_idx, t_src)),
    )
    results = []
    for op, method, fn in methods:
        t = common.timeit(fn, args.repeats, args.warmup)
        results.append(
            {
                "op": op,
                "dim": "state" if dim is None else dim,
                "method": method,
                "rows": n,
                "median_ms": t.median_s * 1e3,
                "min_ms": t.min_s * 1e3,
                "cpu_ms": t.cpu_median_s * 1e3,
                "mrows_per_s": n / t.median_s / 1e6,
                "gb_per_s": n * row_bytes / t.median_s / 1e9,
            }
        )
    for op in ("gather", "write-back"):
        ours, theirs = (
            next(r for r in results if r["op"] == op and r["method"] == m) for m in ("hotline", "torch")
        )
        ours["ratio_vs_torch"] = ours["mrows_per_s"] / theirs["mrows_per_s"]
        theirs["ratio_vs_torch"] = 1.0
    return results


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--rows", type=int, default=2_000_000, help="rows of the host table")
    p.add_argument("--dims", type=int, nargs="+", default=[64, 16], help="embedding dims")
    p.add_argument("--working-set", type=int, default=65_536, help="unique rows gathered")
    p.add_argument("--zipf", type=float, default=1.05, help="Zipf exponent of the lookups")
    p.add_argument("--no-state", action="store_true", help="skip the 1-D optimizer-state line")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.dims, args.working_set, args.repeats, args.warmup = 20_000, [8], 1000, 2, 1
    threads = common.setup_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    idx = working_set(rng, args.rows, args.working_set, args.zipf)
    results = []
    for dim in list(args.dims) + ([] if args.no_state else [None]):
        results += run_dim(args, dim, idx, rng)
    common.print_table(
        results,
        [
            ("op", "op", ""),
            ("dim", "dim", ""),
            ("method", "method", ""),
            ("rows", "rows", ""),
            ("median_ms", "median ms", ".3f"),
            ("min_ms", "min ms", ".3f"),
            ("cpu_ms", "cpu ms", ".3f"),
            ("mrows_per_s", "M rows/s", ".1f"),
            ("gb_per_s", "GB/s", ".2f"),
            ("ratio_vs_torch", "vs torch", ".2f"),
        ],
        title=f"working-set gather / write-back: {idx.shape[0]:,} unique rows of a {args.rows:,}-row table, "
        f"Zipf {args.zipf}, {threads} threads, median of {args.repeats}",
    )
    gathers = [r for r in results if r["op"] == "gather" and r["method"] == "hotline"]
    worst = min(r["ratio_vs_torch"] for r in gathers)
    met = worst >= TARGET_RATIO
    print(
        f"gather over index_select: {worst:.2f} at worst (target >= {TARGET_RATIO}: {'met' if met else 'MISSED'})"
    )
    report = {
        "benchmark": "gather",
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "machine": common.machine_info(threads),
        "results": results,
        "target_ratio": TARGET_RATIO,
        "gather_ratio_min": worst,
        "target_met": met,
    }
    common.write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
