"""Criteo Kaggle / Terabyte preprocessing: raw tab-separated text -> a Hotline dataset directory.

Same conversion as the reference DLRM (facebookresearch/dlrm ``data_utils.py``), so results compare:
missing integers -> 0, negative integers -> 0, dense = ``log(x + 1)`` in float32, categories parsed as hex
(missing -> 0), optionally taken modulo ``max_ind_range``, then mapped per table to contiguous ids in the
order of the sorted unique raw values over all the data.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from hotline.kernels.criteo_parse import NUM_CATEGORICAL, NUM_DENSE, format_lines

# Rows formatted per write in write_raw_tsv: bounds memory to ~300 bytes per row.
_WRITE_ROWS = 1 << 18


def write_raw_tsv(
    path: str | os.PathLike,
    labels: np.ndarray,
    dense: np.ndarray,
    cats: np.ndarray,
    append: bool = False,
) -> Path:
    """Writes rows as raw Criteo text lines (``label \\t I1..I13 \\t C1..C26``), gzip-compressed if ``.gz``.

    ``labels``: int [N] in {0, 1}. ``dense``: int64 [N, 13], a negative value means missing (empty field;
    real Criteo files do hold negative integers, which this writer cannot express). ``cats``: uint32 or int64
    [N, 26] category values written as lowercase hex with at least 8 digits; a negative value means missing
    (empty field). ``append`` adds to an existing file instead of replacing it.
    """
    path = Path(path)
    labels = np.asarray(labels)
    dense = np.asarray(dense)
    cats = np.asarray(cats)
    n = labels.shape[0] if labels.ndim == 1 else -1
    if labels.ndim != 1 or dense.shape != (n, NUM_DENSE) or cats.shape != (n, NUM_CATEGORICAL):
        raise ValueError(
            f"expected labels [N], dense [N, {NUM_DENSE}], cats [N, {NUM_CATEGORICAL}]; "
            f"got {labels.shape}, {dense.shape}, {cats.shape}"
        )
    for name, a in (("labels", labels), ("dense", dense), ("cats", cats)):
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"{name} must be an integer array, got {a.dtype}")
    if cats.dtype == np.uint64 and cats.size and int(cats.max()) > np.iinfo(np.int64).max:
        raise ValueError("cats values must fit in int64")
    mode = "ab" if append else "wb"
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, mode) as f:
        for a in range(0, n, _WRITE_ROWS):
            b = min(n, a + _WRITE_ROWS)
            f.write(format_lines(labels[a:b], dense[a:b], cats[a:b]).data)
    return path


def add_parser(subparsers) -> None:
    """Registers ``hotline data criteo`` (full preprocessing lands in the next commit)."""
    parser = subparsers.add_parser("criteo", help="preprocess raw Criteo Kaggle / Terabyte files")
    parser.set_defaults(func=run)


def run(args) -> int:
    raise NotImplementedError("hotline data criteo is being written")
