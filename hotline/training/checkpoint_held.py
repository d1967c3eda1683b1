"""The records a full rows file of a disk-store checkpoint holds (:mod:`hotline.training.checkpoint_rows`):
the store's positions not pending (lazy initialization, :mod:`hotline.tiers.pending_rows`), read a chunk at a
time on a thread a chunk ahead of the writer; the pending ones are named by the file's bitmap, not drawn.

A chunk's held records come from the DRAM tier's memory, from their pages where they are few and scattered
(the store's I/O threads), else from one ``O_DIRECT`` read of their span (no page cache). Loaded into a lazily
initialized store that draws as the file's header names (:func:`loads_lazily`), the file's bitmap becomes the
store's pending bits and only its records are written (:func:`put_held`; a delta's over its base's:
:func:`overlay_held`): a resume's work is the rows written, not the table. Tests:
``tests/test_checkpoint_pending.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hotline.kernels.initial_rows import jump_tables
from hotline.tiers.disk_pages import PAGE, aligned_bytes, get_records, pages_of, span_io
from hotline.tiers.written_rows import mark_written
from hotline.training import checkpoint_delta


def pending_of(host, seed: int | None):
    """The store's rows never written (its :class:`~hotline.tiers.pending_rows.PendingRows`) when a rows file
    can name them by their bits alone: ``seed`` is the one their initial records are drawn from. Else None
    (every record drawn into the file)."""
    pending = getattr(host.file, "pending", None)
    if pending is None or seed is None:
        return None
    start, inc, _, _ = jump_tables(int(seed), pending.table_rows.shape[0])
    same = np.array_equal(start, pending.jumps[0]) and np.array_equal(inc, pending.jumps[1])
    return pending if same else None


def loads_lazily(host, head: dict):
    """The store's pending rows when a full rows file of this format (header ``head``; a delta's: its base's) can
    be loaded into it by its bitmap (:func:`put_held`): the file names its rows never written, drawn as the store draws its own (the
    seed, tables, rank and ranks its header names: the writer's check, :func:`pending_of`). Else None (its
    records are drawn and written, every one)."""
    initial = head.get("initial")
    if not initial:
        return None
    pending = pending_of(host, initial.get("seed"))
    if pending is None or (pending.rank, pending.world_size) != (
        initial.get("rank"),
        initial.get("world_size"),
    ):
        return None
    same = pending.num_rows == head.get("rows") and pending.dim == head.get("dim")
    return pending if same and np.array_equal(pending.table_rows, initial.get("table_rows")) else None


def overlay_held(base_chunks, path, head: dict, start: int) -> Iterator[tuple[np.ndarray, ...]]:
    """The base's lazy chunks ``(order, records held, never written)`` (``base_chunks``) with the records of the
    delta ``path`` (header ``head``, bitmap at byte ``start``) laid over them: a row it holds is held."""
    with checkpoint_delta.DeltaRecords(path, head, start) as delta:
        for order, got, drawn in base_chunks:
            mask, new = delta.next(order.shape[0])
            if new is not None:
                held = np.flatnonzero(~drawn | mask)
                rec = np.empty((held.shape[0], delta.floats), np.float32)
                rec[np.searchsorted(held, np.flatnonzero(~drawn))] = got
                rec[np.searchsorted(held, np.flatnonzero(mask))] = new
                got, drawn = rec, drawn & ~mask
            yield order, got, drawn


def put_held(file, pending, lo: int, drawn: np.ndarray, records: np.ndarray) -> None:
    """Loads a chunk of a rows file into ``file`` at positions ``lo .. lo + len(drawn) - 1`` (the store's order
    is the file's): ``drawn`` (bool) the rows never written, pending again (nothing written for them: a pending
    position's bytes are never read), ``records`` those of the others in order, written (runs of consecutive
    positions, each one sequential write; the DRAM tier's into it)."""
    if file.held is not None and file.held.count:
        file.held.sweep(file)  # the held writes before the load go to the file: none laid over it
    pending.put_range(lo, drawn)
    pos = np.flatnonzero(~drawn)
    if not pos.shape[0]:
        return
    k = int(np.searchsorted(pos, max(0, file._cached() - lo)))
    if k:
        file.cache[lo + pos[:k]] = records[:k]
    disk, R = pos[k:], file.record
    if disk.shape[0]:  # the bulk path of RowFile.put_positions (its bits set above), a system call a run
        first = np.r_[0, np.flatnonzero(np.diff(disk) != 1) + 1]
        data = memoryview(np.ascontiguousarray(records[k:], np.float32).reshape(-1).view(np.uint8))
        ends = [*first[1:].tolist(), disk.shape[0]]
        for a, b, at in zip(first.tolist(), ends, ((lo + disk[first]) * R).tolist()):
            file.bytes_written += span_io(file._bulk, file.path, True, data[a * R : b * R], at)
    mark_written(file, lo + pos)


def held_records(file, pending, lo: int, n: int) -> np.ndarray:
    """The records at file positions ``lo .. lo + n - 1`` that are not pending, in position order: the DRAM
    tier's from memory, the rest read (the span of them, or their pages where those are under half of it)."""
    held = np.flatnonzero(~pending.range_mask(lo, lo + n))
    out = np.empty((held.shape[0], file.floats), np.float32)
    k = int(np.searchsorted(held, max(0, file._cached() - lo)))
    whole = k and held[k - 1] - held[0] == k - 1  # a run of positions: a slice
    out[:k] = file.cache[lo + held[0] : lo + held[0] + k] if whole else file.cache[lo + held[:k]]
    rest = held[k:]
    if rest.shape[0]:
        a, b = int(rest[0]), int(rest[-1]) + 1
        pages, offsets = pages_of(lo + rest, file.record) if 4 * rest.shape[0] < b - a else (rest, None)
        if 2 * pages.shape[0] * PAGE < (b - a) * file.record:  # sparse: their pages alone
            buffer = aligned_bytes(pages.shape[0] * PAGE)
            file._io(False, pages, buffer)
            out[k:] = get_records(buffer, offsets, file.record).view(np.float32)
        else:
            span = _read_span(file, lo + a, b - a)
            out[k:] = span if b - a == rest.shape[0] else span[rest - a]
    return out


def _read_span(file, start: int, count: int) -> np.ndarray:
    """Records [count, floats] at file positions ``start...`` of the store's file, read in one ``O_DIRECT`` read
    (no page cache, no copy through it), or buffered where the filesystem refuses it; the store's held writes
    laid over them (:mod:`hotline.tiers.held_rows`: they are the rows' values until a sweep)."""
    held = getattr(file, "held", None)
    if held is None:
        return _span(file, start, count)
    out: list = [None]
    held.read(lambda: out.__setitem__(0, _span(file, start, count)), lambda: held.over_range(start, out[0]))
    return out[0]


def _span(file, start: int, count: int) -> np.ndarray:
    lo, hi = start * file.record, (start + count) * file.record
    a = lo // PAGE * PAGE
    buf = aligned_bytes(-(-hi // PAGE) * PAGE - a)
    try:
        fd = os.open(file.path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    except (OSError, AttributeError):  # tmpfs and a few others, or no O_DIRECT
        return file._read_positions(start, count)
    try:
        got, view = 0, memoryview(buf)
        while got < buf.shape[0] and (n := os.preadv(fd, [view[got:]], a + got)) > 0:
            got += n
    finally:
        os.close(fd)
    if got < hi - a:
        raise OSError(f"cold store {file.path} ends at byte {a + got}, before its record {start + count - 1}")
    return buf[lo - a : hi - a].view(np.float32).reshape(count, file.floats)


def ahead(fn, items: Iterator) -> Iterator:
    """``fn(item)`` of each of ``items`` in turn, the next computed on a thread while the caller takes this one."""
    with ThreadPoolExecutor(1, thread_name_prefix="hotline-rows-ahead") as pool:
        nxt = next(items, None)
        job = None if nxt is None else pool.submit(fn, nxt)
        while job is not None:
            out = job.result()
            nxt = next(items, None)
            job = None if nxt is None else pool.submit(fn, nxt)
            yield out
