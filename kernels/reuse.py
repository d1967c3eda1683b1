"""LRU stack distances (reuse distances) of access traces, Mattson style, with a Fenwick tree.

The stack distance of an access is the number of *distinct other* ids touched since the previous access to
the same id (-1 for a first access). An LRU cache of ``C`` rows hits exactly the accesses whose distance is
``< C`` (Mattson et al., 1970), so one pass over a trace gives the miss ratio of every cache size at once.

The kernel keeps, for each position of the trace, a 1 in a Fenwick (binary indexed) tree when that position
is the latest access of its id. The distance of an access at ``i`` whose id was last seen at ``j`` is the
number of ones strictly between ``j`` and ``i``: two prefix sums. Then ``j`` is cleared and ``i`` set.
O(n log n) per trace; the traces of different tables are independent and run on parallel threads.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, nogil=True)
def _fenwick_add(tree, pos, value):
    """Adds ``value`` at 1-based ``pos`` of the Fenwick tree ``tree`` [n + 1]."""
    n = tree.shape[0] - 1
    while pos <= n:
        tree[pos] += value
        pos += pos & (-pos)


@njit(cache=True, nogil=True)
def _fenwick_prefix(tree, pos):
    """Sum of the 1-based positions ``1..pos`` of the Fenwick tree."""
    s = 0
    while pos > 0:
        s += tree[pos]
        pos -= pos & (-pos)
    return s


@njit(cache=True, parallel=True, nogil=True)
def _stack_distances(traces, num_distinct, out):
    """For each row t of ``traces`` [T, n] (ids compacted to ``0 <= id < num_distinct[t]``) writes the stack
    distance of every access into ``out`` [T, n] (-1 for a first access)."""
    T, n = traces.shape
    for t in prange(T):
        tree = np.zeros(n + 1, dtype=np.int64)  # position p of the trace is tree index p + 1
        last = np.full(num_distinct[t], -1, dtype=np.int64)
        for i in range(n):
            x = traces[t, i]
            j = last[x]
            if j < 0:
                out[t, i] = -1
            else:
                # latest-access marks at trace positions j+1 .. i-1
                out[t, i] = _fenwick_prefix(tree, i) - _fenwick_prefix(tree, j + 1)
                _fenwick_add(tree, j + 1, -1)
            _fenwick_add(tree, i + 1, 1)
            last[x] = i


def stack_distances(traces: np.ndarray) -> np.ndarray:
    """LRU stack distances of one trace ``[n]`` or of independent traces ``[T, n]`` of integer ids.

    Returns int64 of the same shape: per access, the number of distinct other ids accessed since the previous
    access to the same id, or -1 for the first access of an id. Ids may be any integers (they are compacted
    per trace first, so huge id ranges cost no memory).
    """
    a = np.asarray(traces)
    if a.ndim not in (1, 2):
        raise ValueError(f"traces must be [n] or [T, n], got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"traces must hold integer ids, got dtype {a.dtype}")
    two_d = a.reshape(1, -1) if a.ndim == 1 else a
    T, n = two_d.shape
    compact = np.empty((T, n), dtype=np.int64)
    num_distinct = np.zeros(T, dtype=np.int64)
    for t in range(T):
        uniq, inverse = np.unique(two_d[t], return_inverse=True)
        compact[t] = inverse.reshape(-1)
        num_distinct[t] = uniq.shape[0]
    out = np.empty((T, n), dtype=np.int64)
    if n:
        _stack_distances(compact, num_distinct, out)
    return out.reshape(a.shape)


def lru_hit_counts(distances: np.ndarray) -> np.ndarray:
    """int64 [D + 1]: ``hits[C]`` = accesses an LRU cache of ``C`` rows hits (distance < C), for C = 0..D
    where D is one more than the largest distance (so ``hits[-1]`` is every re-reference)."""
    d = np.asarray(distances).reshape(-1)
    d = d[d >= 0]
    if d.size == 0:
        return np.zeros(1, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(np.bincount(d))]).astype(np.int64)
