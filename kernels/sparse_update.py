"""Sparse row updates: sum the gradients of duplicate ids, then update each touched row exactly once.

``torch.Tensor.index_add_`` manages about 2.5 M rows/s on this CPU and applies duplicates one at a time;
row-wise Adagrad needs the *summed* gradient of a row before its state is updated, so duplicates have to
be coalesced first anyway. The kernels sort the ids stably (so duplicates are summed in batch order,
deterministically), find the segments of equal ids, and update the segments in parallel.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True)
def _coalesce(ids):
    """Stable sort order of ``ids``, the start of each run of equal ids (plus the end), and the unique ids."""
    n = ids.shape[0]
    order = np.argsort(ids, kind="mergesort")
    starts = np.empty(n + 1, dtype=np.int64)
    uniq = np.empty(n, dtype=np.int64)
    u = 0
    for j in range(n):
        v = ids[order[j]]
        if j == 0 or v != uniq[u - 1]:
            starts[u] = j
            uniq[u] = v
            u += 1
    starts[u] = n
    return order, starts[: u + 1], uniq[:u]


@njit(cache=True, parallel=True)
def _segment_sum(grads, order, starts):
    """Sums the gradient rows of each segment, in stable (batch) order: [U, D]."""
    U = starts.shape[0] - 1
    D = grads.shape[1]
    out = np.zeros((U, D), dtype=np.float32)
    for s in prange(U):
        for j in range(starts[s], starts[s + 1]):
            g = grads[order[j]]
            for d in range(D):
                out[s, d] += g[d]
    return out


@njit(cache=True, parallel=True)
def _sgd_apply(table, rows, gsum, lr):
    for s in prange(rows.shape[0]):
        r = rows[s]
        for d in range(table.shape[1]):
            table[r, d] -= lr * gsum[s, d]


@njit(cache=True, parallel=True)
def _rowwise_adagrad_apply(table, state, rows, gsum, lr, eps):
    D = table.shape[1]
    for s in prange(rows.shape[0]):
        r = rows[s]
        sq = np.float32(0.0)
        for d in range(D):
            sq += gsum[s, d] * gsum[s, d]
        state[r] += sq / D
        scale = np.float32(lr) / (np.sqrt(state[r]) + np.float32(eps))
        for d in range(D):
            table[r, d] -= scale * gsum[s, d]


def _check(table: np.ndarray, ids: np.ndarray, grads: np.ndarray) -> np.ndarray:
    if table.dtype != np.float32 or table.ndim != 2 or not table.flags.c_contiguous:
        raise ValueError(
            f"table must be a C-contiguous float32 [rows, dim] array, got {table.dtype} {table.shape}"
        )
    ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    if grads.dtype != np.float32 or grads.shape != (ids.shape[0], table.shape[1]):
        raise ValueError(
            f"grads must be float32 [{ids.shape[0]}, {table.shape[1]}] (one row per id), got {grads.dtype} {grads.shape}"
        )
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        bad = ids[(ids < 0) | (ids >= table.shape[0])][0]
        raise IndexError(f"row id {bad} out of range for a table of {table.shape[0]} rows")
    return ids


def coalesce(ids: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique ids (sorted) and the sum of each one's gradient rows, duplicates summed in input order."""
    ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    order, starts, uniq = _coalesce(ids)
    return uniq, _segment_sum(np.ascontiguousarray(grads, dtype=np.float32), order, starts)


def sparse_sgd_(table: np.ndarray, ids: np.ndarray, grads: np.ndarray, lr: float) -> int:
    """In place: ``table[r] -= lr * sum of grads of r`` for every distinct id r. Returns the rows touched."""
    ids = _check(table, ids, grads)
    rows, gsum = coalesce(ids, grads)
    _sgd_apply(table, rows, gsum, np.float32(lr))
    return int(rows.shape[0])


def sparse_rowwise_adagrad_(
    table: np.ndarray, state: np.ndarray, ids: np.ndarray, grads: np.ndarray, lr: float, eps: float
) -> int:
    """In place row-wise Adagrad (FBGEMM's): per touched row r with summed gradient g,
    ``state[r] += mean(g*g)``; ``table[r] -= lr * g / (sqrt(state[r]) + eps)``. Returns the rows touched."""
    ids = _check(table, ids, grads)
    if state.dtype != np.float32 or state.shape != (table.shape[0],):
        raise ValueError(f"state must be float32 [{table.shape[0]}], got {state.dtype} {state.shape}")
    rows, gsum = coalesce(ids, grads)
    _rowwise_adagrad_apply(table, state, rows, gsum, np.float32(lr), np.float32(eps))
    return int(rows.shape[0])
