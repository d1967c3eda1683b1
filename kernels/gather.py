"""Row gather and scatter between a host table and a staging buffer, on parallel threads.

These move a step's working set: ``gather_rows`` copies the needed cold rows (and their optimizer state)
out of the host table into a preallocated staging buffer; ``scatter_rows`` writes the updated rows back.
Rows are split into contiguous blocks, one per thread, each row a contiguous memcpy-like inner loop.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def _gather_rows(table, rows, out):
    D = table.shape[1]
    for i in prange(rows.shape[0]):
        r = rows[i]
        for d in range(D):
            out[i, d] = table[r, d]


@njit(cache=True, parallel=True)
def _scatter_rows(table, rows, src):
    D = table.shape[1]
    for i in prange(rows.shape[0]):
        r = rows[i]
        for d in range(D):
            table[r, d] = src[i, d]


@njit(cache=True, parallel=True)
def _gather_values(values, rows, out):
    for i in prange(rows.shape[0]):
        out[i] = values[rows[i]]


@njit(cache=True, parallel=True)
def _scatter_values(values, rows, src):
    for i in prange(rows.shape[0]):
        values[rows[i]] = src[i]


def gather_rows(table: np.ndarray, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[:n] = table[rows]`` for 2-D tables or 1-D state arrays; returns the filled view ``out[:n]``."""
    n = rows.shape[0]
    if out.shape[0] < n or out.shape[1:] != table.shape[1:]:
        raise ValueError(f"staging buffer {out.shape} too small for {n} rows of shape {table.shape[1:]}")
    if table.ndim == 2:
        _gather_rows(table, rows, out)
    else:
        _gather_values(table, rows, out)
    return out[:n]


def scatter_rows(table: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
    """``table[rows] = src`` (rows must be unique, as a working set is)."""
    if src.shape[0] != rows.shape[0] or src.shape[1:] != table.shape[1:]:
        raise ValueError(
            f"{src.shape[0]} source rows of shape {src.shape[1:]} for {rows.shape[0]} table rows"
        )
    if table.ndim == 2:
        _scatter_rows(table, rows, src)
    else:
        _scatter_values(table, rows, src)
