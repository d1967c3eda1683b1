"""The initial weights of any rows of any tables, drawn on their own: bit-identical to drawing each table whole.

Every mode starts from :func:`hotline.models.dlrm.init_embedding_table`: table ``t`` draws
``uniform(-1/sqrt(n), 1/sqrt(n), size=(n, dim))`` from ``numpy.random.default_rng([seed, 7919, t])``, a PCG64
generator (a 128-bit LCG, ``state = state * MULT + inc``, each step's output the XSL-RR of the new state), one
64-bit step per draw, rows in order; a draw is ``low + (high - low) * ((u64 >> 11) * 2**-53)`` in float64, then
float32. Row ``r``'s draws start ``r * dim`` steps in, reached from the table's starting state by the LCG's jump
ahead (Brown, "Random number generation with arbitrary strides", 1994): the affine maps of ``2**k`` steps are
precomputed per table (:func:`jump_tables`), so a jump takes one map per set bit of the distance. Rows that
follow the row before them in one table go on from where it ended, with no jump. The 128-bit arithmetic runs in
two uint64 limbs (hi, lo). The numpy twin is :func:`hotline.tiers.initial_fill.initial_block`
(``tests/test_initial_rows.py``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

_MULT = 0x2360ED051FC65DA44385DF649FCCF645
"""PCG64's 128-bit LCG multiplier (numpy's ``PCG_DEFAULT_MULTIPLIER_128``)."""
_M128 = (1 << 128) - 1
_M32 = np.uint64(0xFFFFFFFF)
_BLOCK = 4096
"""Rows one thread draws in order (a jump at most per row, none where rows follow each other)."""


def _limbs(x: int) -> tuple[int, int]:
    return (x >> 64) & (2**64 - 1), x & (2**64 - 1)


def jump_tables(seed: int, num_tables: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The generators of tables ``0 .. num_tables - 1`` (those of :func:`~hotline.models.dlrm.
    init_embedding_table`): uint64 ``start`` [T, 2] (hi, lo: the state before the first draw), ``inc`` [T, 2],
    ``mult`` [64, 2] (MULT ** 2**k) and ``plus`` [T, 64, 2] (the increment of 2**k steps of table t)."""
    start = np.zeros((num_tables, 2), np.uint64)
    inc = np.zeros((num_tables, 2), np.uint64)
    mult = np.zeros((64, 2), np.uint64)
    plus = np.zeros((num_tables, 64, 2), np.uint64)
    m = _MULT
    for k in range(64):
        mult[k] = _limbs(m)
        m = m * m & _M128
    for t in range(num_tables):
        state = np.random.default_rng([seed, 7919, t]).bit_generator.state["state"]
        start[t], inc[t] = _limbs(int(state["state"])), _limbs(int(state["inc"]))
        m, p = _MULT, int(state["inc"])
        for k in range(64):
            plus[t, k] = _limbs(p)
            p = (m + 1) * p & _M128
            m = m * m & _M128
    return start, inc, mult, plus


def bounds(table_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``low`` and ``high - low`` [T] of each table's uniform draws, computed as numpy's ``uniform``
    computes them."""
    low = np.empty(len(table_rows), np.float64)
    span = np.empty(len(table_rows), np.float64)
    for t, n in enumerate(table_rows):
        b = 1.0 / math.sqrt(int(n))
        low[t], span[t] = -b, b - (-b)
    return low, span


@njit(cache=True, nogil=True, inline="always")
def _mul64(a, b):
    """(hi, lo) of the 128-bit product of uint64 ``a`` and ``b``."""
    a0, a1 = a & _M32, a >> np.uint64(32)
    b0, b1 = b & _M32, b >> np.uint64(32)
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> np.uint64(32)) + (p01 & _M32) + (p10 & _M32)
    lo = (p00 & _M32) | (mid << np.uint64(32))
    hi = p11 + (p01 >> np.uint64(32)) + (p10 >> np.uint64(32)) + (mid >> np.uint64(32))
    return hi, lo


@njit(cache=True, nogil=True, inline="always")
def _affine(mh, ml, sh, sl, ph, pl):
    """(hi, lo) of ``m * s + p`` mod 2**128."""
    hi, lo = _mul64(ml, sl)
    hi = hi + ml * sh + mh * sl
    lo2 = lo + pl
    carry = np.uint64(1) if lo2 < lo else np.uint64(0)
    return hi + ph + carry, lo2


@njit(cache=True, nogil=True, inline="always")
def _jump(t, sh, sl, delta, mult, plus):
    """The state ``delta`` steps after (sh, sl) in table ``t``'s generator."""
    k = 0
    while delta:
        if delta & 1:
            sh, sl = _affine(mult[k, 0], mult[k, 1], sh, sl, plus[t, k, 0], plus[t, k, 1])
        delta >>= 1
        k += 1
    return sh, sl


@njit(cache=True, nogil=True, parallel=True)
def _draw_rows(tables, rows, dim, low, span, start, inc, mult, plus, out):
    """Writes the initial weights of row ``rows[i]`` of table ``tables[i]`` into ``out[i, :dim]`` and zeros
    into the rest of ``out[i]``."""
    n = rows.shape[0]
    mh, ml = mult[0, 0], mult[0, 1]
    scale = 1.0 / 9007199254740992.0
    for b in prange((n + _BLOCK - 1) // _BLOCK):
        sh, sl = np.uint64(0), np.uint64(0)
        prev_t, prev_r = -1, -1
        for i in range(b * _BLOCK, min(n, (b + 1) * _BLOCK)):
            t, r = tables[i], rows[i]
            if t == prev_t and r > prev_r:  # on from the end of the row before
                sh, sl = _jump(t, sh, sl, (r - prev_r - 1) * dim, mult, plus)
            else:
                sh, sl = _jump(t, start[t, 0], start[t, 1], r * dim, mult, plus)
            ih, il = inc[t, 0], inc[t, 1]
            lo_t, span_t = low[t], span[t]
            for j in range(dim):
                sh, sl = _affine(mh, ml, sh, sl, ih, il)
                x = sh ^ sl
                rot = sh >> np.uint64(58)
                u = (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))
                out[i, j] = np.float32(lo_t + span_t * (np.float64(u >> np.uint64(11)) * scale))
            for j in range(dim, out.shape[1]):
                out[i, j] = np.float32(0.0)
            prev_t, prev_r = t, r


def draw_rows(tables: np.ndarray, rows: np.ndarray, dim: int, table_rows: np.ndarray, jumps: tuple,
              out: np.ndarray) -> np.ndarray:  # fmt: skip
    """The initial weights of row ``rows[i]`` (within its table) of table ``tables[i]`` into ``out`` float32
    [n, dim + state] (``out[:, dim:]`` zero, a record's zero optimizer state); ``table_rows``: every table's rows;
    ``jumps``: :func:`jump_tables` of the seed. Returns ``out``."""
    tables = np.ascontiguousarray(tables, np.int64)
    rows = np.ascontiguousarray(rows, np.int64)
    if out.shape[0] != rows.shape[0] or tables.shape != rows.shape or out.shape[1] < dim:
        raise ValueError(f"draw_rows: {rows.shape[0]} rows, {tables.shape[0]} tables, out {out.shape}")
    if rows.shape[0]:
        low, span = bounds(table_rows)
        _draw_rows(tables, rows, int(dim), low, span, *jumps, out)
    return out
