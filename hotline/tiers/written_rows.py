"""Which records of a :class:`~hotline.tiers.disk_file.RowFile` were written since a point in time (a full
checkpoint): one bit per file position, what a delta checkpoint writes (:mod:`hotline.training.checkpoint_delta`).

A file has no :class:`WrittenRows` until :func:`track` gives it one (a checkpoint does, after writing the whole
file), so a run without checkpoints spends nothing on it; from then on every write of the file marks its
positions (:func:`mark_written` from :meth:`RowFile.write_rows`, :func:`mark_written_range` from
:meth:`RowFile.put_positions`, its bulk writes). Host memory:
``ceil(rows / 8)`` bytes, a :class:`~hotline.tiers.position_bits.PositionBits`.
"""

from __future__ import annotations

import numpy as np

from hotline.tiers.position_bits import PositionBits


class WrittenRows(PositionBits):
    """The bits of a file's positions written since :meth:`clear`, and ``base``: what they are relative to (the
    caller's record of its last full copy; None until it sets one)."""

    def __init__(self, num_rows: int):
        super().__init__(num_rows)
        self.base: dict | None = None

    def mark(self, positions: np.ndarray) -> None:
        """Marks the file ``positions`` (int, any order, repeats allowed)."""
        self.set(positions)

    def mark_range(self, lo: int, hi: int) -> None:
        """Marks the positions ``lo .. hi - 1``."""
        self.set_range(lo, hi)

    def clear(self) -> None:
        """Unmarks every position."""
        self.set_all(False)


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
