"""The initial weights of any rows of any tables, drawn on their own: bit-identical to drawing each table whole.

Every mode starts from :func:`hotline.models.dlrm.init_embedding_table`: table ``t`` draws
``uniform(-1/sqrt(n), 1/sqrt(n), size=(n, dim))`` from ``numpy.random.default_rng([seed, 7919, t])``, a PCG64
generator (a 128-bit LCG, ``state = state * MULT + inc``, each step's output the XSL-RR of the new state), one
64-bit step per draw, rows in order; a draw is ``low + (high - low) * ((u64 >> 11) * 2**-53)`` in float64, then
float32. Row ``r``'s draws start ``r * dim`` steps in, reached from the table's starting state by the LCG's jump
ahead (Brown, "Random number generation with arbitrary strides", 1994): the affine maps of ``2**k`` steps are
precomputed per table (:func:`jump_tables`), so a jump takes one map per set bit of the distance. Rows that
follow the row before them in one table go on from where it ended, with no jump. The 128-bit numbers are kept
as two uint64 limbs (hi, lo) and multiplied as LLVM's 128-bit integers. The numpy twin is
:func:`hotline.tiers.initial_fill.initial_block` (``tests/test_initial_rows.py``).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import types
from numba.extending import intrinsic

_MULT = 0x2360ED051FC65DA44385DF649FCCF645
"""PCG64's 128-bit LCG multiplier (numpy's ``PCG_DEFAULT_MULTIPLIER_128``)."""
_M128 = (1 << 128) - 1
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


@intrinsic
def _affine(typingctx, mh, ml, sh, sl, ph, pl):
    """(hi, lo) of ``m * s + p`` mod 2**128, each 128-bit number given as its uint64 limbs (hi, lo): LLVM's
    128-bit integers, one multiplication where the machine has a 64 x 64 -> 128 bit one."""
    if any(x != types.uint64 for x in (mh, ml, sh, sl, ph, pl)):
        return None
    sig = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64, types.uint64, types.uint64, types.uint64,
                                          types.uint64)  # fmt: skip

    def codegen(context, builder, signature, args):
        i128 = ir.IntType(128)
        shift = ir.Constant(i128, 64)

        def wide(hi, lo):
            return builder.or_(builder.shl(builder.zext(hi, i128), shift), builder.zext(lo, i128))

        m, s, p = wide(args[0], args[1]), wide(args[2], args[3]), wide(args[4], args[5])
        r = builder.add(builder.mul(m, s), p)
        i64 = ir.IntType(64)
        out = [builder.trunc(builder.lshr(r, shift), i64), builder.trunc(r, i64)]
        return context.make_tuple(builder, signature.return_type, out)

    return sig, codegen


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
def _draw_rows(ids, world, rank, ends, dim, low, span, start, inc, mult, plus, out, take):
    """Writes the initial weights of fused row ``ids[i] * world + rank`` (tables end at ``ends``, cumulative)
    into ``out[i, :dim]`` and zeros into the rest of ``out[i]``: every ``i``, or those where ``take[i]`` (when
    ``take`` is not empty; the others' ``out[i]`` left as it is)."""
    n, T = ids.shape[0], ends.shape[0]
    mh, ml = mult[0, 0], mult[0, 1]
    scale = 1.0 / 9007199254740992.0
    for b in prange((n + _BLOCK - 1) // _BLOCK):
        sh, sl = np.uint64(0), np.uint64(0)
        t, t_lo, t_hi = -1, 0, 0  # the table of the row before, its fused range
        prev_t, prev_r = -1, -1
        for i in range(b * _BLOCK, min(n, (b + 1) * _BLOCK)):
            if take.shape[0] and not take[i]:
                continue
            f = np.int64(ids[i]) * world + rank
            if f < t_lo or f >= t_hi:  # another table: found by bisection
                a, z = 0, T - 1
                while a < z:
                    m = (a + z) // 2
                    if ends[m] > f:
                        z = m
                    else:
                        a = m + 1
                t, t_hi = a, ends[a]
                t_lo = ends[a - 1] if a > 0 else 0
            r = f - t_lo
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


def draw_fused(ids: np.ndarray, table_rows: np.ndarray, dim: int, jumps: tuple, out: np.ndarray,
               world: int = 1, rank: int = 0, take: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """The initial weights of the fused rows ``ids * world + rank`` (``ids``: any integers, a rank's local ids
    or fused ids) into ``out`` float32 [n, dim + state] (``out[:, dim:]`` zero, a record's zero optimizer state);
    ``table_rows``: every table's rows; ``jumps``: :func:`jump_tables` of the seed; ``take``: bool [n], only the
    rows it marks drawn (the others' ``out`` rows kept). Returns ``out``."""
    ids = np.ascontiguousarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"draw_fused: ids of {ids.dtype}, not integers")
    if out.shape[0] != ids.shape[0] or out.shape[1] < dim:
        raise ValueError(f"draw_rows: {ids.shape[0]} rows, out {out.shape}")
    take = np.zeros(0, np.bool_) if take is None else np.ascontiguousarray(take, np.bool_)
    if take.shape[0] not in (0, ids.shape[0]):
        raise ValueError(f"draw_fused: {ids.shape[0]} rows, take {take.shape[0]}")
    if ids.shape[0]:
        low, span = bounds(table_rows)
        ends = np.cumsum(np.asarray(table_rows, np.int64))
        _draw_rows(ids, int(world), int(rank), ends, int(dim), low, span, *jumps, out, take)
    return out


def draw_rows(tables: np.ndarray, rows: np.ndarray, dim: int, table_rows: np.ndarray, jumps: tuple,
              out: np.ndarray) -> np.ndarray:  # fmt: skip
    """The initial weights of row ``rows[i]`` (within its table) of table ``tables[i]`` (:func:`draw_fused`)."""
    tables, rows, sizes = (
        np.asarray(tables, np.int64),
        np.asarray(rows, np.int64),
        np.asarray(table_rows, np.int64),
    )
    if tables.shape != rows.shape:
        raise ValueError(f"draw_rows: {rows.shape[0]} rows, {tables.shape[0]} tables, out {out.shape}")
    if rows.shape[0] and not ((rows >= 0) & (rows < sizes[tables])).all():
        raise ValueError("draw_rows: a row outside its table")
    return draw_fused(np.cumsum(sizes)[tables] - sizes[tables] + rows, sizes, dim, jumps, out)
