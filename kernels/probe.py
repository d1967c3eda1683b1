"""Probes: tiny parallel kernels that measure the machine rather than do work.

``parallel_sum`` makes Numba choose its threading layer, so the layer can be checked. ``remap_gather`` is the
dispatcher's memory limit: the same access pattern as its split's lookup pass (every id of a ``[B, C]`` batch
read once, its int32 remap entry looked up at random, prefetched the same way, one int32 slot written per
lookup, chunked over the same threads) with none of the split's work, so the probe's time over a split's is
the share of the limit the split reaches. ``rank_gather`` makes the same lookups through a compact hot-row
index instead of the remap (:func:`hot_rank_index`: a bitmap of hot rows with the hot rows before each 64-bit
word, and a rank -> slot array): the alternative the split would take if the remap's random reads, not its
work, were what it waits on; the benchmark prints both probes side by side.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .dispatch import PREFETCH_LOOKUPS, _prefetch, chunk_bounds


@intrinsic
def _popcount(typingctx, word):
    """Set bits of a uint64 (LLVM's ctpop: one instruction where the CPU has it)."""
    sig = types.uint64(types.uint64)

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.ctpop", [ir.IntType(64)])
        return builder.call(fn, [args[0]])

    return sig, codegen


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
    ahead, chunk_start = _checked(ids, col_offset, out, remap.dtype)
    _remap_gather(ids, col_offset, remap, ahead, chunk_start, out)
    return out[: ids.size]


def _checked(ids: np.ndarray, col_offset: np.ndarray, out: np.ndarray, dtype) -> tuple[int, np.ndarray]:
    """A probe's prefetch distance (in samples) and chunks, after checking its ids ``[B, C]`` and ``out``."""
    if ids.ndim != 2 or ids.shape[1] != col_offset.shape[0]:
        raise ValueError(f"ids must be [B, {col_offset.shape[0]}], got {ids.shape}")
    B, C = ids.shape
    if out.dtype != dtype or out.shape[0] < B * C:
        raise ValueError(
            f"out must be {np.dtype(dtype)} of at least {B * C}, got {out.dtype} [{out.shape[0]}]"
        )
    return max(1, PREFETCH_LOOKUPS // max(C, 1)), chunk_bounds(B)


def hot_rank_index(remap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A compact index of a remap (row -> hot slot, or -1): ``(words, rank_to_slot)``.

    ``words`` is uint64 [2 * ceil(rows / 64)], interleaved so one cache line holds both halves of a lookup:
    ``words[2w]`` has bit i set when row ``64w + i`` is hot, ``words[2w + 1]`` counts the hot rows before row
    ``64w``. ``rank_to_slot`` (int32 [hot rows]) is the slot of the hot rows in row order, so the slot of hot
    row r is ``rank_to_slot[words[2w + 1] + popcount(words[2w] & (2**i - 1))]`` (w, i = divmod(r, 64))."""
    remap = np.asarray(remap)
    if remap.ndim != 1:
        raise ValueError(f"remap must be 1-D, got shape {remap.shape}")
    n_words = (remap.shape[0] + 63) // 64
    hot = np.zeros(n_words * 64, np.bool_)
    hot[: remap.shape[0]] = remap >= 0
    bits = np.packbits(hot, bitorder="little").view(np.uint64)
    before = np.zeros(n_words, np.uint64)
    np.cumsum(hot.reshape(n_words, 64).sum(axis=1)[:-1], out=before[1:])
    words = np.empty(2 * n_words, np.uint64)
    words[0::2] = bits
    words[1::2] = before
    return words, remap[remap >= 0].astype(np.int32)


@njit(parallel=True, cache=True, nogil=True)
def _rank_gather(ids, col_offset, words, rank_to_slot, ahead, chunk_start, out):
    C = ids.shape[1]
    one = np.uint64(1)
    for k in prange(chunk_start.shape[0] - 1):
        b1 = chunk_start[k + 1]
        for b in range(chunk_start[k], b1):
            if b + ahead < b1:
                for c in range(C):
                    _prefetch(words, 2 * ((col_offset[c] + ids[b + ahead, c]) >> 6))
            for c in range(C):
                row = col_offset[c] + ids[b, c]
                w = 2 * (row >> 6)
                bit = np.uint64(row & 63)
                word = words[w]
                slot = -1
                if (word >> bit) & one:
                    slot = rank_to_slot[words[w + 1] + _popcount(word & ((one << bit) - one))]
                out[b * C + c] = slot


def rank_gather(
    ids: np.ndarray, col_offset: np.ndarray, index: tuple[np.ndarray, np.ndarray], out: np.ndarray
) -> np.ndarray:
    """:func:`remap_gather` through ``index`` = :func:`hot_rank_index` of the remap (the same values; int32
    ``out`` of at least B*C); returns the written view."""
    ahead, chunk_start = _checked(ids, col_offset, out, np.int32)
    _rank_gather(ids, col_offset, index[0], index[1], ahead, chunk_start, out)
    return out[: ids.size]
