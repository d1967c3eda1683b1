"""Which records of a :class:`~hotline.tiers.disk_file.RowFile` were written since a point in time (a full
checkpoint): one bit per file position, what a delta checkpoint writes (:mod:`hotline.training.checkpoint_delta`).

A file has no :class:`WrittenRows` until :func:`track` gives it one (a checkpoint does, after writing the whole
file), so a run without checkpoints spends nothing on it; from then on every write of the file marks its
positions (:func:`mark_written` from :meth:`RowFile.write_rows`, :func:`mark_written_range` from
:meth:`RowFile.put_positions`, its bulk writes). Host memory:
``ceil(rows / 8)`` bytes (:attr:`WrittenRows.nbytes`). Bit ``i % 8`` of byte ``i // 8`` is position ``i``
(``numpy.packbits(..., bitorder="little")``).
"""

from __future__ import annotations

import numpy as np


class WrittenRows:
    """A bitmap of a file's positions written since :meth:`clear`, and ``base``: what they are relative to (the
    caller's record of its last full copy; None until it sets one)."""

    per_row = ("bits",)
    """Arrays that grow with the row count at under a byte a row, which
    :func:`~hotline.training.host_memory.per_row_bytes` counts all the same."""

    def __init__(self, num_rows: int):
        self.num_rows = int(num_rows)
        self.bits = np.zeros(-(-self.num_rows // 8), np.uint8)
        self.base: dict | None = None

    @property
    def nbytes(self) -> int:
        return int(self.bits.nbytes)

    def mark(self, positions: np.ndarray) -> None:
        """Marks the file ``positions`` (int, any order, repeats allowed)."""
        if positions.shape[0]:
            pos = np.asarray(positions, np.int64)
            np.bitwise_or.at(self.bits, pos >> 3, np.left_shift(1, pos & 7).astype(np.uint8))

    def mark_range(self, lo: int, hi: int) -> None:
        """Marks the positions ``lo .. hi - 1``."""
        if hi <= lo:
            return
        a, b = -(-lo // 8), hi // 8  # the whole bytes inside
        if a >= b:
            self.mark(np.arange(lo, hi))
            return
        self.bits[a:b] = 0xFF
        self.mark(np.r_[np.arange(lo, 8 * a), np.arange(8 * b, hi)])

    def count(self) -> int:
        """The positions marked."""
        return int(np.bitwise_count(self.bits).sum(dtype=np.int64))

    def clear(self) -> None:
        self.bits[:] = 0


def tracker(file) -> WrittenRows | None:
    """The :class:`WrittenRows` of ``file`` (a RowFile), or None when nothing tracks it."""
    return getattr(file, "written_rows", None)


def track(file) -> WrittenRows:
    """Gives ``file`` a :class:`WrittenRows` with nothing marked (or clears the one it has); returns it."""
    changed = tracker(file)
    if changed is None:
        changed = file.written_rows = WrittenRows(file.num_rows)
    changed.clear()
    return changed


def untrack(file) -> None:
    """Forgets what was written to ``file`` (its next checkpoint copies it whole)."""
    file.written_rows = None


def mark_written(file, *positions: np.ndarray) -> None:
    """Marks the file positions in each of ``positions`` of ``file`` as written, where something tracks it."""
    if (changed := tracker(file)) is not None:
        for pos in positions:
            changed.mark(pos)


def mark_written_range(file, lo: int, hi: int) -> None:
    """Marks the file positions ``lo .. hi - 1`` of ``file`` as written, where something tracks it."""
    if (changed := tracker(file)) is not None:
        changed.mark_range(lo, hi)
