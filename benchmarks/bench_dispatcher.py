"""Benchmark: Dispatcher.split (Numba) against a vectorised numpy split of the same batches, side by side.

Workload: the 26 Criteo Kaggle tables capped at ``--max-rows`` rows, Zipf(``--zipf``) ids per table from
``hotline.datasets.synthetic.sample_zipf`` (ranks scattered over each table by a permutation), and a placement
whose hot rows are the most frequent rows of a profiling sample (drawn from the same distribution) under a
budget of ``--budget-share`` of the embedding bytes. Timed: splitting ``--batches`` different batches of
``--batch`` samples, one-hot (L = 1) and multi-hot (L = ``--multi-hot``), by

- ``hotline``: ``hotline.dispatch.Dispatcher.split`` (the kernels of ``hotline.kernels.dispatch``);
- ``numpy``: :func:`numpy_split` below: range check, remap lookup, row-wise ``all``, ``np.unique`` with
  ``return_index``/``return_inverse`` for the working set in first-occurrence order.

Both produce the same arrays (checked on every batch before timing). Also timed: the kernel phases (the
lookup pass, the write pass, the cold-slot numbering) and the Python glue around them, and the memory-limit
probe ``hotline.kernels.probe.remap_gather``: the access pattern of the split's lookup pass (each id read
once, its int32 remap entry looked up at random with the same prefetch and chunking, one int32 slot written
per lookup) doing none of the split's other work. ``limit share`` = probe time / split time: how close the
whole split runs to what the memory system allows for its lookups. ``rank probe`` makes the same lookups
through ``hotline.kernels.probe.hot_rank_index`` (a bitmap of hot rows with per-word ranks, and rank -> slot):
the compact, cache-resident alternative to the remap, timed beside it so the choice of the remap is checked
on every run. ``hash speed``: the split through a hot table of the hot rows (``Dispatcher(index="hash")``,
what each of N ranks holds in place of a remap of every row) against the dense remap, timed interleaved in
three rounds (median of the rounds' ratios; above 1: the hot table is faster). Target: one-hot 4096 x 26 at >= 200 M lookups/s (about 0.53 ms a batch).
"""

from __future__ import annotations

import statistics
import sys
import time

import common
import numpy as np

from hotline.datasets.synthetic import KAGGLE_TABLE_SIZES, sample_zipf
from hotline.dispatch import Dispatcher
from hotline.kernels import dispatch
from hotline.kernels.probe import hot_rank_index, rank_gather, remap_gather
from hotline.placement import Placement

TARGET_MLOOKUPS = 200.0


def make_sparse(
    rng: np.random.Generator, sizes: list[int], perms: list[np.ndarray], n: int, L: int, zipf: float
) -> np.ndarray:
    """int32 [n, T, L] Zipf ids, rank r of table t stored as row ``perms[t][r]``."""
    out = np.empty((n, len(sizes), L), np.int32)
    for t, size in enumerate(sizes):
        out[:, t, :] = perms[t][sample_zipf(rng, size, zipf, (n, L))]
    return out


def hot_placement(sample: np.ndarray, sizes: list[int], budget_rows: int, dim: int) -> Placement:
    """The ``budget_rows`` most frequent rows of ``sample`` over all tables (only rows seen at least once)."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    fused = (sample.astype(np.int64) + offsets[:-1][None, :, None]).ravel()
    counts = np.bincount(fused, minlength=int(offsets[-1]))
    seen = np.flatnonzero(counts)
    hot = seen[np.argsort(-counts[seen], kind="stable")][:budget_rows]
    table = np.searchsorted(offsets, hot, side="right") - 1
    hot_ids = [hot[table == t] - offsets[t] for t in range(len(sizes))]
    return Placement.from_hot_ids(sizes, hot_ids, embedding_dim=dim)


def numpy_split(ids: np.ndarray, col_offset: np.ndarray, col_size: np.ndarray, remap: np.ndarray) -> tuple:
    """The same split as ``Dispatcher.split`` in vectorised numpy, on ``ids`` [B, C]. Returns
    (popular_samples, non_popular_samples, pop_ids, hot_pos, hot_slot, cold_pos, cold_slot, working_set)."""
    if ((ids < 0) | (ids >= col_size)).any():
        raise IndexError("id out of range")
    fused = ids + col_offset  # int64 [B, C]
    slots = remap[fused]
    popular = (slots >= 0).all(axis=1)
    pop_samples = np.flatnonzero(popular)
    np_samples = np.flatnonzero(~popular)
    pop_ids = slots[pop_samples].ravel()
    np_slots = slots[np_samples].ravel()
    hot = np_slots >= 0
    hot_pos = np.flatnonzero(hot)
    cold_pos = np.flatnonzero(~hot)
    cold_fused = fused[np_samples].ravel()[cold_pos]
    uniq, first, inverse = np.unique(cold_fused, return_index=True, return_inverse=True)
    order = np.argsort(first)  # working set in first-occurrence order, as the kernel makes it
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return pop_samples, np_samples, pop_ids, hot_pos, np_slots[hot_pos], cold_pos, rank[inverse], uniq[order]


FIELDS = (
    "popular_samples",
    "non_popular_samples",
    "pop_ids",
    "hot_pos",
    "hot_slot",
    "cold_pos",
    "cold_slot",
    "working_set",
)


def phase_times(d: Dispatcher, ids2d: np.ndarray, args) -> dict[str, float]:
    """Median milliseconds per call of each compiled kernel that ``split_batch`` calls on batch ``ids2d``
    [B, C], of the Python glue around them, and of the whole (the kernels are wrapped with timers for the
    measurement, whatever their names and signatures)."""
    B, C = ids2d.shape
    buf = dispatch.new_buffers(B * C, B)
    kernels = {name: fn for name, fn in vars(dispatch).items() if hasattr(fn, "py_func")}  # Numba dispatchers
    spent: dict[str, float] = {}

    def timed(name, fn):
        def call(*a):
            t0 = time.perf_counter()
            out = fn(*a)
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
            return out

        return call

    runs = []
    try:
        for name, fn in kernels.items():
            setattr(dispatch, name, timed(name, fn))
        for i in range(args.warmup + args.repeats):
            spent.clear()
            t0 = time.perf_counter()
            dispatch.split_batch(ids2d, d.col_offset, d.col_size, d.remap, d.slot_map, buf)
            total = time.perf_counter() - t0
            if i >= args.warmup:
                runs.append(
                    {**spent, "glue (Python)": total - sum(spent.values()), "split_batch (all)": total}
                )
    finally:
        for name, fn in kernels.items():
            setattr(dispatch, name, fn)
    return {k.lstrip("_"): 1e3 * statistics.median(r[k] for r in runs) for k in runs[0]}


def run_case(args, sizes, perms, placement, L: int, rng) -> tuple[list[dict], dict]:
    """Times both splits on ``--batches`` batches of pooling factor L; returns result rows and phase times."""
    batches = [make_sparse(rng, sizes, perms, args.batch, L, args.zipf) for _ in range(args.batches)]
    d = Dispatcher(placement, L, args.batch)
    dh = Dispatcher(placement, L, args.batch, index="hash")
    C = len(sizes) * L
    flat = [np.ascontiguousarray(b).reshape(args.batch, C) for b in batches]
    popular = 0
    working = 0
    for b, f in zip(batches, flat):
        got = d.split(b)
        want = numpy_split(f, d.col_offset, d.col_size, d.remap)
        hashed = dh.split(b)
        for name, w in zip(FIELDS, want):
            if not np.array_equal(getattr(got, name), w) or not np.array_equal(getattr(hashed, name), w):
                raise AssertionError(f"L={L}: numpy split and Dispatcher.split differ in {name}")
        popular += got.num_popular
        working += got.working_set.shape[0]

    def hotline_all():
        for b in batches:
            d.split(b)

    def hash_all():
        for b in batches:
            dh.split(b)

    def numpy_all():
        for f in flat:
            numpy_split(f, d.col_offset, d.col_size, d.remap)

    probe_out = np.empty(args.batch * C, d.remap.dtype)
    index = hot_rank_index(d.remap)
    rank_out = np.empty(args.batch * C, np.int32)
    if not np.array_equal(
        rank_gather(flat[0], d.col_offset, index, rank_out),
        remap_gather(flat[0], d.col_offset, d.remap, probe_out),
    ):
        raise AssertionError(f"L={L}: the rank probe and the remap probe differ")

    def probe_all():
        for f in flat:
            remap_gather(f, d.col_offset, d.remap, probe_out)

    def rank_probe_all():
        for f in flat:
            rank_gather(f, d.col_offset, index, rank_out)

    lookups = args.batch * C * len(batches)
    probe = common.timeit(probe_all, args.repeats, args.warmup)
    rank_probe = common.timeit(rank_probe_all, args.repeats, args.warmup)
    rows = []
    for method, fn in (("hotline", hotline_all), ("numpy", numpy_all)):
        t = common.timeit(fn, args.repeats, args.warmup)
        rows.append(
            {
                "pooling": L,
                "method": method,
                "batch": args.batch,
                "lookups_per_batch": args.batch * C,
                "ms_per_batch": t.median_s * 1e3 / len(batches),
                "min_ms_per_batch": t.min_s * 1e3 / len(batches),
                "cpu_ms_per_batch": t.cpu_median_s * 1e3 / len(batches),
                "mlookups_per_s": lookups / t.median_s / 1e6,
                "popular_share": popular / (args.batch * len(batches)),
                "working_set_rows": working / len(batches),
            }
        )
    rows[0]["speedup_vs_numpy"] = rows[1]["ms_per_batch"] / rows[0]["ms_per_batch"]
    rows[0]["probe_ms_per_batch"] = probe.median_s * 1e3 / len(batches)
    rows[0]["probe_mlookups_per_s"] = lookups / probe.median_s / 1e6
    rows[0]["limit_share"] = rows[0]["probe_ms_per_batch"] / rows[0]["ms_per_batch"]
    rows[0]["rank_probe_mlookups_per_s"] = lookups / rank_probe.median_s / 1e6
    rows[0]["rank_index_mb"] = (index[0].nbytes + index[1].nbytes) / 1e6
    rows[0]["remap_mb"] = d.remap.nbytes / 1e6
    rows[1]["speedup_vs_numpy"] = 1.0
    dense, hashed = [], []
    for _ in range(3):  # interleaved: a slow spell of a shared machine hits both alike
        dense.append(common.timeit(hotline_all, args.repeats, args.warmup).median_s)
        hashed.append(common.timeit(hash_all, args.repeats, args.warmup).median_s)
    rows[0]["hash_ms_per_batch"] = statistics.median(hashed) * 1e3 / len(batches)
    rows[0]["hash_mlookups_per_s"] = lookups / statistics.median(hashed) / 1e6
    rows[0]["hash_vs_dense"] = statistics.median(d / h for d, h in zip(dense, hashed))
    rows[0]["hot_table_mb"] = dh.remap.nbytes / 1e6
    return rows, phase_times(d, flat[0], args)


def main(argv: list[str] | None = None) -> dict:
    p = common.parser(__doc__)
    p.add_argument("--max-rows", type=int, default=1_000_000, help="cap on every Kaggle table's rows")
    p.add_argument("--batch", type=int, default=4096, help="samples per batch")
    p.add_argument("--batches", type=int, default=8, help="distinct batches per timed run")
    p.add_argument("--multi-hot", type=int, default=4, help="pooling factor of the multi-hot line (0: skip)")
    p.add_argument("--zipf", type=float, default=1.05, help="Zipf exponent of the ids")
    p.add_argument("--budget-share", type=float, default=0.10, help="hot budget, share of embedding bytes")
    p.add_argument("--dim", type=int, default=16, help="embedding dim (sets bytes per row; rows scale alike)")
    p.add_argument("--profile-samples", type=int, default=200_000, help="samples counted for the placement")
    # a timed run is 8 batches, about 5 ms: the median of 41 (about 10 s in all) instead of the common 7, which
    # a second of a VM's slow spell moved by 10-20%
    p.set_defaults(repeats=41)
    args = p.parse_args(argv)
    if args.smoke:
        args.max_rows, args.batch, args.batches, args.profile_samples = 2000, 64, 2, 2000
        args.repeats, args.warmup = 2, 1
    threads = common.setup_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    sizes = [min(s, args.max_rows) for s in KAGGLE_TABLE_SIZES]
    perms = [rng.permutation(s).astype(np.int32) for s in sizes]
    budget_rows = int(args.budget_share * sum(sizes))
    sample = make_sparse(rng, sizes, perms, args.profile_samples, 1, args.zipf)
    placement = hot_placement(sample, sizes, budget_rows, args.dim)
    del sample

    results, phases = [], {}
    for L in [1] + ([args.multi_hot] if args.multi_hot > 1 else []):
        rows, phases[f"L={L}"] = run_case(args, sizes, perms, placement, L, rng)
        results += rows
    common.print_table(
        results,
        [
            ("pooling", "L", ""),
            ("method", "method", ""),
            ("lookups_per_batch", "lookups/batch", ""),
            ("ms_per_batch", "ms/batch", ".3f"),
            ("min_ms_per_batch", "min ms", ".3f"),
            ("cpu_ms_per_batch", "cpu ms", ".3f"),
            ("mlookups_per_s", "M lookups/s", ".1f"),
            ("speedup_vs_numpy", "vs numpy", ".2f"),
            ("probe_mlookups_per_s", "probe M/s", ".1f"),
            ("limit_share", "limit share", ".2f"),
            ("rank_probe_mlookups_per_s", "rank probe M/s", ".1f"),
            ("hash_mlookups_per_s", "hash M/s", ".1f"),
            ("hash_vs_dense", "hash speed", ".2f"),
            ("popular_share", "popular", ".3f"),
            ("working_set_rows", "cold rows/batch", ".0f"),
        ],
        title=f"dispatcher split: 26 Kaggle tables capped at {args.max_rows:,} rows ({sum(sizes):,} rows), "
        f"{placement.num_hot:,} hot rows ({args.budget_share:.0%} budget), Zipf {args.zipf}, {threads} threads, "
        f"median of {args.repeats}, load average {common.load_average()}",
    )
    phase_rows = [{"phase": k, **{case: v[k] for case, v in phases.items()}} for k in phases["L=1"]]
    common.print_table(
        phase_rows, [("phase", "kernel phase", "")] + [(c, f"{c} ms", ".3f") for c in phases], title="phases"
    )
    one_hot = next(r for r in results if r["pooling"] == 1 and r["method"] == "hotline")
    met = one_hot["mlookups_per_s"] >= TARGET_MLOOKUPS
    print(
        f"one-hot split: {one_hot['mlookups_per_s']:.1f} M lookups/s (target >= {TARGET_MLOOKUPS:.0f}: "
        f"{'met' if met else 'MISSED'}), {one_hot['limit_share']:.0%} of the memory-limit probe's "
        f"{one_hot['probe_mlookups_per_s']:.1f} M lookups/s (the lookup pass's access pattern); "
        f"load average {common.load_average()}"
    )
    print(
        f"the same lookups through the compact rank index ({one_hot['rank_index_mb']:.1f} MB against the "
        f"remap's {one_hot['remap_mb']:.1f} MB): {one_hot['rank_probe_mlookups_per_s']:.1f} M lookups/s, "
        f"{one_hot['rank_probe_mlookups_per_s'] / one_hot['probe_mlookups_per_s']:.2f}x the remap probe"
    )
    for r in results:
        if "hash_vs_dense" in r:
            print(
                f"L={r['pooling']}: split with the hot table ({r['hot_table_mb']:.1f} MB) at "
                f"{r['hash_vs_dense']:.2f}x the speed of the dense remap ({r['remap_mb']:.1f} MB)"
            )
    report = {
        "benchmark": "dispatcher",
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "machine": common.machine_info(threads),
        "table_sizes": sizes,
        "hot_rows": placement.num_hot,
        "results": results,
        "phases_ms": phases,
        "probe_pattern": "the lookup pass: each id read once, int32 remap entry, one int32 slot written",
        "target_mlookups_per_s": TARGET_MLOOKUPS,
        "target_met": met,
    }
    common.write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
