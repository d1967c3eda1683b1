"""Kernels of the disk store's held writes (:mod:`hotline.tiers.held_rows`): an open-addressing table from file
positions to the slots of their held records, and those records laid over pages read from the file.

The table is two arrays of a power-of-two length ``2**bits`` (its keys at most :data:`LOAD` of it, so a probe
ends at an empty entry): ``keys`` int64 (a file position, :data:`EMPTY` where none) and ``slots`` int64 (its record's slot).
A key's home entry is its Fibonacci hash (the key times 2**64 / golden ratio, the top ``bits`` bits), probed
linearly. Keys are only added; the table is emptied whole (:mod:`~hotline.tiers.held_rows`'s sweep). The numpy
twin :func:`overlay_twin` (and a dict, for :func:`insert`) is what ``tests/test_held_rows.py`` checks these against.
"""

from __future__ import annotations

import numpy as np
from numba import njit

EMPTY = -1
"""A table entry that holds no key."""

PAGE = 4096

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True, inline="always")
def _home(key, shift):
    return np.int64((np.uint64(key) * _GOLDEN) >> np.uint64(shift))


@njit(cache=True, nogil=True, inline="always")
def _shift(size):
    """64 less log2 of the table's (power-of-two) ``size``: a hash's top bits index it."""
    bits = 0
    while size > 1:
        size >>= 1
        bits += 1
    return 64 - bits


@njit(cache=True, nogil=True, inline="always")
def _probe(keys, key, shift, mask):
    """The entry that holds ``key``, or the empty entry where it would go."""
    j = _home(key, shift)
    while keys[j] != key and keys[j] != EMPTY:
        j = (j + 1) & mask
    return j


@njit(cache=True, nogil=True)
def insert(keys, slots, pos, count):
    """The slots of ``pos`` (distinct file positions), each new one given slot ``count``, ``count + 1``, ...;
    returns them and the new count. The caller leaves room: ``count + len(pos)`` keys at most :data:`LOAD` of
    the table."""
    mask = keys.shape[0] - 1
    shift = _shift(keys.shape[0])
    out = np.empty(pos.shape[0], np.int64)
    for i in range(pos.shape[0]):
        j = _probe(keys, pos[i], shift, mask)
        if keys[j] == EMPTY:
            keys[j] = pos[i]
            slots[j] = count
            count += 1
        out[i] = slots[j]
    return out, count


@njit(cache=True, nogil=True)
def overlay(pages, at, buffer, record, num_rows, keys, slots, records, marked):
    """Lays the held records over ``pages`` (file page numbers) read into ``buffer`` (uint8, page ``pages[i]`` at
    byte ``at[i] * 4096``): the bytes of every held record that touch a page, straddling ones clipped to it.
    ``records``: uint8 [slots, record]; ``marked``: uint8, bit ``q % 8`` of byte ``q // 8`` set for a position
    ``q`` that may be held (the table is probed for those only: a page holds up to 4096 / ``record`` positions,
    most of them not held). Returns the records laid (a straddling one counted per page)."""
    mask = keys.shape[0] - 1
    shift = _shift(keys.shape[0])
    laid = 0
    for i in range(pages.shape[0]):
        p = pages[i]
        lo = p * PAGE
        hi = lo + PAGE
        base = at[i] * PAGE - lo
        q = lo // record
        last = min((hi - 1) // record, num_rows - 1)
        while q <= last:
            if q & 7 == 0 and q + 8 <= last + 1 and marked[q >> 3] == 0:
                q += 8  # a byte of positions none held
                continue
            if (marked[q >> 3] >> (q & 7)) & 1:
                j = _probe(keys, q, shift, mask)
                if keys[j] != EMPTY:
                    s = slots[j]
                    a = q * record
                    for t in range(max(a, lo), min(a + record, hi)):
                        buffer[base + t] = records[s, t - a]
                    laid += 1
            q += 1
    return laid


LOAD = 0.75
"""The most keys a table holds, as a share of its entries (linear probing stays short below it)."""


def sized(budget: int, record: int) -> tuple[int, int]:
    """The table's entries (a power of two) and the slots (records of ``record`` bytes) that give the most slots
    in ``budget`` bytes (16 bytes an entry, ``record`` a slot, at most :data:`LOAD` of the entries); (0, 0) where
    the budget holds no slot."""
    best = (0, 0)
    size = 16
    while 16 * size < budget:
        cap = min(int(LOAD * size), (budget - 16 * size) // record)
        if cap > best[1]:
            best = (size, cap)
        size *= 2
    return best


def new_table(size: int, full=np.full) -> tuple[np.ndarray, np.ndarray]:
    """Empty ``keys`` and ``slots`` of ``size`` entries (a power of two), made by ``full(shape, value, dtype)``
    (the store passes :func:`hotline._malloc.huge_full`: huge pages, every entry taken now)."""
    return full(size, EMPTY, np.int64), full(size, 0, np.int64)


# -- numpy twins -----------------------------------------------------------------------------------------
def overlay_twin(pages, at, buffer, record, num_rows, held: dict, records) -> None:
    """:func:`overlay` with a dict of position -> slot, record by record through whole-file byte offsets."""
    for i, p in enumerate(np.asarray(pages).tolist()):
        lo, hi = p * PAGE, p * PAGE + PAGE
        for q, s in held.items():
            a, b = q * record, q * record + record
            if q < num_rows and a < hi and b > lo:
                x, y = max(a, lo), min(b, hi)
                buffer[at[i] * PAGE + x - lo : at[i] * PAGE + y - lo] = records[s, x - a : y - a]
