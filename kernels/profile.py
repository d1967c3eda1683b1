"""Profiling kernels: access counts per embedding row, and the largest popularity rank per sample.

All tables share one *fused* id space: row ``r`` of table ``t`` has fused id ``table_offsets[t] + r``, so
one count array covers every table and one sort ranks rows of all tables against each other.

Counting is a scatter-add, which races when threads share one array. Each thread therefore owns a private
count array (``private_counts[p]``) and counts its own block of samples into it; the arrays are summed once
at the end, after every chunk of the dataset has been counted. With few private arrays (one per thread) the
reduction costs one pass over the id space, far less than the lookups themselves on real data.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def _count_lookups(sparse, table_sizes, table_offsets, private_counts):
    """Adds the lookups of ``sparse`` [n, T, L] into ``private_counts`` [P, R]; returns the first bad
    flat position (sample * T * L + t * L + l) of an out-of-range id, or -1 when every id is valid."""
    n, T, L = sparse.shape
    P = private_counts.shape[0]
    first_bad = np.full(P, -1, dtype=np.int64)
    for p in prange(P):
        lo = n * p // P
        hi = n * (p + 1) // P
        counts = private_counts[p]
        for i in range(lo, hi):
            for t in range(T):
                size = table_sizes[t]
                base = table_offsets[t]
                for j in range(L):
                    row = sparse[i, t, j]
                    if row < 0 or row >= size:
                        if first_bad[p] < 0:
                            first_bad[p] = (i * T + t) * L + j
                    else:
                        counts[base + row] += 1
    bad = -1
    for p in range(P):
        if first_bad[p] >= 0 and (bad < 0 or first_bad[p] < bad):
            bad = first_bad[p]
    return bad


@njit(cache=True, parallel=True)
def _sum_private(private_counts, out):
    """Adds the rows of ``private_counts`` [P, R] into ``out`` [R], in parallel over the id space."""
    P, R = private_counts.shape
    for r in prange(R):
        s = out[r]
        for p in range(P):
            s += private_counts[p, r]
        out[r] = s


@njit(cache=True, parallel=True)
def _sample_max_rank(sparse, table_sizes, table_offsets, rank, out):
    """Writes into ``out`` [n] the largest ``rank`` of the fused rows that sample i looks up (-1 if none);
    returns the first bad flat position of an out-of-range id, or -1."""
    n, T, L = sparse.shape
    bad_at = np.full(n, -1, dtype=np.int64)
    for i in prange(n):
        m = -1
        for t in range(T):
            size = table_sizes[t]
            base = table_offsets[t]
            for j in range(L):
                row = sparse[i, t, j]
                if row < 0 or row >= size:
                    if bad_at[i] < 0:
                        bad_at[i] = (i * T + t) * L + j
                else:
                    r = rank[base + row]
                    if r > m:
                        m = r
        out[i] = m
    for i in range(n):
        if bad_at[i] >= 0:
            return bad_at[i]
    return -1


@njit(cache=True)
def _add_histogram(values, hist):
    """``hist[v] += 1`` for every v in ``values`` (all within ``0 <= v < len(hist)``)."""
    for i in range(values.shape[0]):
        hist[values[i]] += 1


def table_offsets(table_sizes) -> np.ndarray:
    """int64 [T+1]: where each table starts in the fused id space (the last entry is the total rows)."""
    sizes = np.asarray(table_sizes, dtype=np.int64)
    if sizes.ndim != 1 or (sizes < 0).any():
        raise ValueError(f"table_sizes must be a list of non-negative ints, got {table_sizes!r}")
    out = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=out[1:])
    return out


def _as_sparse(sparse: np.ndarray, num_tables: int) -> np.ndarray:
    sparse = np.asarray(sparse)
    if sparse.ndim == 2:
        sparse = sparse[:, :, None]
    if sparse.ndim != 3 or sparse.shape[1] != num_tables:
        raise ValueError(
            f"sparse ids must have shape [n, {num_tables}, L] (or [n, {num_tables}]), got {sparse.shape}"
        )
    if not np.issubdtype(sparse.dtype, np.integer):
        raise ValueError(f"sparse ids must be integers, got dtype {sparse.dtype}")
    return np.ascontiguousarray(sparse, dtype=np.int32)


class BadIdError(ValueError):
    """A row id outside its table; ``sample`` is the index within the array passed to the kernel."""

    def __init__(self, sample: int, table: int, lookup: int, row_id: int, table_size: int):
        self.sample, self.table, self.lookup, self.row_id, self.table_size = (
            sample,
            table,
            lookup,
            row_id,
            table_size,
        )
        super().__init__(
            f"sample {sample}, table {table}, lookup {lookup}: row id {row_id} is outside the table "
            f"(expected 0 <= id < {table_size})"
        )


def _bad_id_error(sparse: np.ndarray, table_sizes: np.ndarray, flat: int) -> BadIdError:
    n, T, L = sparse.shape
    i, rest = divmod(int(flat), T * L)
    t, j = divmod(rest, L)
    return BadIdError(i, t, j, int(sparse[i, t, j]), int(table_sizes[t]))


def new_private_counts(table_sizes, num_private: int) -> np.ndarray:
    """Zeroed int64 [num_private, total rows]: the per-thread accumulators for :func:`count_lookups`."""
    total = int(np.sum(np.asarray(table_sizes, dtype=np.int64)))
    return np.zeros((max(1, int(num_private)), total), dtype=np.int64)


def count_lookups(sparse: np.ndarray, table_sizes, private_counts: np.ndarray) -> None:
    """Adds the lookups of ``sparse`` (int [n, T, L]) into ``private_counts`` (int64 [P, total rows]).

    Call it once per chunk of a dataset, then :func:`reduce_counts` once. Raises :class:`BadIdError` naming
    the sample, table and id when an id is outside its table (``private_counts`` then holds a partial count).
    """
    sizes = np.asarray(table_sizes, dtype=np.int64)
    sparse = _as_sparse(sparse, sizes.shape[0])
    offsets = table_offsets(sizes)
    if (
        private_counts.ndim != 2
        or private_counts.dtype != np.int64
        or private_counts.shape[1] != offsets[-1]
        or not private_counts.flags.c_contiguous
    ):
        raise ValueError(
            f"private_counts must be C-contiguous int64 [P, {int(offsets[-1])}], "
            f"got {private_counts.dtype} {private_counts.shape}"
        )
    bad = _count_lookups(sparse, sizes, offsets[:-1], private_counts)
    if bad >= 0:
        raise _bad_id_error(sparse, sizes, bad)


def reduce_counts(private_counts: np.ndarray) -> np.ndarray:
    """int64 [total rows]: the sum of the per-thread accumulators."""
    out = np.zeros(private_counts.shape[1], dtype=np.int64)
    _sum_private(private_counts, out)
    return out


def lookup_counts(sparse: np.ndarray, table_sizes, num_private: int = 2) -> np.ndarray:
    """int64 [total rows]: how often each fused row (table offset + row id) is looked up in ``sparse``."""
    private = new_private_counts(table_sizes, num_private)
    count_lookups(sparse, table_sizes, private)
    return reduce_counts(private)


def sample_max_rank(sparse: np.ndarray, table_sizes, rank: np.ndarray) -> np.ndarray:
    """int64 [n]: for each sample, the largest ``rank[fused row]`` over its lookups (-1 for no lookups).

    A sample is *popular* under a placement of the ``k`` best-ranked rows iff its max rank is ``< k``.
    """
    sizes = np.asarray(table_sizes, dtype=np.int64)
    sparse = _as_sparse(sparse, sizes.shape[0])
    offsets = table_offsets(sizes)
    rank = np.ascontiguousarray(rank, dtype=np.int64)
    if rank.shape != (int(offsets[-1]),):
        raise ValueError(f"rank must have shape [{int(offsets[-1])}] (one per fused row), got {rank.shape}")
    out = np.empty(sparse.shape[0], dtype=np.int64)
    bad = _sample_max_rank(sparse, sizes, offsets[:-1], rank, out)
    if bad >= 0:
        raise _bad_id_error(sparse, sizes, bad)
    return out


def add_histogram(values: np.ndarray, hist: np.ndarray) -> None:
    """``hist[v] += 1`` for every value (int64 values in ``[0, len(hist))``; checked)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    if values.size and (values.min() < 0 or values.max() >= hist.shape[0]):
        raise ValueError(
            f"histogram values must lie in [0, {hist.shape[0]}), got [{values.min()}, {values.max()}]"
        )
    if hist.dtype != np.int64 or hist.ndim != 1:
        raise ValueError(f"hist must be int64 [bins], got {hist.dtype} {hist.shape}")
    _add_histogram(values, hist)
