"""The fused id space of a dataset's embedding tables, and what one row costs in memory.

Every stage after the dataset addresses rows by a *fused* id: row ``r`` of table ``t`` is fused row
``offsets[t] + r``, so all tables form one ``[sum(table_sizes), D]`` array. :class:`TableLayout` is the one
place that computes the offsets, turns ``[B, T, L]`` id batches into fused ids, checks ids against the table
sizes, and cuts fused arrays back into tables. :func:`bytes_per_row` is the one place that knows what a row
costs: float32 weights plus the optimizer's state floats.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

OPTIMIZERS = ("sgd", "rowwise-adagrad", "adagrad", "adam")
# State floats of a row as (per row, per element): Adam keeps two moments per element and a step count per row.
_STATE_FLOATS = {"sgd": (0, 0), "rowwise-adagrad": (1, 0), "adagrad": (0, 1), "adam": (1, 2)}


def state_floats_per_row(optimizer: str, embedding_dim: int = 0) -> int:
    """Optimizer state floats kept per embedding row of width ``embedding_dim``: none for SGD, one for row-wise
    Adagrad, D for Adagrad (one accumulator per element), 2 D + 1 for Adam (two moments per element and the
    row's step count)."""
    if optimizer not in _STATE_FLOATS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    per_row, per_element = _STATE_FLOATS[optimizer]
    if per_element and embedding_dim <= 0:
        raise ValueError(f"the state of optimizer {optimizer!r} depends on the embedding dim: give it (> 0)")
    return per_row + per_element * embedding_dim


def bytes_per_row(embedding_dim: int, optimizer: str) -> int:
    """Bytes one embedding row costs wherever it lives: float32 weights plus its optimizer state."""
    if embedding_dim <= 0:
        raise ValueError(f"embedding_dim must be positive, got {embedding_dim}")
    return 4 * (embedding_dim + state_floats_per_row(optimizer, embedding_dim))


class TableLayout:
    """Table sizes and the offsets of the fused id space (``offsets[t]``: the first fused row of table t)."""

    def __init__(self, table_sizes: Sequence[int]):
        sizes = np.asarray([int(s) for s in table_sizes], dtype=np.int64)
        if sizes.ndim != 1 or (sizes < 0).any():
            raise ValueError(f"table sizes must be non-negative ints, got {list(table_sizes)!r}")
        self.table_sizes: list[int] = [int(s) for s in sizes]
        self.sizes = sizes
        """int64 [T]: rows per table."""
        self.offsets = np.zeros(sizes.shape[0], dtype=np.int64)
        """int64 [T]: where each table starts in the fused id space."""
        if sizes.shape[0] > 1:
            np.cumsum(sizes[:-1], out=self.offsets[1:])
        self.num_rows = int(sizes.sum())
        """Rows of all tables together."""

    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)

    def bounds(self) -> np.ndarray:
        """int64 [T+1]: the offsets followed by the total number of rows."""
        return np.append(self.offsets, self.num_rows)

    def column_offsets(self, pooling_factor: int) -> np.ndarray:
        """int64 [T*L]: the table offset of each column of a flattened ``[B, T*L]`` id batch."""
        return np.repeat(self.offsets, int(pooling_factor))

    def column_sizes(self, pooling_factor: int) -> np.ndarray:
        """int64 [T*L]: the table size of each column of a flattened ``[B, T*L]`` id batch."""
        return np.repeat(self.sizes, int(pooling_factor))

    def check(self, sparse: np.ndarray) -> None:
        """Raises IndexError naming the table and id if any id of ``sparse`` [B, T, L] is out of range."""
        if sparse.ndim != 3 or sparse.shape[1] != self.num_tables:
            raise ValueError(f"sparse ids must be [B, {self.num_tables}, L], got shape {sparse.shape}")
        bad = (sparse < 0) | (sparse >= self.sizes[None, :, None])
        if bad.any():
            b, t, l = (int(x[0]) for x in np.nonzero(bad))
            raise IndexError(
                f"table {t}: id {int(sparse[b, t, l])} out of range [0, {self.table_sizes[t]}) "
                f"(sample {b} of the batch)"
            )

    def fuse(self, sparse: np.ndarray) -> np.ndarray:
        """int64 [B*T*L]: the fused ids of a checked ``[B, T, L]`` id batch, in sample, table, bag order."""
        self.check(sparse)
        return (sparse.astype(np.int64) + self.offsets[None, :, None]).reshape(-1)

    def fuse_rows(self, rows_per_table: Sequence[np.ndarray]) -> np.ndarray:
        """int64: the fused ids of per-table row ids, table after table."""
        parts = [self.offsets[t] + np.asarray(r, dtype=np.int64) for t, r in enumerate(rows_per_table)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def split(self, fused: np.ndarray) -> list[np.ndarray]:
        """Views of a fused ``[num_rows, ...]`` array, one per table."""
        return [fused[o : o + n] for o, n in zip(self.offsets, self.table_sizes)]

    def split_state(self, fused: np.ndarray) -> list[np.ndarray]:
        """Like :meth:`split` for a per-row optimizer state, empty arrays where it holds none (SGD)."""
        if not fused.size:
            return [np.zeros(0, np.float32) for _ in self.table_sizes]
        return self.split(fused)
