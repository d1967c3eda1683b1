"""A bit per position of a :class:`~hotline.tiers.disk_file.RowFile`: the one bitmap behind
:class:`~hotline.tiers.pending_rows.PendingRows` (positions not written yet) and
:class:`~hotline.tiers.written_rows.WrittenRows` (positions written since a full checkpoint).

Bit ``i % 8`` of byte ``i // 8`` is position ``i`` (``numpy.packbits(..., bitorder="little")``); the bits past
the last position stay clear. Host memory: ``ceil(positions / 8)`` bytes (:attr:`PositionBits.nbytes`);
``tests/test_position_bits.py`` checks every operation against a bool array.
"""

from __future__ import annotations

import numpy as np


class PositionBits:
    """A bit per position ``0 .. num_rows - 1``, all set (``fill``) or all clear at first."""

    per_row = ("bits",)
    """Under a byte a row, counted by :func:`~hotline.training.host_memory.per_row_bytes` all the same."""

    def __init__(self, num_rows: int, fill: bool = False):
        self.num_rows = int(num_rows)
        self.bits = np.zeros(-(-self.num_rows // 8), np.uint8)
        if fill:
            self.set_all(True)

    @property
    def nbytes(self) -> int:
        return int(self.bits.nbytes)

    def count(self) -> int:
        """The positions whose bit is set."""
        return int(np.bitwise_count(self.bits).sum(dtype=np.int64))

    def mask(self, positions: np.ndarray) -> np.ndarray:
        """bool [n]: which of ``positions`` have their bit set."""
        pos = np.asarray(positions, np.int64)
        return ((self.bits[pos >> 3] >> (pos & 7).astype(np.uint8)) & 1).astype(bool)

    def range_mask(self, lo: int, hi: int) -> np.ndarray:
        """bool [hi - lo]: which of the positions ``lo .. hi - 1`` have their bit set."""
        a = lo // 8
        raw = np.unpackbits(self.bits[a : -(-hi // 8)], bitorder="little")
        return raw[lo - 8 * a : hi - 8 * a].astype(bool)

    def set(self, positions: np.ndarray, on: bool = True) -> None:
        """Sets (``on``) or clears the bits of ``positions`` (int, any order, repeats allowed)."""
        if np.shape(positions)[0]:
            pos = np.asarray(positions, np.int64)
            bit = np.left_shift(1, pos & 7).astype(np.uint8)
            if on:
                np.bitwise_or.at(self.bits, pos >> 3, bit)
            else:
                np.bitwise_and.at(self.bits, pos >> 3, ~bit)

    def set_range(self, lo: int, hi: int, on: bool = True) -> None:
        """Sets (``on``) or clears the bits of the positions ``lo .. hi - 1``."""
        if hi <= lo:
            return
        a, b = -(-lo // 8), hi // 8  # the whole bytes inside
        if a >= b:
            self.set(np.arange(lo, hi), on)
            return
        self.bits[a:b] = 0xFF if on else 0
        self.set(np.r_[np.arange(lo, 8 * a), np.arange(8 * b, hi)], on)

    def set_all(self, on: bool) -> None:
        """Sets (``on``) or clears every position's bit."""
        self.bits[:] = 0xFF if on else 0
        if on and self.num_rows % 8:
            self.bits[-1] = (1 << (self.num_rows % 8)) - 1

    def put_range(self, lo: int, mask: np.ndarray) -> None:
        """Sets the bits of the positions ``lo .. lo + len(mask) - 1`` to ``mask`` (bool): whole bytes packed."""
        hi = lo + mask.shape[0]
        a, b = -(-lo // 8), hi // 8  # the whole bytes inside
        if a < b:
            self.bits[a:b] = np.packbits(mask[8 * a - lo : 8 * b - lo], bitorder="little")
            edge = np.r_[np.arange(lo, 8 * a), np.arange(8 * b, hi)]
        else:
            edge = np.arange(lo, hi)
        on = mask[edge - lo]
        self.set(edge[on], True)
        self.set(edge[~on], False)
