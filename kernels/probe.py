"""A tiny parallel kernel that makes Numba choose its threading layer, so the layer can be checked."""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
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
