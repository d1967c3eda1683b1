"""Drift benchmark: static vs adaptive placement on drifting data, at the same HBM budget, in one run.

A synthetic dataset whose popular rows move every day (``--drift-days``, ``--drift-rate``) is trained in
hotline mode three times from the same initial weights on the same batches: with the placement profiled on
the first day only (static), with the online counts kept but never used (the counting's cost), and with
re-placement every ``--replace-every`` steps (adaptive). Printed per run: samples/s, the measured hot-lookup
share and popular-sample share by day, cold rows per step, the re-placements and the time each takes, the cost
model's predicted samples/s of both placements on a GPU (``--gpu``, from what each run measured); and the
counting overhead: its kernel timed apart, and end to end as the median of alternating A/B runs.

Run: ``python benchmarks/bench_drift.py --json drift.json`` (``--smoke`` for a tiny version).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import numpy as np  # noqa: E402


def _model(args) -> dict:
    """The model every run trains and the cost model prices (TrainConfig fields)."""
    return {
        "embedding_dim": args.dim,
        "bottom_mlp": [13, 64, args.dim],
        "top_mlp": [64, 1],
        "interaction": "dot",
    }


def _run(ds, placement: str, args, **kw):
    from hotline import TrainConfig, Trainer

    cfg = TrainConfig(mode="hotline", placement_path=placement, **_model(args), mini_batch_size=args.batch,
                      num_batches=args.steps, progress=False, lookahead=args.lookahead, print_freq=10**9,
                      **kw)  # fmt: skip
    tr = Trainer(cfg, ds)
    try:
        steps, t0 = [], None
        for i, s in enumerate(tr.progress(tr.batches())):
            if i == args.warmup_steps:
                t0 = time.perf_counter()
            steps.append(s)
        seconds = time.perf_counter() - t0
        replaced = [r for r in tr.history if r.get("kind") == "replace"]
    finally:
        tr.close()
    timed = steps[args.warmup_steps :]
    per_day = np.array_split(np.arange(len(steps)), args.drift_days)
    share = [
        sum(steps[i].counters["hot_lookups"] for i in d) / sum(steps[i].counters["lookups"] for i in d)
        for d in per_day
    ]
    popular = [
        sum(steps[i].counters["popular_samples"] for i in d) / sum(steps[i].samples for i in d)
        for d in per_day
    ]
    return {
        "samples_per_s": sum(s.samples for s in timed) / seconds,
        "ms_per_step": 1e3 * seconds / len(timed),
        "hot_lookup_share": sum(s.counters["hot_lookups"] for s in steps) / sum(s.counters["lookups"] for s in steps),
        "hot_share_by_day": share,
        "popular_share_by_day": popular,
        "cold_rows_per_step": float(np.mean([s.counters["working_set_rows"] for s in steps])),
        "replacements": len(replaced),
        "rows_promoted": sum(r["promoted"] for r in replaced),
        "replace_ms_mean": 1e3 * float(np.mean([r["seconds"] for r in replaced])) if replaced else 0.0,
        "replace_ms_max": 1e3 * max((r["seconds"] for r in replaced), default=0.0),
        "popular_sample_share": sum(s.counters["popular_samples"] for s in steps) / sum(s.samples for s in steps),
    }  # fmt: skip


def _counting_ms(ds, args) -> float:
    """The online counting's own cost per step: the counting kernel over the run's batches, timed apart (an
    end-to-end A/B of two 2-second runs on a shared host is noisier than the effect)."""
    from hotline.profiling.online import OnlineCounts
    from hotline.table_layout import TableLayout

    layout = TableLayout(ds.table_sizes)
    counts = OnlineCounts(layout.num_rows, 0.99)
    offsets = layout.column_offsets(ds.pooling_factor)
    batches = [np.ascontiguousarray(ds.train.sparse[i * args.batch : (i + 1) * args.batch]).reshape(args.batch, -1)
               for i in range(min(args.steps, len(ds.train) // args.batch))]  # fmt: skip
    counts.add(batches[0], offsets)  # compiled
    t0 = time.perf_counter()
    for b in batches:
        counts.add(b, offsets)
    return 1e3 * (time.perf_counter() - t0) / len(batches)


def _unique_rows_per_batch(ds, args, batches: int = 20) -> float:
    """Unique rows a mini-batch looks up with nothing hot (hybrid's working set), over the first batches."""
    from hotline.table_layout import TableLayout

    layout = TableLayout(ds.table_sizes)
    sp = ds.train.sparse
    return float(np.mean([np.unique(layout.fuse(sp[i * args.batch : (i + 1) * args.batch])).size
                          for i in range(batches)]))  # fmt: skip


def _predicted(ds, args, run: dict, unique: float) -> dict:
    """The cost model's samples/s on ``args.gpu`` from what the run measured (hot share, popular share, cold
    rows per step), hotline K=0 and K>=1."""
    from hotline import costmodel

    work = costmodel.Workload(args.batch, ds.num_tables, ds.pooling_factor, args.dim, worker_threads=4,
                              **costmodel.arch_of(_model(args)))  # fmt: skip
    stats = costmodel.Stats(
        run["hot_lookup_share"], run["popular_sample_share"], run["cold_rows_per_step"], unique
    )
    hw = costmodel.load_hardware(args.gpu)
    return {m: costmodel.predict(m, work, stats, hw).samples_per_s for m in ("hotline_k0", "hotline_k1")}


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__)
    p.add_argument("--rows", type=int, default=400_000, help="samples in the drifting dataset")
    p.add_argument("--max-rows-per-table", type=int, default=200_000)
    p.add_argument("--drift-days", type=int, default=6)
    p.add_argument("--drift-rate", type=float, default=0.3)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--lookahead", type=int, default=0)
    p.add_argument("--budget-share", type=float, default=0.02, help="hot rows: share of the rows")
    p.add_argument("--replace-every", type=int, default=25)
    p.add_argument("--rounds", type=int, default=3, help="alternating static / counting-only runs (median)")
    p.add_argument("--gpu", default="H200", help="the known GPU the cost model predicts for")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.max_rows_per_table, args.steps, args.batch, args.dim = 6000, 2000, 40, 64, 8
        args.warmup_steps, args.replace_every, args.rounds = 2, 10, 1
    common.setup_threads(args.threads)
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import KAGGLE_TABLE_SIZES, generate
    from hotline.placement import Placement

    with tempfile.TemporaryDirectory() as tmp:
        ds = Dataset(generate(Path(tmp) / "ds", args.rows, seed=args.seed, max_rows_per_table=args.max_rows_per_table,
                              table_sizes=KAGGLE_TABLE_SIZES, drift_days=args.drift_days, drift_rate=args.drift_rate,
                              progress=False))  # fmt: skip
        first_day = ds.train.sparse[: len(ds.train) // args.drift_days]
        hot = []
        for t, n in enumerate(ds.table_sizes):
            k = max(1, int(n * args.budget_share))
            hot.append(np.argsort(-np.bincount(first_day[:, t].reshape(-1), minlength=n), kind="stable")[:k])
        placement = Placement.from_hot_ids(ds.table_sizes, hot, dataset_fingerprint=ds.fingerprint,
                                           embedding_dim=args.dim, bytes_per_row=4 * args.dim)  # fmt: skip
        path = str(placement.save(Path(tmp) / "p.npz"))
        rows = []
        for name, kw in (("static", {}), ("counting only", {"replace_every": 10**9}),
                         ("adaptive", {"replace_every": args.replace_every})):  # fmt: skip
            rows.append({"placement": name, **_run(ds, path, args, **kw)})
        static, counting, adaptive = rows
        # the A/B again, alternating, for a median that a burst of noise does not decide
        ratios = [counting["ms_per_step"] / static["ms_per_step"]]
        for _ in range(args.rounds - 1):
            a, b = (
                _run(ds, path, args)["ms_per_step"],
                _run(ds, path, args, replace_every=10**9)["ms_per_step"],
            )
            ratios.append(b / a)
        counting_ms = _counting_ms(ds, args)
        unique = _unique_rows_per_batch(ds, args)
        for r in rows:
            pred = _predicted(ds, args, r, unique)
            r["predicted_k0"], r["predicted_k1"] = pred["hotline_k0"], pred["hotline_k1"]
    print(f"drift: {args.drift_days} days, rate {args.drift_rate}; {placement.num_hot:,} hot rows "
          f"({args.budget_share:.0%} of {sum(ds.table_sizes):,}); batch {args.batch}, {args.steps} steps, K={args.lookahead}")  # fmt: skip
    for r in rows:
        r["hot_share_by_day_text"] = " ".join(f"{x:.2f}" for x in r["hot_share_by_day"])
    common.print_table(rows, [("placement", "placement", ""), ("samples_per_s", "samples/s", ".0f"),
                              ("ms_per_step", "ms/step", ".1f"), ("hot_lookup_share", "hot share", ".3f"),
                              ("hot_share_by_day_text", "hot share by day", ""), ("cold_rows_per_step", "cold rows/step", ".0f"),
                              ("replacements", "re-placements", "d"), ("rows_promoted", "promoted", "d"),
                              ("replace_ms_mean", "ms/re-placement", ".1f"),
                              ("predicted_k0", f"{args.gpu} K=0/s", ".0f"), ("predicted_k1", f"{args.gpu} K>=1/s", ".0f")])  # fmt: skip
    overhead = float(np.median(ratios)) - 1
    kernel_share = counting_ms / static["ms_per_step"]
    print(f"online counting: the kernel takes {counting_ms:.3f} ms of a {static['ms_per_step']:.2f} ms step "
          f"({kernel_share:.1%}); end to end (median of {len(ratios)} alternating A/B runs: "
          f"{', '.join(f'{r - 1:+.1%}' for r in ratios)}) {overhead:+.1%}")  # fmt: skip
    print(f"adaptive/static samples/s on this CPU: {adaptive['samples_per_s'] / static['samples_per_s']:.2f}x; "
          f"predicted on {args.gpu} (K>=1): {adaptive['predicted_k1'] / static['predicted_k1']:.2f}x; "
          f"hot share +{adaptive['hot_lookup_share'] - static['hot_lookup_share']:.3f}; a re-placement takes "
          f"{adaptive['replace_ms_mean']:.1f} ms on average ({adaptive['replace_ms_max']:.1f} ms at most)")  # fmt: skip
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    common.write_json(args.json, {"results": rows, "counting_overhead": overhead, "counting_kernel_ms": counting_ms,
                                  "counting_kernel_share": kernel_share, "ab_ratios": ratios, "args": settings})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
