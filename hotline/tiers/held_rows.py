"""Held writes of a disk store's file: the records a step writes back, kept in host memory and written to the
file in one sequential sweep, not page by page in place.

A step's cold rows lie one or two to a page of a large file, so writing them back in place rewrites a 4 KiB page
at random for every row: a disk does that at its random-write rate, far below its sequential one. A
:class:`HeldRows` of a :class:`~hotline.tiers.disk_file.RowFile` takes the written records instead (a table from
file position to slot, :mod:`hotline.kernels.held_rows`, and the records), and when it is full
:meth:`HeldRows.sweep` writes them in file order: each 64 MiB span of the file that holds some is read (not
where every other record in it is pending: :mod:`~hotline.tiers.pending_rows`), the held records laid over it,
and written back whole. A record held is its row's value: every read of the file lays the held records over
what it read (:meth:`HeldRows.over_pages` for a step's pages, :meth:`HeldRows.over_range` for a run of
positions), so a reader sees the same bytes as if each write had gone to the file. A read that a sweep's end
overtook (its bytes from before the sweep, the held records gone) is read again. ``--cold-write-buffer`` sizes
it (bytes; 0: every write in place); its bytes are a budget, not a cost of the row count, but for a bit a row
(``marked``: positions held, the reads' shortcut: a page read probes the table for those only).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from hotline._malloc import huge_full
from hotline.kernels.held_rows import EMPTY, insert, new_table, overlay, sized
from hotline.table_layout import bytes_per_row

WRITE_BUFFER_AUTO = 256 << 20
"""The most ``--cold-write-buffer auto`` takes: a sweep's cost is the file's, spread over the steps that fill it."""

SWEEP_BREAK_EVEN = 32 << 10
"""File bytes a held record may stand for before a sweep costs more than writing its page in place: a sweep reads
and writes the file at the sequential rate (1-2 GB/s here) where a row written in place costs a random 4 KiB
write (16-30 thousand a second at depth 32), so one held row pays for ``seq_rate / random_rate / 2`` bytes of
sweep, 32-64 KiB (the smaller taken)."""


def write_buffer_bytes(config, total_rows: int, world_size: int = 1) -> int:
    """Bytes of a disk store's held writes on one rank (``--cold-write-buffer``; :mod:`hotline.tiers.held_rows`):
    as given, or ``auto``: an eighth of the rank's rows and state, at most :data:`WRITE_BUFFER_AUTO`, and 0 (in
    place) where the file is larger than :data:`SWEEP_BREAK_EVEN` a record it holds (large records: the sweeps
    would cost more than the page writes they spare)."""
    value = getattr(config, "cold_write_buffer", 0)
    if value != "auto":
        return int(value)
    rows = -(-int(total_rows) // world_size)
    record = bytes_per_row(config.embedding_dim, config.optimizer)
    budget = min(WRITE_BUFFER_AUTO, rows * record // 8)
    return budget if rows * record <= sized(budget, record)[1] * SWEEP_BREAK_EVEN else 0


class HeldRows:
    """Records written to a file of ``num_rows`` records of ``record`` bytes, held until :meth:`sweep` (module
    docstring), in ``budget`` bytes."""

    per_row = ("marked",)
    """A bit a position (held or not: a read probes the table for the marked ones only), counted by
    :func:`~hotline.training.host_memory.per_row_bytes`."""

    budgeted = ("keys", "slots", "records")
    """Sized by ``--cold-write-buffer``, not by the row count (:func:`~hotline.training.host_memory.per_row_bytes`
    leaves them out)."""

    def __init__(self, num_rows: int, record: int, budget: int):
        self.num_rows, self.record = int(num_rows), int(record)
        self._size, self.capacity = sized(int(budget), self.record)
        # taken at the first put (a run that writes nothing, an evaluation's, holds none); the records' pages
        # untouched until written: resident memory grows with the records held, up to the budget
        self.keys = self.slots = self.records = None
        self.marked = np.zeros(-(-self.num_rows // 8), np.uint8)
        self.count = 0
        self.lock = threading.Lock()
        """Held while the table changes and while a read lays the records over its bytes."""
        self.sweeps = 0
        """Sweeps completed: a read that began before one ended reads again."""
        self._version = 0  # puts and sweeps: the sorted view's age
        self._sorted: tuple[int, np.ndarray, np.ndarray] | None = None
        self.swept_rows = 0
        self.sweep_s = 0.0

    @property
    def nbytes(self) -> int:
        """The budget's bytes once taken (the table, the records) and the page bitmap's."""
        return 16 * self._size + self.capacity * self.record + int(self.marked.nbytes)

    def fits(self, n: int) -> bool:
        """Whether ``n`` more records fit (as new keys) before a sweep."""
        return self.count + n <= self.capacity

    def put(self, positions: np.ndarray, records: np.ndarray) -> None:
        """Holds ``records`` [U, floats] as the values of the distinct file ``positions`` (room left:
        :meth:`fits`)."""
        pos = np.asarray(positions, np.int64)
        with self.lock:
            self._take()
            slot, self.count = insert(self.keys, self.slots, pos, self.count)
            self.records[slot] = records
            np.bitwise_or.at(self.marked, pos >> 3, np.left_shift(1, pos & 7).astype(np.uint8))
            self._version += 1
            self._sorted = None  # made again when a reader needs it

    def take(self) -> None:
        """Takes the table's memory now, if not yet (a training run's first fetch: not in its steps' writes)."""
        with self.lock:
            self._take()

    def _take(self) -> None:
        if self.keys is None:  # huge pages, every entry taken now (random entries: not a fault each)
            self.keys, self.slots = new_table(self._size, huge_full)
            self.records = np.empty((self.capacity, self.record // 4), np.float32)

    def read(self, read, over) -> None:
        """Calls ``read()`` (the file's bytes), then ``over()`` (lays the held records over them) under the lock,
        ``read()`` again while a sweep ended between the two."""
        while True:
            seen = self.sweeps
            read()
            with self.lock:
                if self.sweeps == seen:
                    if self.count:
                        over()
                    return

    def over_pages(self, pages: np.ndarray, at: np.ndarray, buffer: np.ndarray) -> int:
        """Lays the held records over file ``pages`` read into ``buffer`` (page ``pages[i]`` at byte
        ``at[i] * 4096``); under :attr:`lock` (:meth:`read`). Returns the records laid."""
        view = self.records.view(np.uint8)
        return overlay(np.asarray(pages, np.int64), np.asarray(at, np.int64), buffer, self.record,
                       self.num_rows, self.keys, self.slots, view, self.marked)  # fmt: skip

    def _in_order(self) -> tuple[np.ndarray, np.ndarray]:
        """The held positions in ascending order and their slots (made again after a put or a sweep)."""
        if self._sorted is None or self._sorted[0] != self._version:
            live = np.flatnonzero(self.keys != EMPTY)
            keys = self.keys[live]
            order = np.argsort(keys, kind="stable")
            self._sorted = (self._version, keys[order], self.slots[live][order])
        return self._sorted[1], self._sorted[2]

    def over_range(self, start: int, out: np.ndarray) -> None:
        """Lays the held records of file positions ``start .. start + len(out) - 1`` over ``out`` [n, floats]; under
        :attr:`lock` (:meth:`read`)."""
        keys, slots = self._in_order()
        a, b = np.searchsorted(keys, [start, start + out.shape[0]])
        if b > a:
            out[keys[a:b] - start] = self.records[slots[a:b]]

    def sweep(self, file, chunk_bytes: int = 64 << 20) -> None:
        """Writes the held records to ``file`` (a :class:`~hotline.tiers.disk_file.RowFile`) in file order, a span
        of at most ``chunk_bytes`` at a time, and empties the table; from its writer (no put meanwhile). Reads go
        on beside it: the records stay held (laid over what they read) until the file holds them all."""
        if not self.count:
            return
        t0 = time.perf_counter()
        with self.lock:
            keys, slots = self._in_order()
        chunk = max(1, chunk_bytes // self.record)
        pending, i = file.pending, 0
        while i < keys.shape[0]:
            lo = int(keys[i])
            j = int(np.searchsorted(keys, lo + chunk))
            n = int(keys[j - 1]) + 1 - lo
            kept = n - (j - i)  # records in the span not held: read from the file unless all pending
            if pending is not None and kept == int(pending.range_mask(lo, lo + n).sum()):
                recs = np.zeros((n, self.record // 4), np.float32)  # pending ones' bytes are not values
            else:
                recs = file._read_positions(lo, n, held=False)
            recs[keys[i:j] - lo] = self.records[slots[i:j]]
            file._write_positions(lo, recs, clear=False)
            file.drop_page_cache()  # a memory limit must not fill with the sweep's dirty pages
            i = j
        with self.lock:
            self.keys.fill(EMPTY)
            self.marked.fill(0)
            self.swept_rows += self.count
            self.count = 0
            self.sweeps += 1
            self._version += 1
            self._sorted = None
        self.sweep_s += time.perf_counter() - t0
