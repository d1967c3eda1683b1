"""The small synthetic datasets the training tests run on, and placements of their most counted rows: the
set-up those tests share. Tests import it as ``small_data`` (pytest puts tests/ on ``sys.path``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hotline.datasets.format import Dataset, DatasetWriter
from hotline.datasets.synthetic import generate
from hotline.placement import Placement


def zipf_dataset(path: Path, samples: int, seed: int, tables: list[int], zipf: float = 1.3, **kw) -> Dataset:
    """``samples`` samples over tables of ``tables`` rows, ids drawn Zipf(``zipf``) (some rows popular, most
    rare), written at ``path``; ``kw`` goes to ``generate`` (``pooling_factor``, ``drift_days``, ...)."""
    return Dataset(generate(path, samples, seed=seed, table_sizes=tables, zipf=zipf, progress=False, **kw))


def hot_placement(ds: Dataset, path: Path, share: float, counted: int, skip: int = 0, **kw) -> str:
    """The placement of ``ds`` whose hot rows are, in each table, the ``share`` most counted (at least one) in
    the first ``counted`` training samples, after the ``skip`` most counted (ties: the lower id first); saved
    at ``path``, whose name it returns. ``kw`` goes to ``Placement.from_hot_ids`` (``embedding_dim``: 8)."""
    sp = ds.train.sparse[:counted]
    hot = [
        np.argsort(-np.bincount(sp[:, t].reshape(-1), minlength=n), kind="stable")[
            skip : skip + max(1, int(n * share))
        ]
        for t, n in enumerate(ds.table_sizes)
    ]
    kw.setdefault("embedding_dim", 8)
    Placement.from_hot_ids(ds.table_sizes, hot, dataset_fingerprint=ds.fingerprint, **kw).save(path)
    return str(path)


def write_zipf_dataset(
    out: Path,
    n: int,
    table_sizes: list[int],
    pooling_factor: int = 1,
    seed: int = 0,
    s: float = 1.05,
    bad_id: bool = False,
) -> Dataset:
    """A training split of ``n`` samples whose ids follow a bounded Zipf(``s``) law per table, hot rows scattered
    by a permutation (the profiler's and the torchrec bridge's tests); ``bad_id``: one id out of its table."""
    rng = np.random.default_rng(seed)
    with DatasetWriter(out, table_sizes, pooling_factor=pooling_factor) as w:
        dense, sparse, labels = w.create_split("train", n)
        for t, size in enumerate(table_sizes):
            u = rng.random((n, pooling_factor))
            x = (1.0 + u * ((size + 1.0) ** (1 - s) - 1.0)) ** (1.0 / (1 - s))
            ranks = np.minimum(x.astype(np.int64) - 1, size - 1)
            sparse[:, t, :] = rng.permutation(size)[ranks]
        if bad_id:
            sparse[n // 2, 1, 0] = table_sizes[1]
        dense[:] = rng.random(dense.shape, dtype=np.float32)
        labels[:] = rng.random(n) < 0.25
        w.finish(source={"kind": "test-zipf", "seed": seed, "n": n})
    return Dataset(out)
