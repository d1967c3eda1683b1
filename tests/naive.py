"""Slow, obvious numpy twins of every Numba kernel in ``kernels/``; tests assert the two agree.

Each twin is written for clarity, not speed: plain loops or the most direct numpy expression.
Add a twin by appending a section (helpers working in parallel append with ``cat >>``).
"""

from __future__ import annotations

import numpy as np  # noqa: F401


# ---------------------------------------------------------------- kernels/profile.py (popularity profiler)


def profile_lookup_counts(sparse, table_sizes):
    """Accesses per fused row (table offset + row id), one lookup at a time."""
    sparse = np.asarray(sparse)
    if sparse.ndim == 2:
        sparse = sparse[:, :, None]
    offsets = np.concatenate([[0], np.cumsum(table_sizes)]).astype(np.int64)
    counts = np.zeros(int(offsets[-1]), dtype=np.int64)
    for i in range(sparse.shape[0]):
        for t in range(sparse.shape[1]):
            for j in range(sparse.shape[2]):
                counts[offsets[t] + int(sparse[i, t, j])] += 1
    return counts


def profile_sample_max_rank(sparse, table_sizes, rank):
    """For each sample, the largest rank of the fused rows it looks up (-1 if it looks up nothing)."""
    sparse = np.asarray(sparse)
    if sparse.ndim == 2:
        sparse = sparse[:, :, None]
    offsets = np.concatenate([[0], np.cumsum(table_sizes)]).astype(np.int64)
    out = np.full(sparse.shape[0], -1, dtype=np.int64)
    for i in range(sparse.shape[0]):
        for t in range(sparse.shape[1]):
            for j in range(sparse.shape[2]):
                out[i] = max(out[i], int(rank[offsets[t] + int(sparse[i, t, j])]))
    return out


def profile_add_histogram(values, hist):
    """hist[v] += 1 for each value, one at a time."""
    hist = hist.copy()
    for v in values:
        hist[int(v)] += 1
    return hist
