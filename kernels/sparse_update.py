"""Sparse row updates: sum the gradients of duplicate ids, then update each touched row exactly once.

``torch.Tensor.index_add_`` manages about 2.5 M rows/s on this CPU and applies duplicates one at a time;
row-wise Adagrad needs the *summed* gradient of a row before its state is updated, so duplicates have to
be coalesced first anyway. Coalescing uses a scratch array over the table's rows (-1 between calls) instead
of a sort: one sequential pass numbers the distinct ids in first-occurrence order, then the threads sum the
gradients of disjoint ranges of those numbers (each in input order, so the result is deterministic), and
the touched rows are updated in parallel.
"""

from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange


@njit(cache=True, nogil=True)
def _first_occurrence(ids, scratch, uniq, inverse):
    """Numbers the distinct ids in order of first occurrence: ``uniq[:u]`` and ``inverse`` (id -> number)."""
    u = 0
    for j in range(ids.shape[0]):
        r = ids[j]
        k = scratch[r]
        if k < 0:
            k = u
            scratch[r] = u
            uniq[u] = r
            u += 1
        inverse[j] = k
    for k in range(u):  # leave the scratch clean for the next call
        scratch[uniq[k]] = -1
    return u


@njit(cache=True, parallel=True, nogil=True)
def _sum_by_inverse(grads, inverse, u, n_threads, out):
    """``out[k] = sum of grads[j] with inverse[j] == k`` in input order; thread c owns a range of k."""
    D = grads.shape[1]
    for c in prange(n_threads):
        lo = u * c // n_threads
        hi = u * (c + 1) // n_threads
        for k in range(lo, hi):
            for d in range(D):
                out[k, d] = 0.0
        for j in range(inverse.shape[0]):
            k = inverse[j]
            if k >= lo and k < hi:
                for d in range(D):
                    out[k, d] += grads[j, d]


@njit(cache=True, parallel=True, nogil=True)
def _sgd_apply(table, rows, gsum, lr):
    for s in prange(rows.shape[0]):
        r = rows[s]
        for d in range(table.shape[1]):
            table[r, d] -= lr * gsum[s, d]


@njit(cache=True, parallel=True, nogil=True)
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


def new_scratch(rows: int) -> np.ndarray:
    """The scratch array the update functions need for a table of ``rows`` rows (reuse it across calls)."""
    return np.full(rows, -1, dtype=np.int32)


def distinct(ids: np.ndarray, scratch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ids in first-occurrence order and ``inverse`` (each id's index into them)."""
    ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    uniq = np.empty(ids.shape[0], np.int64)
    inverse = np.empty(ids.shape[0], np.int64)
    u = _first_occurrence(ids, scratch, uniq, inverse)
    return uniq[:u], inverse


def coalesce(
    ids: np.ndarray, grads: np.ndarray, scratch: np.ndarray | None = None, rows: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ids (first-occurrence order) and the sum of each one's gradient rows, in input order."""
    ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    if scratch is None:
        scratch = new_scratch(rows if rows is not None else (int(ids.max()) + 1 if ids.size else 0))
    elif scratch.dtype != np.int32 or (rows is not None and scratch.shape[0] < rows):
        raise ValueError(
            f"scratch must be int32 with at least {rows} entries, got {scratch.dtype} {scratch.shape}"
        )
    uniq = np.empty(ids.shape[0], np.int64)
    inverse = np.empty(ids.shape[0], np.int64)
    u = _first_occurrence(ids, scratch, uniq, inverse)
    gsum = np.empty((u, grads.shape[1]), np.float32)
    _sum_by_inverse(np.ascontiguousarray(grads, dtype=np.float32), inverse, u, get_num_threads(), gsum)
    return uniq[:u], gsum


def sparse_sgd_(
    table: np.ndarray, ids: np.ndarray, grads: np.ndarray, lr: float, scratch: np.ndarray | None = None
) -> int:
    """In place: ``table[r] -= lr * sum of grads of r`` for every distinct id r. Returns the rows touched.

    ``scratch`` (from :func:`new_scratch`, one per table) saves allocating it on every call."""
    ids = _check(table, ids, grads)
    rows, gsum = coalesce(ids, grads, scratch, table.shape[0])
    _sgd_apply(table, rows, gsum, np.float32(lr))
    return int(rows.shape[0])


def sparse_rowwise_adagrad_(
    table: np.ndarray,
    state: np.ndarray,
    ids: np.ndarray,
    grads: np.ndarray,
    lr: float,
    eps: float,
    scratch: np.ndarray | None = None,
) -> int:
    """In place row-wise Adagrad (FBGEMM's): per touched row r with summed gradient g,
    ``state[r] += mean(g*g)``; ``table[r] -= lr * g / (sqrt(state[r]) + eps)``. Returns the rows touched."""
    ids = _check(table, ids, grads)
    if state.dtype != np.float32 or state.shape != (table.shape[0],):
        raise ValueError(f"state must be float32 [{table.shape[0]}], got {state.dtype} {state.shape}")
    rows, gsum = coalesce(ids, grads, scratch, table.shape[0])
    _rowwise_adagrad_apply(table, state, rows, gsum, np.float32(lr), np.float32(eps))
    return int(rows.shape[0])


# -- per-element Adagrad and Adam (FBGEMM's EmbOptimType.ADAGRAD and ADAM) --------------------------------
# Their state is a [rows, S] float32 array: Adagrad S = D (one accumulator per element), Adam S = 2 D + 1 (the
# first moments, the second moments, then the row's step counter).


@njit(cache=True, parallel=True, nogil=True)
def _adagrad_apply(table, state, rows, gsum, lr, eps):
    """FBGEMM's ADAGRAD: per element, ``state += g^2``; ``w -= lr * g / (sqrt(state) + eps)``."""
    D = table.shape[1]
    for s in prange(rows.shape[0]):
        r = rows[s]
        for d in range(D):
            g = gsum[s, d]
            state[r, d] += g * g
            table[r, d] -= lr * g / (np.sqrt(state[r, d]) + eps)


@njit(cache=True, parallel=True, nogil=True)
def _adam_apply(table, state, rows, gsum, lr, beta1, beta2, eps, iteration, weight_decay):
    """FBGEMM's ADAM: the row's counter += 1, then per element ``m = b1 m + (1 - b1) g``,
    ``v = b2 v + (1 - b2) g^2``, ``w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``, where the bias
    correction's t is the row's counter (row-wise bias correction, ``iteration`` 0) or ``iteration`` for every
    row (FBGEMM's default: its module's iteration); ``weight_decay`` adds FBGEMM's L2 term inside the step,
    ``w -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * w)``."""
    D = table.shape[1]
    one = np.float32(1.0)
    for s in prange(rows.shape[0]):
        r = rows[s]
        t = state[r, 2 * D] + one
        state[r, 2 * D] = t
        if iteration > 0:
            t = iteration
        c1 = one - beta1**t
        c2 = one - beta2**t
        for d in range(D):
            g = gsum[s, d]
            m = beta1 * state[r, d] + (one - beta1) * g
            v = beta2 * state[r, D + d] + (one - beta2) * g * g
            state[r, d] = m
            state[r, D + d] = v
            if weight_decay != 0:
                table[r, d] -= lr * ((m / c1) / (np.sqrt(v / c2) + eps) + weight_decay * table[r, d])
            else:
                table[r, d] -= lr * (m / c1) / (np.sqrt(v / c2) + eps)


def _check_state(table: np.ndarray, state: np.ndarray, width: int) -> None:
    if state.dtype != np.float32 or state.shape != (table.shape[0], width) or not state.flags.c_contiguous:
        raise ValueError(
            f"state must be a C-contiguous float32 [{table.shape[0]}, {width}] array, got {state.dtype} {state.shape}"
        )


def sparse_adagrad_(
    table: np.ndarray,
    state: np.ndarray,
    ids: np.ndarray,
    grads: np.ndarray,
    lr: float,
    eps: float,
    scratch: np.ndarray | None = None,
) -> int:
    """In place per-element Adagrad (FBGEMM's ADAGRAD): per touched row r with summed gradient g,
    ``state[r] += g*g``; ``table[r] -= lr * g / (sqrt(state[r]) + eps)``. ``state`` [rows, D]. Returns the
    rows touched."""
    ids = _check(table, ids, grads)
    _check_state(table, state, table.shape[1])
    rows, gsum = coalesce(ids, grads, scratch, table.shape[0])
    _adagrad_apply(table, state, rows, gsum, np.float32(lr), np.float32(eps))
    return int(rows.shape[0])


def sparse_adam_(
    table: np.ndarray,
    state: np.ndarray,
    ids: np.ndarray,
    grads: np.ndarray,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    scratch: np.ndarray | None = None,
    iteration: int = 0,
    weight_decay: float = 0.0,
) -> int:
    """In place Adam (FBGEMM's ADAM) of every touched row: ``state`` [rows, 2 D + 1] holds the first moments,
    the second moments and the row's step count (see ``_adam_apply``). ``iteration``: 0 corrects the bias by
    each row's step count (row-wise), n > 0 by step n for every row (FBGEMM's module iteration);
    ``weight_decay``: FBGEMM's L2 term. Returns the rows touched."""
    ids = _check(table, ids, grads)
    _check_state(table, state, 2 * table.shape[1] + 1)
    if iteration < 0:
        raise ValueError(f"iteration must be >= 0 (0: each row's own step count), got {iteration}")
    rows, gsum = coalesce(ids, grads, scratch, table.shape[0])
    _adam_apply(table, state, rows, gsum, np.float32(lr), np.float32(beta1), np.float32(beta2), np.float32(eps),
                np.float32(iteration), np.float32(weight_decay))  # fmt: skip
    return int(rows.shape[0])


@njit(cache=True, parallel=True, nogil=True)
def _accumulate_rows(grads, pos, inverse, u, n_threads, out):
    """``out[inverse[j]] += grads[pos[j]]`` in input order (thread c owns a range of output rows)."""
    D = grads.shape[1]
    for c in prange(n_threads):
        lo = u * c // n_threads
        hi = u * (c + 1) // n_threads
        for j in range(inverse.shape[0]):
            k = inverse[j]
            if k >= lo and k < hi:
                r = pos[j]
                for d in range(D):
                    out[k, d] += grads[r, d]


def sparse_update_parts_(
    kind: str,
    table: np.ndarray,
    state: np.ndarray,
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]],
    lr: float,
    eps: float,
    scratch: np.ndarray,
    beta1: float = 0.9,
    beta2: float = 0.999,
    iteration: int = 0,
    weight_decay: float = 0.0,
) -> int:
    """One sparse update (``kind`` ``sgd``, ``rowwise-adagrad``, ``adagrad`` or ``adam``; ``beta1``/``beta2``/
    ``iteration``/``weight_decay``: Adam's, see :func:`sparse_adam_`) from gradients spread over several matrices.

    Each part is ``(ids, grads, pos)``: lookup j of the part updates row ``ids[j]`` with ``grads[pos[j]]``
    (``pos=None``: ``grads[j]``). Duplicates across all parts are summed in part order, then input order,
    exactly as the concatenated ``(ids, grads)`` would be, without building that concatenation. Returns the
    rows touched."""
    all_ids = (
        np.concatenate([np.asarray(i, dtype=np.int64).reshape(-1) for i, _, _ in parts])
        if parts
        else (np.zeros(0, np.int64))
    )
    if all_ids.size and (all_ids.min() < 0 or all_ids.max() >= table.shape[0]):
        bad = all_ids[(all_ids < 0) | (all_ids >= table.shape[0])][0]
        raise IndexError(f"row id {bad} out of range for a table of {table.shape[0]} rows")
    if scratch.dtype != np.int32 or scratch.shape[0] < table.shape[0]:
        raise ValueError(f"scratch must be int32 with at least {table.shape[0]} entries")
    uniq = np.empty(all_ids.shape[0], np.int64)
    inverse = np.empty(all_ids.shape[0], np.int64)
    u = _first_occurrence(all_ids, scratch, uniq, inverse)
    gsum = np.zeros((u, table.shape[1]), np.float32)
    start = 0
    for ids, grads, pos in parts:
        n = np.asarray(ids).reshape(-1).shape[0]
        if grads.dtype != np.float32 or grads.ndim != 2 or grads.shape[1] != table.shape[1]:
            raise ValueError(f"grads must be float32 [*, {table.shape[1]}], got {grads.dtype} {grads.shape}")
        pos = np.arange(n, dtype=np.int64) if pos is None else np.ascontiguousarray(pos, dtype=np.int64)
        if pos.shape[0] != n or (n and (pos.min() < 0 or pos.max() >= grads.shape[0])):
            raise ValueError(f"pos must give a row of grads [{grads.shape[0]}] for each of the {n} ids")
        _accumulate_rows(
            np.ascontiguousarray(grads), pos, inverse[start : start + n], u, get_num_threads(), gsum
        )
        start += n
    rows = uniq[:u]
    if kind == "sgd":
        _sgd_apply(table, rows, gsum, np.float32(lr))
    elif kind == "adagrad":
        _check_state(table, state, table.shape[1])
        _adagrad_apply(table, state, rows, gsum, np.float32(lr), np.float32(eps))
    elif kind == "adam":
        _check_state(table, state, 2 * table.shape[1] + 1)
        _adam_apply(table, state, rows, gsum, np.float32(lr), np.float32(beta1), np.float32(beta2),
                    np.float32(eps), np.float32(iteration), np.float32(weight_decay))  # fmt: skip
    else:
        _rowwise_adagrad_apply(table, state, rows, gsum, np.float32(lr), np.float32(eps))
    return int(u)
