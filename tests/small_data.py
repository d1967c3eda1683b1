"""The small synthetic datasets the training tests run on, and placements of their most counted rows: the
set-up those tests share. Tests import it as ``small_data`` (pytest puts tests/ on ``sys.path``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hotline.datasets.format import Dataset
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
