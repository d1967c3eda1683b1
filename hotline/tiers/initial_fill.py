"""The initial fill of a disk store's file: every row's initial weights and zero optimizer state, written in file
order at the disk's sequential rate (:func:`fill_file`), or none written, each drawn when read until written
(:func:`lazy_fill`, the store's default: :mod:`hotline.tiers.pending_rows`).

The numbers are those every mode starts from (:func:`hotline.models.dlrm.init_embedding_table`: one generator per
table, drawn in row order). :func:`initial_block` draws any block of a table's rows on its own, by advancing the
table's generator past the rows before it, so blocks are drawn on several threads and are bit-identical to the
whole table (tested).

The file's order (:func:`~hotline.tiers.disk_store.popularity_order`) is one long ascending run of rows (the
never-counted ones) between rows in other orders (the counted ones, by count, and the hot ones, in id order).
Walking the rows in id order, every maximal ascending run of the order that is at least :data:`MIN_STREAM_ROWS`
long is a *stream*: its rows arrive in its own file order, so it is written sequentially, in large page-aligned
``O_DIRECT`` writes on a writer thread (no page cache: the memory limit holds the process, not a copy of the
file). The records of the shorter runs and those on a page that two streams share are kept until every row is
drawn, then written page by page. Where the order is not of this shape (a few short runs would not be) or the
file is not opened ``O_DIRECT``, the rows go through :meth:`~hotline.tiers.disk_file.RowFile.put_rows`.

Host memory: the blocks in flight (:data:`BLOCK_FLOATS` draws each), one or two buffers per stream
(:data:`STREAM_BYTES` in all) and the short runs' records (at most :data:`STASH_BYTES`, or the fallback).
"""

from __future__ import annotations

import errno
import math
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hotline.table_layout import TableLayout
from hotline.tiers.disk_pages import (
    PAGE,
    RowPositions,
    aligned_bytes,
    named_error,
    pages_of,
    put_records,
    spanned,
)
from hotline.tiers.pending_rows import records_at

BLOCK_FLOATS = 1 << 21
"""Draws per generated block (16 MiB of float64, 8 MiB of float32 weights)."""
STREAM_BYTES = 64 << 20
"""Aligned write buffers of all streams together (each stream has two: one filling, one being written)."""
MIN_STREAM_ROWS = 4096
"""An ascending run of the order at least this long is written as a stream; shorter ones are kept for the end."""
STASH_BYTES = 64 << 20
"""At most this many bytes of records of short runs kept for the end; an order with more takes the fallback."""


def fill_threads() -> int:
    """Threads that draw the initial rows: the calling thread's Numba threads (``--threads``), at most the CPUs
    this process may use, at most 4."""
    import numba

    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus, numba.get_num_threads()))


def initial_block(
    rows: int, dim: int, seed: int, table: int, lo: int, n: int, state_floats: int = 0
) -> np.ndarray:
    """Records float32 [n, dim + state_floats] of rows ``lo ... lo + n`` of table ``table`` (of ``rows`` rows):
    their initial weights (those of the whole table, :func:`hotline.models.dlrm.init_embedding_table`), then
    zero optimizer state. Each draw of the table's generator is one 64-bit step, so the block starts
    ``lo * dim`` steps in."""
    rng = np.random.default_rng([seed, 7919, table])
    if lo:
        rng.bit_generator.advance(lo * dim)
    out = np.empty((n, dim + state_floats), np.float32)
    out[:, :dim] = rng.uniform(-1.0 / math.sqrt(rows), 1.0 / math.sqrt(rows), size=(n, dim))
    out[:, dim:] = 0.0
    return out


def _blocks(layout: TableLayout, dim: int):
    """``(table, first row, rows)`` of every block, tables in order, rows in order."""
    step = max(1, BLOCK_FLOATS // max(1, dim))
    for t, n in enumerate(layout.table_sizes):
        for lo in range(0, n, step):
            yield t, lo, min(step, n - lo)


class _Edges:
    """Records kept for the end and the pages they fill: every page a short run's records touch, and the first
    and last page of each stream (which no stream fills alone)."""

    def __init__(self):
        self.pos: list[np.ndarray] = []
        self.rec: list[np.ndarray] = []
        self.pages: list[np.ndarray] = []

    def add(self, pos: np.ndarray, rec: np.ndarray, record: int = 0) -> None:
        """Records ``rec`` of positions ``pos``; with ``record`` (a short run's) every page they touch is one
        to write, else the pages :meth:`add_pages` names are."""
        if pos.shape[0]:
            pos = np.asarray(pos, np.int64)
            self.pos.append(pos)
            self.rec.append(np.array(rec, np.float32))
            if record:
                self.pages.append(spanned(pos * record, record))

    def add_pages(self, pages: list[int]) -> None:
        self.pages.append(np.asarray(pages, np.int64))

    def write(self, fd: int, path, record: int) -> int:
        """Writes the pages to write, made of the records kept (they hold every record of those pages);
        returns the bytes written."""
        if not self.pos:
            return 0
        pos, rec = np.concatenate(self.pos), np.concatenate(self.rec)
        pages, offsets = pages_of(pos, record)
        buffer = aligned_bytes(pages.shape[0] * PAGE)
        buffer[:] = 0  # past the last record: zeros, as the file was made
        put_records(buffer, offsets, rec)
        keep = np.flatnonzero(np.isin(pages, np.concatenate(self.pages)))
        self.pos, self.rec, self.pages = [], [], []
        breaks = np.flatnonzero(np.diff(pages[keep]) != 1) + 1
        written = 0
        for a, b in zip([0, *breaks.tolist()], [*breaks.tolist(), keep.shape[0]]):
            if b > a:
                i, j = int(keep[a]), int(keep[b - 1]) + 1
                written += _pwrite(fd, path, buffer[i * PAGE : j * PAGE], int(pages[i]) * PAGE)
        return written


def _pwrite(fd: int, path, data: np.ndarray, at: int) -> int:
    view = memoryview(data)
    while view.nbytes:
        try:
            n = os.pwrite(fd, view, at)
        except OSError as e:
            raise named_error(e, path, f"initial fill, write at byte {at}") from None
        if n <= 0:
            raise named_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), path, f"write at byte {at}")
        view, at = view[n:], at + n
    return data.nbytes


class _Stream:
    """File positions ``[start, stop)`` that take rows in ascending id order: their whole pages are written in
    order from two aligned buffers on the writer thread; the records on a first or last page that the stream
    does not fill alone are kept for the end."""

    def __init__(self, fill: _Fill, start: int, stop: int, buffer_bytes: int):
        self.fill, R = fill, fill.record
        self.next, self.stop = start, stop  # the next position to take, the end
        first_full = -(-start * R // PAGE) * PAGE
        last_full = stop * R // PAGE * PAGE
        self.lo_byte, self.hi_byte = first_full, max(first_full, last_full)  # the bytes of whole pages
        self.edge_lo = min(stop, -(-self.lo_byte // R))  # records below it touch the first partial page
        self.edge_hi = max(self.edge_lo, self.hi_byte // R)  # records from it on, the last partial page
        if stop > start:
            first, last = start * R // PAGE, (stop * R - 1) // PAGE
            whole_lo, whole_hi = self.lo_byte // PAGE, self.hi_byte // PAGE  # the pages it writes itself
            fill.edges.add_pages([*range(first, whole_lo), *range(max(whole_hi, whole_lo), last + 1)])
        self.at = self.lo_byte  # the file byte of the filling buffer's first byte
        self.size = max(PAGE, buffer_bytes // PAGE * PAGE)
        self.buffers: list[np.ndarray] = []
        self.pending: list = [None, None]
        self.which = self.used = 0

    def take(self, rec: np.ndarray) -> None:
        """Records of the stream's next ``len(rec)`` positions."""
        R, n, p0 = self.fill.record, rec.shape[0], self.next
        if p0 + n > self.stop:
            raise RuntimeError(
                f"initial fill: {p0 + n - self.stop} records past a run's end (position {self.stop})"
            )
        self.next += n
        lo, hi = max(p0, min(self.edge_lo, p0 + n)), max(p0, min(self.edge_hi, p0 + n))
        if lo > p0 or hi < p0 + n:  # records on a partial page: kept for the end
            idx = np.r_[0 : lo - p0, hi - p0 : n]
            self.fill.edges.add(p0 + idx, rec[idx])
        b0, b1 = max(p0 * R, self.lo_byte), min((p0 + n) * R, self.hi_byte)
        if b1 <= b0:
            return
        raw = np.ascontiguousarray(rec).reshape(-1).view(np.uint8)[b0 - p0 * R : b1 - p0 * R]
        while raw.shape[0]:
            if not self.buffers:
                self.buffers = [aligned_bytes(self.size), aligned_bytes(self.size)]
            k = min(raw.shape[0], self.size - self.used)
            self.buffers[self.which][self.used : self.used + k] = raw[:k]
            self.used += k
            raw = raw[k:]
            if self.used == self.size or self.at + self.used == self.hi_byte:
                self._flush()

    def _flush(self) -> None:
        if not self.used:
            return
        self.pending[self.which] = self.fill.submit(self.buffers[self.which][: self.used], self.at)
        self.at += self.used
        self.used = 0
        self.which ^= 1
        if self.pending[self.which] is not None:  # the other buffer's write is done before it is reused
            self.pending[self.which].result()
            self.pending[self.which] = None

    def close(self) -> None:
        self._flush()
        for f in self.pending:
            if f is not None:
                f.result()
        if self.next != self.stop:
            raise RuntimeError(f"initial fill: a run ends at position {self.next}, not {self.stop}")
        self.buffers, self.pending = [], [None, None]


class _Fill:
    """The streams and short runs of one file's order, written through ``fd`` (``O_DIRECT``)."""

    def __init__(self, file, positions: RowPositions, fd: int):
        self.file, self.fd, self.record = file, fd, file.record
        self.kept_rows, self.kept_at = positions.kept_rows, positions.kept_at
        self.edges = _Edges()
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="hotline-fill-write")
        self.written = 0
        # the positions' runs (each the rows of an id range not kept, in id order: run k's rows lie in
        # [run_lo[k], run_lo[k + 1])) are streams; the positions outside them, in file order, are cut into
        # maximal runs of consecutive positions holding ascending rows: the long ones are streams too, the
        # short ones are kept for the end
        n = file.num_rows
        self.run_lo = positions.run_lo
        his = np.append(self.run_lo[1:], n)
        kept_in = np.searchsorted(self.kept_rows, his) - np.searchsorted(self.kept_rows, self.run_lo)
        run_a = positions.run_start
        run_b = run_a + (his - self.run_lo) - kept_in
        by_pos = np.argsort(run_a, kind="stable")
        gaps = zip([0, *run_b[by_pos].tolist()], [*run_a[by_pos].tolist(), n])
        found = [_runs(file.order, a, b) for a, b in gaps if b > a]
        starts, stops = (np.concatenate(x) for x in zip(*found)) if found else (np.zeros(0, np.int64),) * 2
        long = (stops - starts) >= MIN_STREAM_ROWS
        self.short_rows = int((stops - starts)[~long].sum())
        self.seg_start = starts  # every run's first position, ascending
        each = max(PAGE, STREAM_BYTES // (2 * (run_a.shape[0] + int(long.sum()))))
        self.mains = [_Stream(self, int(a), int(b), each) for a, b in zip(run_a.tolist(), run_b.tolist())]
        self.seg_stream: list[_Stream | None] = [None] * starts.shape[0]
        for i in np.flatnonzero(long).tolist():
            self.seg_stream[i] = _Stream(self, int(starts[i]), int(stops[i]), each)

    def submit(self, buf: np.ndarray, at: int):
        self.written += buf.nbytes
        return self.writer.submit(_pwrite, self.fd, self.file.path, buf, at)

    def take(self, local_lo: int, rec: np.ndarray) -> None:
        """Records of the local rows ``local_lo, local_lo + 1, ...``."""
        m = rec.shape[0]
        ka, kb = np.searchsorted(self.kept_rows, [local_lo, local_lo + m])
        if kb == ka:
            self._take_runs(local_lo, rec, None)
            return
        kr = self.kept_rows[ka:kb].astype(np.int64) - local_lo
        at = self.kept_at[ka:kb].astype(np.int64)
        main = np.ones(m, bool)
        main[kr] = False
        self._take_runs(local_lo, rec, main)
        seg = np.searchsorted(self.seg_start, at, side="right") - 1
        by_seg = np.argsort(seg, kind="stable")  # a run's rows in id order: its positions in order
        seg, kr, at = seg[by_seg], kr[by_seg], at[by_seg]
        cuts = np.flatnonzero(np.diff(seg)) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), seg.shape[0]]):
            stream = self.seg_stream[int(seg[lo])]
            if stream is None:
                self.edges.add(at[lo:hi], rec[kr[lo:hi]], self.record)
            elif int(at[lo]) != stream.next:
                raise RuntimeError(f"initial fill: row at position {int(at[lo])} came before {stream.next}")
            else:
                stream.take(rec[kr[lo:hi]])

    def _take_runs(self, local_lo: int, rec: np.ndarray, mine: np.ndarray | None) -> None:
        """The records of the local rows ``local_lo, ...`` that lie in the positions' runs (``mine``: which of
        them; None: all), each to its run's stream (the rows below the first run are all kept)."""
        m = rec.shape[0]
        a, b = np.searchsorted(self.run_lo, [local_lo, local_lo + m], side="right")
        bounds = [0, *(self.run_lo[a:b] - local_lo).tolist(), m]
        for k, (x, y) in enumerate(zip(bounds[:-1], bounds[1:]), start=int(a) - 1):
            part = rec[x:y] if mine is None else rec[x:y][mine[x:y]]
            if part.shape[0]:
                if k < 0:
                    raise RuntimeError(f"initial fill: row {local_lo + x} lies before every run")
                self.mains[k].take(part)

    def discard(self) -> None:
        """Ends the fill without its last writes (unused, or on an error: the writes under way finish)."""
        self.writer.shutdown()
        os.close(self.fd)

    def close(self) -> None:
        try:
            for s in [*self.mains, *self.seg_stream]:
                if s is not None:
                    s.close()
            self.written += self.edges.write(self.fd, self.file.path, self.record)
        finally:
            self.writer.shutdown()
            os.close(self.fd)


def _runs(order, lo: int, hi: int, chunk: int = 1 << 22) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, stops)``: the maximal runs of ascending rows in positions ``[lo, hi)`` of ``order`` (read in
    chunks: it may be a memory map), as int64 positions."""
    cuts = [np.array([lo], np.int64)] if hi > lo else []
    prev = None
    for c0 in range(lo, hi, chunk):
        c = np.asarray(order[c0 : min(hi, c0 + chunk)]).astype(np.int64)
        if prev is not None and c[0] <= prev:
            cuts.append(np.array([c0], np.int64))
        cuts.append(np.flatnonzero(c[1:] <= c[:-1]) + 1 + c0)
        prev = int(c[-1])
    starts = np.concatenate(cuts) if cuts else np.zeros(0, np.int64)
    return starts, np.append(starts[1:], hi) if starts.shape[0] else starts


def _streamed(file) -> _Fill | None:
    """The streamed fill of ``file`` where it applies (see the module docstring), else None."""
    positions = file.positions
    if not isinstance(positions, RowPositions) or not getattr(file, "direct", False) or not file.num_rows:
        return None
    try:
        fd = os.open(file.path, os.O_WRONLY | os.O_DIRECT)
    except OSError:
        return None
    try:
        fill = _Fill(file, positions, fd)
    except BaseException:
        os.close(fd)
        raise
    if fill.short_rows * file.record > STASH_BYTES:
        fill.discard()
        return None
    return fill


def lazy_fill(file, layout: TableLayout, dim: int, seed: int, rank: int = 0, world_size: int = 1,
              hot: np.ndarray | None = None) -> np.ndarray | None:  # fmt: skip
    """Makes every row of ``file`` (as :func:`fill_file`) pending (:mod:`~hotline.tiers.pending_rows`): nothing is
    written, every read draws a row's initial record until a write gives it another, and the file's header says
    so (:meth:`~hotline.tiers.disk_file.RowFile.open` refuses it). ``hot``: as :func:`fill_file`, drawn."""
    from hotline import _io
    from hotline.tiers.pending_rows import PendingRows
    from hotline.tiers.store_files import manifest_path, read_manifest

    file.pending = PendingRows(file.order, layout.table_sizes, dim, file.floats - dim, seed, rank, world_size)
    manifest = read_manifest(file.path)
    if manifest is not None:
        _io.write_json(manifest_path(file.path), {**manifest, "initial": "lazy"})
    if file.cache_rows and getattr(file, "_cache_loaded", True):
        _cache_from_file(file)
    return None if hot is None else file.pending.weights(hot)


def fill_file(file, layout: TableLayout, dim: int, seed: int, rank: int = 0, world_size: int = 1,
              hot: np.ndarray | None = None) -> np.ndarray | None:  # fmt: skip
    """Writes every row of ``file`` (a :class:`~hotline.tiers.disk_file.RowFile` of the fused rows
    ``rank::world_size`` of ``layout``, local ids ``fused // world_size``): its initial weights and zero state.
    ``hot``: fused ids (of any rank) whose initial weights are returned, [len(hot), dim] in that order (the hot
    tier's, from the same draws); None returns None."""
    N, r, S = int(world_size), int(rank), file.floats - dim
    hot_w = None
    if hot is not None:
        hot = np.asarray(hot, np.int64)
        hot_w = np.empty((hot.shape[0], dim), np.float32)
        by_id = np.argsort(hot, kind="stable")
        hot_sorted = hot[by_id]
    fill = _streamed(file)
    threads = fill_threads()
    blocks = _blocks(layout, dim)
    try:
        with ThreadPoolExecutor(threads, thread_name_prefix="hotline-fill-draw") as pool:
            ahead: deque = deque()

            def submit_next() -> None:
                nxt = next(blocks, None)
                if nxt is not None:
                    t, lo, n = nxt
                    draw = pool.submit(initial_block, layout.table_sizes[t], dim, seed, t, lo, n, S)
                    ahead.append((int(layout.offsets[t]) + lo, n, draw))

            for _ in range(2 * threads + 1):
                submit_next()
            while ahead:
                g0, n, draw = ahead.popleft()  # the block's first fused row, its rows
                rec = draw.result()
                submit_next()
                if hot is not None:
                    a, b = np.searchsorted(hot_sorted, [g0, g0 + n])
                    hot_w[by_id[a:b]] = rec[hot_sorted[a:b] - g0, :dim]
                first = g0 + (r - g0) % N  # the block's first row of this rank
                if first >= g0 + n:
                    continue
                mine = rec if N == 1 else np.ascontiguousarray(rec[first - g0 :: N])
                if fill is not None:
                    fill.take(first // N, mine)
                else:
                    file.put_rows(np.arange(first // N, first // N + mine.shape[0]), mine)
    except BaseException:
        if fill is not None:  # the error as it is, not a run left short
            fill.discard()
        raise
    if fill is not None:
        fill.close()
        file.bytes_written += fill.written
    if fill is not None and file.cache_rows and getattr(file, "_cache_loaded", True):
        _cache_from_file(file)
    return hot_w


def _cache_from_file(file) -> None:
    """A DRAM tier held from the store's making (authoritative for its rows) takes its rows from the file the
    streamed fill wrote."""
    chunk = max(1, (64 << 20) // file.record)
    for lo in range(0, file.cache_rows, chunk):
        n = min(chunk, file.cache_rows - lo)
        file.cache[lo : lo + n] = records_at(file, lo, n)
