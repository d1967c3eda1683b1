"""The look-ahead's claim book as an open-addressing hash table of the rows in flight.

The claim rule (:class:`hotline.tiers.cold_store.ClaimBook`) needs, for each row a step fetches ahead, the last
step whose working set held it and the row's slot there, but only while that step's update has not landed:
a row last held by a landed step reads the same as a row never held. So the book keeps only the rows of the
live steps' working sets, not an entry per row of the table: a table of ``keys`` (int64 row ids, -1 empty)
and ``vals`` (int64: the holder step in the high 32 bits, the row's slot in the low 32), linear probing over a
power-of-two capacity. Entries of landed steps stay until the table is rebuilt (:func:`rebuild`, when half
full), which keeps only the live ones: the table's size follows the rows in flight.
"""

from __future__ import annotations

import numpy as np
from numba import njit

UNKNOWN_SLOT = (1 << 32) - 1
"""The low half of an entry whose row's slot in its holder's working set is not known."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True, inline="always")
def _home(row, shift):
    """The row's first probe (Fibonacci hashing: the top bits of row * 2**64 / phi)."""
    return np.int64((np.uint64(row) * _GOLDEN) >> np.uint64(shift))


@njit(cache=True, nogil=True)
def _find(keys, row, shift):
    """The index of ``row`` in ``keys``, or of the empty entry where it would go."""
    mask = keys.shape[0] - 1
    i = _home(row, shift)
    while keys[i] != row and keys[i] != -1:
        i = (i + 1) & mask
    return i


@njit(cache=True, nogil=True)
def _claim(rows, keys, vals, shift, step, fresh_before, distinct, stale, owner, slot):
    """Flags the slots of ``rows`` whose last holder step is ``>= fresh_before`` (into ``stale``, with that
    step in ``owner`` and the row's slot in its working set in ``slot``), then records ``step`` as every row's
    holder (at its slot; ``UNKNOWN_SLOT`` unless ``distinct``). Returns (flagged, entries added)."""
    n = 0
    for s in range(rows.shape[0]):
        i = _find(keys, rows[s], shift)
        if keys[i] != -1:
            h = vals[i]
            if (h >> 32) >= fresh_before:
                stale[n] = s
                owner[n] = h >> 32
                slot[n] = h & UNKNOWN_SLOT
                n += 1
    added = 0
    tag = step << 32
    for s in range(rows.shape[0]):  # after every flag: a repeated row is flagged by its earlier holder only
        i = _find(keys, rows[s], shift)
        if keys[i] == -1:
            keys[i] = rows[s]
            added += 1
        vals[i] = tag | (s if distinct else UNKNOWN_SLOT)
    return n, added


@njit(cache=True, nogil=True)
def _rebuild(keys, vals, fresh_before, new_keys, new_vals, shift):
    """Copies the entries of steps ``>= fresh_before`` into the empty table ``new_*``; returns how many."""
    n = 0
    for i in range(keys.shape[0]):
        if keys[i] != -1 and (vals[i] >> 32) >= fresh_before:
            j = _find(new_keys, keys[i], shift)
            new_keys[j] = keys[i]
            new_vals[j] = vals[i]
            n += 1
    return n


@njit(cache=True, nogil=True)
def _lookup(rows, keys, vals, shift, out):
    """``out[i]``: the entry of ``rows[i]`` (-1 where none)."""
    for s in range(rows.shape[0]):
        i = _find(keys, rows[s], shift)
        out[s] = vals[i] if keys[i] != -1 else -1


def check_claim_step(step: int) -> None:
    """The claim book packs a step in the high 32 bits of an int64 beside a slot: ``0 <= step < 2**31``."""
    if not 0 <= step < 1 << 31:
        raise ValueError(f"step must be in [0, 2**31), got {step}")


class RowsInFlight:
    """The claim book's table (module docstring): the holder step and slot of each row of the live steps."""

    MIN_CAPACITY = 1024

    def __init__(self, capacity: int = MIN_CAPACITY):
        self._make(capacity)
        self.used = 0

    def _make(self, capacity: int) -> None:
        capacity = max(self.MIN_CAPACITY, 1 << max(0, int(capacity) - 1).bit_length())
        self.keys = np.full(capacity, -1, np.int64)
        self.vals = np.full(capacity, -1, np.int64)
        self.shift = 64 - (capacity.bit_length() - 1)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes

    def claim(self, rows: np.ndarray, step: int, fresh_before: int, distinct: bool = True):
        """Slots of ``rows`` an unfinished earlier step (``>= fresh_before``) may still update, that step for
        each, and each row's slot in its working set; then ``step`` holds every row (``distinct=False``: rows
        may repeat, each copy flagged as its row, the slots recorded as unknown)."""
        check_claim_step(step)
        rows = np.ascontiguousarray(rows, np.int64)
        n = rows.shape[0]
        if 2 * (self.used + n) > self.keys.shape[0]:
            self._rebuild(fresh_before, n)
        stale, owner, slot = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        k, added = _claim(rows, self.keys, self.vals, self.shift, np.int64(step), np.int64(fresh_before),
                          distinct, stale, owner, slot)  # fmt: skip
        self.used += added
        return stale[:k], owner[:k], slot[:k]

    def _rebuild(self, fresh_before: int, incoming: int) -> None:
        """Keeps the entries of the live steps only, in a table four times the rows it will then hold."""
        keys, vals = self.keys, self.vals
        live = int(np.count_nonzero((keys != -1) & ((vals >> 32) >= fresh_before)))
        self._make(4 * (live + incoming))
        self.used = _rebuild(keys, vals, np.int64(fresh_before), self.keys, self.vals, self.shift)

    def entries(self, rows: np.ndarray) -> np.ndarray:
        """int64: each row's entry (holder step << 32 | slot), -1 where the book holds none."""
        rows = np.ascontiguousarray(rows, np.int64)
        out = np.empty(rows.shape[0], np.int64)
        _lookup(rows, self.keys, self.vals, self.shift, out)
        return out
