"""The fused id space of a dataset's embedding tables, and what one row costs in memory.

Every stage after the dataset addresses rows by a *fused* id: row ``r`` of table ``t`` is fused row
``offsets[t] + r``, so all tables form one ``[sum(table_sizes), D]`` array. :class:`TableLayout` is the one
place that computes the offsets, turns ``[B, T, L]`` id batches into fused ids, checks ids against the table
sizes, and cuts fused arrays back into tables. :class:`BagLayout` says where each table's bag sits in a
flattened ``[B, C]`` id batch (multi-hot bags of per-table sizes, shorter bags padded with :data:`PAD_ID`).
:func:`bytes_per_row` is the one place that knows what a row costs: float32 weights plus the optimizer's
state floats.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hotline.kinds import OPTIMIZERS

PAD_ID = -1
"""The id that fills a bag shorter than its table's bag size: every kernel skips it, pooling ignores it."""
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


MAX_LEARNING_RATE = float(np.finfo(np.float32).max)
"""The largest learning rate accepted: float32's largest number (3.4e38), which the tables' updates take it
as. A larger one is not a number there (a traceback inside torch); a merely huge one diverges, and the run
stops at the first non-finite loss with its one line (exit 3)."""


def check_optimizer(optimizer: str, lr: float, embedding_dim: int | None = None) -> None:
    """Raises ValueError, in one line naming the field, unless ``optimizer`` is one of :data:`OPTIMIZERS` and
    ``lr`` a learning rate the tables take (positive, at most :data:`MAX_LEARNING_RATE`); with
    ``embedding_dim``, also unless it is what the optimizer's state needs (:func:`state_floats_per_row`). The
    rule :class:`hotline.tiers.sparse_optim.SparseOptimizer` applies, kept here so that a config can check its
    fields without the tiers."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if not 0 < lr <= MAX_LEARNING_RATE:  # NaN fails too
        raise ValueError(
            f"learning rate (--learning-rate) must be positive and at most {MAX_LEARNING_RATE:.4g} (float32's "
            f"largest), got {lr}"
        )
    if embedding_dim is not None:
        state_floats_per_row(optimizer, embedding_dim)


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


class BagLayout:
    """Where each table's bag sits in a sample's flattened ids: table t owns the ``bag_sizes[t]`` columns
    ``bag_start[t]:bag_start[t+1]`` of a ``[B, C]`` id batch (C = sum of the bag sizes).

    A uniform layout (every bag size L) is the old ``[B, T, L]`` array seen flat; one-hot is L = 1.
    ``padded``: a bag may be shorter than its size, the rest of its columns holding :data:`PAD_ID`, which
    lookups, counts and updates skip (sum pooling then sums the real ids only); without it PAD_ID is an
    out-of-range id like any other negative one.
    """

    def __init__(self, layout: TableLayout, bag_sizes: Sequence[int], padded: bool = False):
        sizes = [int(b) for b in bag_sizes]
        if len(sizes) != layout.num_tables or any(b < 1 for b in sizes):
            raise ValueError(
                f"bag sizes must be {layout.num_tables} integers >= 1 (one per table), got {list(bag_sizes)!r}"
            )
        self.layout = layout
        self.bag_sizes: list[int] = sizes
        self.padded = bool(padded)
        self.bag_start = np.zeros(len(sizes) + 1, dtype=np.int64)
        """int64 [T+1]: the first column of each table's bag, then C."""
        np.cumsum(sizes, out=self.bag_start[1:])
        self.num_columns = int(self.bag_start[-1])
        """C: id columns per sample."""
        self.col_table = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        """int64 [C]: the table of each column."""
        self.col_offset = layout.offsets[self.col_table]
        """int64 [C]: the fused offset of each column's table."""
        self.col_size = layout.sizes[self.col_table]
        """int64 [C]: the row count of each column's table."""

    @classmethod
    def uniform(cls, layout: TableLayout, pooling_factor: int) -> BagLayout:
        """Every table's bag holds ``pooling_factor`` ids, never padded (the one-hot / fixed-L datasets)."""
        return cls(layout, [int(pooling_factor)] * layout.num_tables)

    @property
    def pooling_factor(self) -> int:
        """The common bag size of a uniform layout, else 0."""
        first = self.bag_sizes[0]
        return first if all(b == first for b in self.bag_sizes) else 0

    @property
    def one_hot(self) -> bool:
        """Every bag one id, none padded: the fast path (pooling is a view)."""
        return self.pooling_factor == 1 and not self.padded

    def flat(self, sparse: np.ndarray) -> np.ndarray:
        """The ``[B, C]`` view of an id batch given as ``[B, C]`` or (uniform layouts) ``[B, T, L]``."""
        B = sparse.shape[0]
        if sparse.ndim == 3 and sparse.shape[1:] == (self.layout.num_tables, self.pooling_factor):
            return sparse.reshape(B, self.num_columns)
        if sparse.ndim == 2 and sparse.shape[1] == self.num_columns:
            return sparse
        want = f"[B, {self.num_columns}]"
        if self.pooling_factor:
            want += f" or [B, {self.layout.num_tables}, {self.pooling_factor}]"
        raise ValueError(f"sparse ids must be {want} (bag sizes {self.bag_sizes}), got shape {sparse.shape}")

    def check(self, sparse: np.ndarray, first_sample: int | None = None) -> np.ndarray:
        """The ``[B, C]`` ids of ``sparse``; raises IndexError naming the table and id of the first one out of
        range (PAD_ID is in range when the layout is padded), and its sample: counted from ``first_sample``
        in the file when that is given, else within the batch."""
        ids = self.flat(sparse)
        bad = (ids < 0) | (ids >= self.col_size[None, :])
        if self.padded:
            bad &= ids != PAD_ID
        if bad.any():
            b, c = (int(x[0]) for x in np.nonzero(bad))
            t = int(self.col_table[c])
            what = f"table {t}: id {int(ids[b, c])} out of range [0, {self.layout.table_sizes[t]})"
            position = c - int(self.bag_start[t])
            if first_sample is not None:
                raise IndexError(f"sample {first_sample + b}, {what} (bag position {position})")
            raise IndexError(f"{what} (sample {b} of the batch, bag position {position})")
        return ids

    def fuse(self, sparse: np.ndarray) -> np.ndarray:
        """int64 [B*C]: fused ids of a checked batch in sample, column order; padding stays PAD_ID."""
        ids = self.check(sparse)
        fused = ids.astype(np.int64) + self.col_offset[None, :]
        if self.padded:
            fused[ids == PAD_ID] = PAD_ID
        return fused.reshape(-1)

    def lookups(self, sparse: np.ndarray) -> int:
        """Real lookups of a batch (its ids that are not padding)."""
        return int(sparse.size if not self.padded else np.count_nonzero(np.asarray(sparse) != PAD_ID))
