"""The 4 KiB pages of a :class:`~hotline.tiers.disk_file.RowFile`: which pages hold which packed records, runs
of consecutive pages (one system call each), page-aligned buffers (O_DIRECT's rule), records read from and
written into a buffer of pages, runs read or written on the I/O threads, the :class:`PageSet` a fetch read
(reused by its write), each row's place in the file (:func:`positions_of`), and the file's row order as every pass
reads it (:class:`OrderFile`)."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import threading
import weakref
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from hotline.kernels.page_io import io_runs
from hotline.tiers.store_files import PAGE

MAX_RUN_PAGES = 64
"""The longest read or write one system call makes (256 KiB): longer runs are split across the I/O threads."""


def pages_per_record(record_bytes: int) -> float:
    """4 KiB pages one record of ``record_bytes`` spans, on average over the file's packed records (a record
    straddles a page boundary where it falls across one): the pages a row read alone costs."""
    if record_bytes <= 0:
        raise ValueError(f"record_bytes must be positive, got {record_bytes}")
    n = PAGE // math.gcd(int(record_bytes), PAGE)  # records until their offsets in a page repeat
    start = np.arange(n, dtype=np.int64) * int(record_bytes)
    return float(np.mean((start + record_bytes - 1) // PAGE - start // PAGE + 1))


def aligned_bytes(n: int) -> np.ndarray:
    """A uint8 array of ``n`` bytes whose address is a multiple of 4096 (O_DIRECT's rule), from an
    over-allocated buffer."""
    raw = np.empty(n + PAGE, np.uint8)
    off = (-raw.ctypes.data) % PAGE
    return raw[off : off + n]


def pages_of(pos: np.ndarray, record: int) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct pages that hold the ``record``-byte records at file positions ``pos``, and each
    record's offset in a buffer of those pages."""
    start = pos * record
    pages = np.unique(spanned(start, record))
    offsets = np.searchsorted(pages, start // PAGE) * PAGE + start % PAGE
    return pages, offsets


def spanned(start: np.ndarray, record: int) -> np.ndarray:
    """Every page (of the file, or of a page set's buffer) that the ``record``-byte records starting at bytes
    ``start`` touch: one each, or two where a record straddles a page boundary (more for huge rows); repeats
    kept."""
    first, last = start // PAGE, (start + record - 1) // PAGE
    spans = last - first + 1
    if spans.max(initial=1) == 1:
        return first
    return np.repeat(first, spans) + _ranges(spans)


def runs(pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs of consecutive pages (at most MAX_RUN_PAGES each): first index into ``pages`` and length."""
    if not pages.shape[0]:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    breaks = np.flatnonzero(np.diff(pages) != 1) + 1
    starts = np.concatenate([[0], breaks])
    lengths = np.diff(np.concatenate([starts, [pages.shape[0]]]))
    if lengths.max() > MAX_RUN_PAGES:
        pieces = -(-lengths // MAX_RUN_PAGES)
        sub = _ranges(pieces)
        starts = np.repeat(starts, pieces) + sub * MAX_RUN_PAGES
        lengths = np.minimum(np.repeat(lengths, pieces) - sub * MAX_RUN_PAGES, MAX_RUN_PAGES)
    return starts, lengths


def _ranges(counts: np.ndarray) -> np.ndarray:
    """0..c-1 for each c of ``counts``, concatenated."""
    ends = np.cumsum(counts)
    return np.arange(int(ends[-1]) if ends.shape[0] else 0) - np.repeat(ends - counts, counts)


def get_records(buffer: np.ndarray, offsets: np.ndarray, record: int) -> np.ndarray:
    """uint8 [U, record]: the records at byte ``offsets`` of ``buffer`` (a copy; through a view of every
    ``record``-byte window of the buffer, so no index of each byte is built: it holds the records alone)."""
    if not offsets.shape[0]:
        return np.empty((0, record), np.uint8)
    return sliding_window_view(buffer, record)[offsets]


def put_records(buffer: np.ndarray, offsets: np.ndarray, records: np.ndarray) -> None:
    """Writes float32 records [U, floats] at byte ``offsets`` of ``buffer`` (records do not overlap; as
    :func:`get_records`, no index of each byte)."""
    raw = np.ascontiguousarray(records).view(np.uint8).reshape(records.shape[0], -1)
    if raw.shape[0]:
        sliding_window_view(buffer, raw.shape[1], writeable=True)[offsets] = raw


def named_error(e: OSError, path: Path, what: str) -> OSError:
    """``e`` as one line naming the file and what was being done."""
    return OSError(e.errno, f"{e.strerror or e}: cold store {path} ({what})")


def transfer(
    fd: int,
    path: Path,
    pool: Executor,
    io_depth: int,
    write: bool,
    pages: np.ndarray,
    buffer: np.ndarray,
    which: np.ndarray | None = None,
) -> tuple[int, int]:
    """Reads (or writes) ``pages`` of the file open as ``fd`` into (from) ``buffer`` in runs, spread over up to
    ``io_depth`` threads of ``pool``; returns the system calls made and the bytes moved. ``which``: only these
    indices of ``pages``."""
    idx = np.arange(pages.shape[0]) if which is None else which
    starts, lengths = runs(pages[idx])
    if not starts.shape[0]:
        return 0, 0
    mem = memoryview(buffer)
    at = idx[starts] * PAGE  # buffer offsets (pages of a run are consecutive in the buffer too)
    off = pages[idx[starts]] * PAGE
    size = lengths * PAGE
    call = os.pwritev if write else os.preadv

    def run(lo: int, hi: int) -> None:
        failed = io_runs(write, fd, buffer, at[lo:hi], off[lo:hi], size[lo:hi])  # no GIL between requests
        if failed < 0:
            return
        lo += failed  # from the request that fell short: again through os, which names its error
        for a, o, n in zip(at[lo:hi].tolist(), off[lo:hi].tolist(), size[lo:hi].tolist()):
            try:
                done = call(fd, [mem[a : a + n]], o)
            except OSError as e:
                raise named_error(
                    e, path, f"{'write' if write else 'read'} of {n} bytes at byte {o}"
                ) from None
            if done != n:
                raise OSError(
                    errno.EIO, f"short {'write' if write else 'read'}: cold store {path} at byte {o}"
                )

    n = starts.shape[0]
    k = min(io_depth, n)
    if k == 1:
        run(0, n)
    else:
        bounds = np.linspace(0, n, k + 1).astype(np.int64)
        futures = [pool.submit(run, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        for f in futures:
            f.result()
    return n, int(size.sum())


def span_io(fd: int, path: Path, write: bool, data: np.ndarray, at: int, chunk: int = 64 << 20) -> int:
    """Writes (or reads into) the bytes ``data`` (uint8) at byte ``at`` of the file open as ``fd``, ``chunk`` bytes
    a system call (bulk, sequential I/O); returns the bytes moved."""
    view, moved = memoryview(data), 0
    while view.nbytes:
        try:
            n = os.pwrite(fd, view[:chunk], at) if write else os.preadv(fd, [view[:chunk]], at)
        except OSError as e:
            raise named_error(e, path, f"{'write' if write else 'read'} at byte {at}") from None
        if n <= 0:
            raise OSError(errno.EIO, f"short {'write' if write else 'read'}: cold store {path} at byte {at}")
        view, at, moved = view[n:], at + n, moved + n
    return moved


@dataclass(eq=False)  # compared and hashed by identity (the write's set of page sets still to write)
class PageSet:
    """The pages a set of rows lives in, read into one aligned buffer (a fetch's, reused by its write)."""

    pages: np.ndarray
    """int64 [P] sorted distinct page numbers."""
    buffer: np.ndarray
    """uint8 [P * 4096] their bytes, page i of ``pages`` at ``i * 4096``."""
    offsets: np.ndarray
    """int64 [U] where each record of the rows on disk starts in ``buffer`` (in the order of ``on_disk``)."""
    read_at: np.ndarray
    """int64 [P] for each page, the writes completed before it was read (a page a later write changed is read
    again before a write); -1 for a page not read (only skipped rows need it: the write reads it first)."""
    on_disk: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """int64 [U] the indices, in the rows asked for, of the rows on disk (the rest are in the DRAM tier)."""
    reads: int = 0
    """System calls the read took."""
    disk_rows: int = 0
    """Rows on disk (the rest came from the DRAM tier), skipped ones included."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """Held while the pages' bytes and ``read_at`` change (a refresh on one thread, a write on another)."""
    drawn_rows: int = 0
    """Rows on disk whose initial records were drawn, not read (never written: :mod:`~hotline.tiers.pending_rows`)."""
    blank_pages: int = 0
    """Pages not read as only such rows' records lie on them (their ``read_at`` is the fetch's, their bytes zero)."""

    @property
    def pages_read(self) -> int:
        """Pages the fetch read (the rest only skipped rows need)."""
        return int((self.read_at >= 0).sum()) - self.blank_pages

    def records_of(self, idx: np.ndarray) -> np.ndarray:
        """For each index ``idx`` into the rows asked for, its record's place in ``offsets`` (-1: in the DRAM
        tier)."""
        slot = np.full(max(int(idx.max(initial=-1)), int(self.on_disk.max(initial=-1))) + 1, -1, np.int64)
        slot[self.on_disk] = np.arange(self.on_disk.shape[0])
        return slot[idx]


class RowPositions:
    """Each row's file position (``positions[rows]``), held in memory that follows the rows outside some runs: for
    an order made of ascending runs of ids whose id ranges do not overlap, and any rows between them
    (:func:`~hotline.tiers.disk_store.popularity_order`'s: the counted rows, the never-counted rows in id order
    or table by table, the hot rows), the rows outside the runs are kept sorted with their positions (two arrays
    of that many rows); a row of run k (first id ``lo``, at file position ``start``) is at ``start + row - lo -
    (kept rows in [lo, row))``, as the run holds exactly the other rows of its id range, in id order.
    :func:`positions_of` chooses it where it is smaller than one position per row."""

    def __init__(self, order, runs: list[tuple[int, int]], chunk: int = 1 << 22):
        n = order.shape[0]
        self.shape, self.ndim = (n,), 1
        self.dtype = np.dtype(np.int32 if n < 1 << 31 else np.int64)
        runs = sorted(runs, key=lambda ab: int(order[ab[0]]))
        bounds = [0] + [x for ab in sorted(runs) for x in ab] + [n]
        kept = np.concatenate([np.asarray(order[a:b]) for a, b in zip(bounds[::2], bounds[1::2])])
        at = np.concatenate([np.arange(a, b) for a, b in zip(bounds[::2], bounds[1::2])]).astype(self.dtype)
        by_row = np.argsort(kept, kind="stable")
        self.kept_rows, self.kept_at = kept[by_row].astype(self.dtype), at[by_row]
        """The rows outside the runs, ascending, and their positions."""
        self.run_lo = np.array([int(order[a]) for a, _ in runs], np.int64)
        self.run_start = np.array([a for a, _ in runs], np.int64)
        self._kept_below = np.searchsorted(self.kept_rows, self.run_lo)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows):
        r = np.asarray(rows)
        idx = np.searchsorted(self.kept_rows, r)
        k = np.maximum(np.searchsorted(self.run_lo, r, side="right") - 1, 0)
        out = (self.run_start[k] + r - self.run_lo[k] - (idx - self._kept_below[k])).astype(self.dtype)
        if self.kept_rows.shape[0]:
            near = np.minimum(idx, self.kept_rows.shape[0] - 1)
            hit = self.kept_rows[near] == r
            out = np.where(hit, self.kept_at[near], out)
        return out if out.ndim else out.dtype.type(out)


def ascending_runs(
    order, min_len: int = 1, chunk: int = 1 << 22, max_step: int | None = None
) -> list[tuple[int, int]]:
    """``(start, stop)`` of every maximal run of strictly ascending values in ``order`` at least ``min_len`` long
    (read in chunks: it may be a memory map); ``max_step``: a run also ends where a value exceeds the one before
    by more (two blocks of ids that meet in ascending order stay two runs)."""
    n = order.shape[0]
    out, start, prev = [], 0, None
    step = max_step if max_step is not None else 1 << 62
    for lo in range(0, n, chunk):
        c = np.asarray(order[lo : lo + chunk]).astype(np.int64)
        d = np.diff(c)
        breaks = np.flatnonzero((d <= 0) | (d > step)) + 1 + lo
        if prev is not None and (c[0] <= prev or c[0] - prev > step):
            breaks = np.concatenate([[lo], breaks])
        if breaks.shape[0]:
            starts = np.concatenate([[start], breaks[:-1]])
            long = (breaks - starts) >= min_len
            out += list(zip(starts[long].tolist(), breaks[long].tolist()))
            start = int(breaks[-1])
        prev = int(c[-1])
    if n - start >= max(1, min_len):
        out.append((start, n))
    return out


def longest_ascending_run(order, chunk: int = 1 << 22) -> tuple[int, int]:
    """``(start, stop)`` of the longest run of strictly ascending values in ``order`` (read in chunks: it may be a
    memory map); the first such run where several are as long."""
    n = order.shape[0]
    best, start, prev = (0, min(n, 1)), 0, None
    for lo in range(0, n, chunk):
        c = np.asarray(order[lo : lo + chunk]).astype(np.int64)
        breaks = np.flatnonzero(c[1:] <= c[:-1]) + 1 + lo
        if prev is not None and c[0] <= prev:
            breaks = np.concatenate([[lo], breaks])
        if breaks.shape[0]:
            starts = np.concatenate([[start], breaks[:-1]])
            lengths = breaks - starts
            k = int(np.argmax(lengths))
            if lengths[k] > best[1] - best[0]:
                best = (int(starts[k]), int(breaks[k]))
            start = int(breaks[-1])
        prev = int(c[-1])
    if n - start > best[1] - best[0]:
        best = (start, n)
    return best


def positions_of(order, chunk: int = 1 << 22):
    """Each row's place in ``order`` (a permutation, read in chunks: it may be a memory map), indexed as
    ``positions[rows]``: a :class:`~hotline.tiers.disk_pages.RowPositions` where the order is mostly one
    ascending run (the disk store's: memory for the rows outside it only), else an array in the narrowest
    integer that holds it (int32 below 2**31 rows)."""
    n = order.shape[0]
    runs, taken = [], []  # the longest runs first, each kept where its id range overlaps none taken before
    least = max(
        64, n >> 12
    )  # a run this long at least, its ids no further apart (blocks that meet: two runs)
    for a, b in sorted(ascending_runs(order, least, chunk, least), key=lambda ab: ab[0] - ab[1]):
        lo, hi = int(order[a]), int(order[b - 1])
        if all(hi < x or lo > y for x, y in taken):
            runs.append((a, b))
            taken.append((lo, hi))
    if runs and 4 * (n - sum(b - a for a, b in runs)) < n:  # the rows outside the runs: under 2 bytes a row
        return RowPositions(order, runs, chunk)
    dtype = np.int32 if n < 1 << 31 else np.int64
    out = np.empty(n, dtype)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        out[np.asarray(order[lo:hi])] = np.arange(lo, hi, dtype=dtype)
    return out


ORDER_CHUNK = 1 << 22
"""Entries of a file's row order one read of :class:`OrderFile` takes at most (16 MiB of int32)."""


class OrderFile:
    """A row file's order (``FILE.order.npy``: the row at each file position) read from disk, never mapped:
    ``order[a:b]`` (any step), ``order[i]`` and ``order[positions]`` (int arrays, any order) read what they
    ask for with ``pread``, :data:`ORDER_CHUNK` entries at most at a time, and drop it from the page cache
    after, so a pass over the order (the fill, a load, an export, a checkpoint) holds a chunk of it whatever
    the row count (a memory map would keep every page it read in the resident set:
    ``tests/test_order_file.py``). ``numpy.asarray(order)`` reads it whole."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            major, _ = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            self.offset = f.tell()
        if len(shape) != 1 or not np.issubdtype(dtype, np.integer) or not dtype.isnative:
            raise ValueError(
                f"{self.path} holds {dtype} {shape}, not a row order (native integers, one axis)"
            )
        self.shape, self.dtype, self.ndim = (int(shape[0]),), np.dtype(dtype), 1
        size = os.stat(self.path).st_size
        if size < self.offset + self.shape[0] * self.dtype.itemsize:
            raise ValueError(f"{self.path} ends at byte {size}: it is cut short")
        self._fd = os.open(self.path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def size(self) -> int:
        return self.shape[0]

    def _read(self, lo: int, hi: int) -> np.ndarray:
        """Entries ``[lo, hi)`` (in range), read in chunks and dropped from the page cache after."""
        out = np.empty(max(0, hi - lo), self.dtype)
        view, at = memoryview(out.view(np.uint8)), self.offset + lo * self.dtype.itemsize
        start, step = at, ORDER_CHUNK * self.dtype.itemsize
        while view.nbytes:
            n = os.preadv(self._fd, [view[:step]], at)
            if n <= 0:
                raise OSError(errno.EIO, f"short read: {self.path} ends at byte {at}")
            view, at = view[n:], at + n
        with contextlib.suppress(OSError):
            os.posix_fadvise(self._fd, start, at - start, os.POSIX_FADV_DONTNEED)
        return out

    def __getitem__(self, key):
        n = self.shape[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step == 1:
                return self._read(start, max(start, stop))
            key = np.arange(start, stop, step)
        elif np.ndim(key) == 0:
            i = int(key)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for a row order of {n} rows")
            return self._read(i % n, i % n + 1)[0]
        pos = np.asarray(key)
        if pos.dtype == bool:
            pos = np.flatnonzero(pos)
        shape, pos = pos.shape, pos.astype(np.int64).reshape(-1)
        if pos.shape[0] and (pos.min() < -n or pos.max() >= n):
            raise IndexError(f"an index is out of bounds for a row order of {n} rows")
        pos = pos % n if n else pos
        out = np.empty(pos.shape[0], self.dtype)
        by = np.argsort(pos, kind="stable")
        sorted_pos = pos[by]
        a = 0
        while a < sorted_pos.shape[0]:  # windows of at most a chunk of entries, each read once
            lo = int(sorted_pos[a])
            b = int(np.searchsorted(sorted_pos, lo + ORDER_CHUNK, "left"))
            window = self._read(lo, int(sorted_pos[b - 1]) + 1)
            out[by[a:b]] = window[sorted_pos[a:b] - lo]
            a = b
        return out.reshape(shape)

    def __array__(self, dtype=None, copy=None):
        whole = self._read(0, self.shape[0])
        return whole if dtype is None else whole.astype(dtype, copy=False)


def order_chunks(order, chunk: int = ORDER_CHUNK):
    """The entries of ``order`` (an :class:`OrderFile` or an array) in order, ``chunk`` at a time."""
    for lo in range(0, order.shape[0], chunk):
        yield np.asarray(order[lo : lo + chunk])
