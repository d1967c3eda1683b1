"""Probes: tiny parallel kernels that measure the machine rather than do work.

``parallel_sum`` makes Numba choose its threading layer, so the layer can be checked. ``remap_gather`` is the
dispatcher's memory limit: the same access pattern as its split's lookup pass (every id of a ``[B, C]`` batch
read once, its int32 remap entry looked up at random, prefetched the same way, one int32 slot written per
lookup, chunked over the same threads) with none of the split's work, so the probe's time over a split's is
the share of the limit the split reaches.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from .dispatch import PREFETCH_LOOKUPS, _prefetch, chunk_bounds


@njit(parallel=True, cache=True, nogil=True)
def _parallel_sum(values):
    total = 0.0
    for i in prange(values.shape[0]):
        total += values[i]
    return total


def parallel_sum(values: np.ndarray) -> float:
    """Sum of a float64 vector, computed by a parallel kernel."""
    return float(_parallel_sum(np.ascontiguousarray(values, dtype=np.float64)))


def threading_layer() -> str:
    """The threading layer Numba runs parallel kernels on ('tbb', 'omp' or 'workqueue')."""
    try:
        return numba.threading_layer()
    except ValueError:  # not chosen until the first parallel kernel runs
        parallel_sum(np.ones(4))
        return numba.threading_layer()


@njit(parallel=True, cache=True, nogil=True)
def _remap_gather(ids, col_offset, remap, ahead, chunk_start, out):
    C = ids.shape[1]
    for k in prange(chunk_start.shape[0] - 1):
        b1 = chunk_start[k + 1]
        for b in range(chunk_start[k], b1):
            if b + ahead < b1:
                for c in range(C):
                    _prefetch(remap, col_offset[c] + ids[b + ahead, c])
            for c in range(C):
                out[b * C + c] = remap[col_offset[c] + ids[b, c]]


def remap_gather(ids: np.ndarray, col_offset: np.ndarray, remap: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[b*C + c] = remap[col_offset[c] + ids[b, c]]`` for checked ids ``[B, C]`` (``out`` of the remap's
    dtype, at least B*C long, as the split's ``slots``); returns the written view. Chunked over Numba's
    threads as the dispatcher's split is."""
    if ids.ndim != 2 or ids.shape[1] != col_offset.shape[0]:
        raise ValueError(f"ids must be [B, {col_offset.shape[0]}], got {ids.shape}")
    B, C = ids.shape
    if out.dtype != remap.dtype or out.shape[0] < B * C:
        raise ValueError(f"out must be {remap.dtype} of at least {B * C}, got {out.dtype} [{out.shape[0]}]")
    ahead = max(1, PREFETCH_LOOKUPS // max(C, 1))
    _remap_gather(ids, col_offset, remap, ahead, chunk_bounds(B), out)
    return out[: B * C]
