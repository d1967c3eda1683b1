"""Benchmark: the synthetic generator: Zipf sampling against inverse-CDF search, and end-to-end rows/s.

1. Zipf draws for one table of ``n`` rows, side by side on the same uniforms' count:

   - ``hotline``: :func:`hotline.datasets.synthetic.sample_zipf` (rejection-inversion, Numba, no tables);
   - ``searchsorted``: the textbook inverse CDF, ``np.searchsorted(cdf, rng.random(k))`` on a precomputed
     float64 cumulative-weight array (its build time and memory reported apart, not timed per draw).

2. ``generate`` end to end (all 26 tables, dense features, labels, memory-mapped output; no raw TSV) for the
   built-in default (Kaggle sizes capped at 50,000 rows) and for the uncapped Kaggle sizes (33.8M rows in
   all), in rows/s, one run each after a warm-up.

    python benchmarks/bench_synthetic.py --json bench_synthetic.json
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import common
import numpy as np

from hotline.datasets import synthetic as syn
from hotline.kernels.synthetic import PARALLEL_MIN_SIZE, bag_effects, zipf_ranks


def bench_sampling(args, sizes: list[int], draws: int) -> list[dict]:
    rows = []
    for n in sizes:
        rng = np.random.default_rng(args.seed)
        t0 = time.perf_counter()
        cdf = np.cumsum(syn.zipf_pmf(n, args.zipf))
        build_s = time.perf_counter() - t0

        def ours_fn(rng=rng, n=n):
            return syn.sample_zipf(rng, n, args.zipf, draws)

        def theirs_fn(rng=rng, n=n, cdf=cdf):
            return np.minimum(np.searchsorted(cdf, rng.random(draws), side="right"), n - 1)

        ours = common.timeit(ours_fn, args.repeats, args.warmup)
        theirs = common.timeit(theirs_fn, args.repeats, args.warmup)
        for name, t, extra in (("hotline", ours, 0.0), ("searchsorted", theirs, build_s)):
            rows.append({
                "n": n, "method": name, "msamples_per_s": draws / t.median_s / 1e6,
                "best_msamples_per_s": draws / t.min_s / 1e6, "table_mb": 0.0 if name == "hotline" else cdf.nbytes / 1e6,
                "build_s": extra, "speedup": theirs.median_s / t.median_s,
            })  # fmt: skip
    return rows


def bench_generate(args, cases: list[tuple[str, dict]]) -> list[dict]:
    out = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-synthetic-"))
    try:
        # Load both the serial and the parallel compiled kernels before timing.
        syn.generate(tmp / "warm", 2000, max_rows_per_table=1000, progress=False)
        big = np.zeros((PARALLEL_MIN_SIZE, 1), np.int64)
        zipf_ranks(np.zeros(PARALLEL_MIN_SIZE), 10, 1.0)
        bag_effects(big, 1, 10.0)
        for name, kw in cases:
            t0 = time.perf_counter()
            path = syn.generate(tmp / name, progress=False, **kw)
            seconds = time.perf_counter() - t0
            auc = syn.Dataset(path).meta["synthetic"]["planted_val_auc"]
            shutil.rmtree(path)
            out.append({
                "case": name, "rows": kw["rows"], "seconds": seconds, "rows_per_s": kw["rows"] / seconds,
                "planted_val_auc": auc,
            })  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__)
    p.add_argument("--zipf", type=float, default=syn.DEFAULT_ZIPF, help="Zipf exponent")
    p.add_argument("--draws", type=int, default=4_000_000, help="Zipf draws per timed call")
    p.add_argument("--rows", type=int, default=2_000_000, help="rows of the uncapped Kaggle generate run")
    args = p.parse_args(argv)
    threads = common.setup_threads(args.threads)
    if args.smoke:
        sizes, draws = [1000, 100_000], 20_000
        cases = [("default-capped", {**syn.DEFAULT_DATASET, "rows": 5000})]
    else:
        sizes, draws = [50_000, max(syn.KAGGLE_TABLE_SIZES)], args.draws
        cases = [
            ("default (cap 50k)", dict(syn.DEFAULT_DATASET)),
            ("kaggle uncapped", {"rows": args.rows, "seed": 0}),
        ]
    sampling = bench_sampling(args, sizes, draws)
    common.print_table(
        sampling,
        [("n", "table rows", ""), ("method", "method", ""), ("msamples_per_s", "M draws/s", ".1f"),
         ("best_msamples_per_s", "best", ".1f"), ("table_mb", "table MB", ".1f"),
         ("build_s", "build s", ".3f"), ("speedup", "hotline / this", ".2f")],
        title=f"Zipf(s={args.zipf}) draws, {draws:,} per call, {threads} threads",
    )  # fmt: skip
    print()
    generation = bench_generate(args, cases)
    common.print_table(
        generation,
        [("case", "generate", ""), ("rows", "rows", ""), ("seconds", "seconds", ".2f"),
         ("rows_per_s", "rows/s", ",.0f"), ("planted_val_auc", "planted val AUC", ".4f")],
        title="generate end to end (26 tables, one-hot, no raw TSV)",
    )  # fmt: skip
    common.write_json(args.json, {
        "benchmark": "synthetic", "machine": common.machine_info(threads), "zipf": args.zipf,
        "sampling": sampling, "generate": generation,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
