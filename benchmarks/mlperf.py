"""The MLPerf DLRM-DCNv2 workload for the benchmarks (``bench_pipeline.py --config mlperf-dcnv2``,
``gpu_bench.py``'s dcnv2 part), and the measurement of how much its multi-hot bags cut the share of
popular samples.

A sample is popular when EVERY lookup hits a hot row: with MLPerf's 214 ids per sample (one-hot Criteo: 26) a
sample has eight times more chances to touch one cold row, so at the same hot-tier coverage far fewer samples
are popular. :func:`popular_share_by_bags` measures it: the same tables, skew, seed and rows, once one-hot and
once with the MLPerf bags, each profiled over its whole training split, compared at the same coverage targets.
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "mlperf-dcnv2"


def config(max_batch: int = 1024) -> dict:
    """TrainConfig fields of MLPerf DLRM-DCNv2 (the ``--preset``'s model and optimizer) at a batch this machine
    runs; the DCN interaction where this checkout has it (else dot, said on stderr)."""
    from dataclasses import fields

    from hotline.training.config import TrainConfig
    from hotline.training.presets import PRESETS

    known = {f.name for f in fields(TrainConfig)}
    cfg = {k: v for k, v in PRESETS[NAME].items() if k in known and k not in ("optimizer", "learning_rate")}
    cfg["mini_batch_size"] = max_batch
    if not has_dcn():
        print("mlperf-dcnv2: this checkout has no dcn interaction yet: dot instead", file=sys.stderr)
        cfg["interaction"] = "dot"
    return cfg


def has_dcn() -> bool:
    from hotline.models import dlrm

    return "dcn" in getattr(dlrm, "INTERACTIONS", ())


def data_options() -> dict:
    """``generate`` options of the MLPerf shape: its table sizes (capped by the caller) and bag sizes."""
    from hotline.datasets.mlperf import MLPERF_BAG_SIZES, MLPERF_TABLE_SIZES

    return {"table_sizes": list(MLPERF_TABLE_SIZES), "bag_sizes": list(MLPERF_BAG_SIZES)}


def popular_share_by_bags(
    dataset, profile_of, coverages, root: Path, seed: int, zipf: float, cap: int
) -> dict:
    """Popular share of the multi-hot ``dataset`` and of its one-hot twin at the same coverage targets, each from
    its own profile (``profile_of(dataset)``) of the whole training split: measured, not modelled."""
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate

    rows = len(dataset.train) + len(dataset.val) + len(dataset.test)
    twin = Dataset(generate(root / "one-hot", rows, seed=seed, table_sizes=data_options()["table_sizes"],
                            max_rows_per_table=cap, zipf=zipf, progress=False))  # fmt: skip
    out = {"targets": list(coverages), "one_hot": [], "multi_hot": [], "lookups_per_sample": {}}
    for key, ds in (("one_hot", twin), ("multi_hot", dataset)):
        prof = profile_of(ds)
        out["lookups_per_sample"][key] = prof.total_lookups / prof.num_samples
        cov = prof._cum_counts / max(1, prof.total_lookups)
        for t in coverages:
            k = min(int((cov < t - 1e-12).sum()), cov.shape[0] - 1)
            out[key].append(float(prof._popular_cum[k]) / prof.num_samples)
    lines = [
        f"popular share at the same coverage, one-hot ({out['lookups_per_sample']['one_hot']:.0f} ids/sample) -> "
        f"MLPerf multi-hot ({out['lookups_per_sample']['multi_hot']:.0f} ids/sample), measured by profiling "
        "each training split:"
    ]
    for t, a, b in zip(coverages, out["one_hot"], out["multi_hot"]):
        lines.append(f"  coverage {t:.0%}: {a:.3f} -> {b:.3f} ({b / a if a else float('nan'):.2f}x)")
    mid = len(coverages) // 2
    if out["multi_hot"] and out["multi_hot"][mid] < 0.5 * out["one_hot"][mid]:
        lines.append(
            "  so with multi-hot bags most samples have a cold lookup: the popular micro-batch (computed while the "
            "cold rows are gathered) shrinks, and what Hotline saves must come from gathering the working set "
            "ahead (look-ahead K > 0, fused micro-batches), not from the popular/non-popular split."
        )
    elif out["multi_hot"]:
        lines.append(
            "  so the popular micro-batch keeps most of its share: the split still overlaps the gather."
        )
    print("\n".join(lines))
    out["statement"] = lines
    return out
