"""Lazy initialization of a disk store's file: the rows whose initial records are not written yet.

A :class:`~hotline.tiers.disk_file.RowFile` made by the store is not filled at start-up (most of a large table's
rows are never looked up in a run). Instead its :class:`PendingRows` holds one bit per file position: set, the
file's bytes at that position are not its row's value, which is the row's initial record (its initial weights,
:mod:`hotline.kernels.initial_rows`, bit-identical to :func:`~hotline.models.dlrm.init_embedding_table`, and
zero optimizer state). Every reader substitutes the drawn record for a pending position (a step's page reads,
their refresh, the DRAM tier's reads of its slots, the file read in order for a checkpoint, an export or an
evaluation), so every mode starts from the same numbers, and a page whose records are all pending is not read
at all. A write
of a row's real record clears its bit; a page written back carries zeros or stale bytes at the pending
positions it holds, which stay pending. Host memory: ``ceil(positions / 8)`` bytes, a
:class:`~hotline.tiers.position_bits.PositionBits`.
"""

from __future__ import annotations

import numpy as np

from hotline.kernels.initial_rows import draw_fused, jump_tables
from hotline.tiers.disk_pages import aligned_bytes, get_records, pages_of, spanned
from hotline.tiers.position_bits import PositionBits
from hotline.tiers.store_files import PAGE


class PendingRows(PositionBits):
    """The file positions not written yet (their bits, all set at first) and how to draw their records: the file
    holds the local rows ``rank::world_size`` of tables ``table_sizes`` (local row ``l`` is fused row
    ``l * world_size + rank``), ``dim`` weights and ``state_floats`` zero state floats a record. :meth:`mask` and
    :meth:`range_mask` say which positions are pending."""

    def __init__(self, order, table_sizes, dim: int, state_floats: int, seed: int, rank: int = 0,
                 world_size: int = 1):  # fmt: skip
        super().__init__(int(order.shape[0]), fill=True)
        self.order = order  # the file's order (positions to local rows), read in chunks (an OrderFile)
        self.dim, self.floats = int(dim), int(dim) + int(state_floats)
        self.rank, self.world_size = int(rank), int(world_size)
        self.table_rows = np.asarray(table_sizes, np.int64)
        self.jumps = jump_tables(int(seed), self.table_rows.shape[0])

    def clear(self, positions: np.ndarray) -> None:
        """The file ``positions`` now hold their rows' values."""
        self.set(positions, False)

    def clear_range(self, lo: int, hi: int) -> None:
        """The positions ``lo .. hi - 1`` now hold their rows' values."""
        self.set_range(lo, hi, False)

    def records(self, local_rows: np.ndarray, out: np.ndarray | None = None, take: np.ndarray | None = None
                ) -> np.ndarray:  # fmt: skip
        """The initial records float32 [n, floats] of the file's ``local_rows`` (into ``out`` when given; with
        ``take``, bool [n], only those it marks)."""
        out = np.empty((np.shape(local_rows)[0], self.floats), np.float32) if out is None else out
        return draw_fused(local_rows, self.table_rows, self.dim, self.jumps, out, self.world_size, self.rank,
                          take)  # fmt: skip

    def weights(self, fused: np.ndarray) -> np.ndarray:
        """The initial weights float32 [n, dim] of the fused rows ``fused`` (of any rank: the hot tier's)."""
        out = np.empty((np.shape(fused)[0], self.dim), np.float32)
        return draw_fused(np.asarray(fused, np.int64), self.table_rows, self.dim, self.jumps, out)

    def substitute(self, start: int, records: np.ndarray) -> None:
        """Draws the records of the pending positions among ``start .. start + len(records) - 1`` into
        ``records``."""
        mask = self.range_mask(start, start + records.shape[0])
        if not mask.any():
            return
        rows = np.asarray(self.order[start : start + records.shape[0]])  # one sequential read, drawn in place
        self.records(rows, out=records, take=None if mask.all() else mask)

    def whole_pages(self, pages: np.ndarray, record: int) -> np.ndarray:
        """bool [P]: which of the file ``pages`` hold only pending records (every record that touches them, those
        straddling their edges too): such a page need not be read, and may be written with any bytes beside
        the records written into it."""
        pages = np.asarray(pages, np.int64)
        if not pages.shape[0]:
            return np.zeros(0, bool)
        first = pages * PAGE // record
        last = np.minimum((pages * PAGE + PAGE - 1) // record, self.num_rows - 1)
        width = int((last - first).max()) + 1
        pos = first[:, None] + np.arange(width)
        inside = pos <= last[:, None]
        return (self.mask(np.minimum(pos, last[:, None]).reshape(-1)).reshape(pos.shape) | ~inside).all(
            axis=1
        )


# -- the hooks of RowFile's reads and writes (``pending`` None: a file that holds every record) --------------
def refuse_lazy(path, manifest: dict) -> None:
    """Raises ValueError when the file's header says it was initialized lazily (its pending rows are not in it:
    only the run that made it can read it)."""
    if manifest.get("initial") == "lazy":
        raise ValueError(f"cold store {path} was initialized lazily: rows never written are not in the file")


def records_at(file, start: int, count: int) -> np.ndarray:
    """Records [count, floats] at file positions ``start...`` of ``file`` as their rows' values: pending ones
    drawn, the file read only over the span of the others (none where all are pending), or only the pages that
    hold them where those are under half the span (a checkpoint of a file mostly never written)."""
    p = file.pending
    if p is None:
        return file._read_positions(start, count)
    held = np.flatnonzero(~p.range_mask(start, start + count))
    out = np.empty((count, file.floats), np.float32)
    if held.shape[0]:
        a, b = int(held[0]), int(held[-1]) + 1
        pages, offsets = pages_of(start + held, file.record)
        if (
            2 * pages.shape[0] * PAGE < (b - a) * file.record
        ):  # few pages hold them: those read on the I/O threads
            buffer = aligned_bytes(pages.shape[0] * PAGE)
            file._io(False, pages, buffer)
            out[held] = get_records(buffer, offsets, file.record).view(np.float32)
        else:
            out[a:b] = file._read_positions(start + a, b - a)
    p.substitute(start, out)
    return out


def plan_reads(file, pos, keep, pages, offsets, read_at, buffer):
    """A fetch's pages to read from ``file`` (``read_at`` of the others -1; all the fetch's version when called)
    for the records at file positions ``pos`` (their ``offsets`` in ``buffer``, of ``pages``) that ``keep`` says to
    read: those pending are drawn, not read, and a page of pending records alone is not read at all: its bytes
    zero, its ``read_at`` the fetch's version (a write since re-stamps it). Returns ``need`` (bool, the records read), ``drawn`` (bool,
    those pending), the indices of the pages to read and the number of pages left blank."""
    pending, record = file.pending, file.record
    version = int(read_at[0]) if read_at.shape[0] else 0
    drawn = np.zeros(pos.shape[0], bool) if pending is None else pending.mask(pos)
    need = keep & ~drawn
    if not need.all():
        read_at[:] = -1
        read_at[spanned(offsets[need], record)] = version
    which = np.flatnonzero(read_at >= 0)
    if pending is None:
        return need, drawn, which, 0
    idle = np.flatnonzero(read_at < 0)
    zeroed = idle[pending.whole_pages(pages[idle], record)]
    buffer.reshape(-1, PAGE)[zeroed] = 0
    read_at[zeroed] = version
    return need, drawn, which, int(zeroed.shape[0])


def draw_into(pending, out: np.ndarray, rows: np.ndarray, idx: np.ndarray) -> None:
    """The initial records of ``rows[idx]`` into ``out[idx]``."""
    if idx.shape[0]:
        out[idx] = pending.records(rows[idx])


def draw_pending(file, rows: np.ndarray, idx: np.ndarray, disk: np.ndarray, out: np.ndarray) -> np.ndarray:
    """bool [len(idx)]: which of ``rows[idx]`` on disk (``disk``) are still pending; their records drawn into
    ``out`` (a refresh's)."""
    drawn = np.zeros(idx.shape[0], bool)
    if file.pending is not None and disk.any():
        drawn[disk] = file.pending.mask(file.positions[rows[idx[disk]]])
        draw_into(file.pending, out, rows[idx], np.flatnonzero(drawn))
    return drawn


def blank_pages(file, pages: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """bool [P]: the ``pages`` of ``file`` of pending records alone (their bytes in ``buffer`` zeroed): a write
    need not read them first."""
    if file.pending is None:
        return np.zeros(pages.shape[0], bool)
    blank = file.pending.whole_pages(pages, file.record)
    buffer.reshape(-1, PAGE)[blank] = 0
    return blank


def written(pending, positions: np.ndarray, hi: int | None = None) -> None:
    """The file ``positions`` (with ``hi``: the range ``positions .. hi - 1``) now hold their rows' values."""
    if pending is not None:
        pending.clear(positions) if hi is None else pending.clear_range(int(positions), hi)


def write_whole(file) -> None:
    """Writes every row of ``file`` (a :class:`~hotline.tiers.disk_file.RowFile`) in file order, those still
    pending as drawn: the file as after a long run, every row on disk (a benchmark of the disk's reads needs it:
    a pending row is drawn when first read, not read)."""
    start = 0
    for _, records in file.read_all(rows=False):
        file.put_positions(start, records)
        start += records.shape[0]
    file.flush()
    file.drop_page_cache()
