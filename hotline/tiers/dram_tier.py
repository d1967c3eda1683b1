"""The DRAM tier of a :class:`~hotline.tiers.disk_file.RowFile`: the head of the file (file positions
``[0, cache_rows)``, the most popular rows) held in host memory, authoritative for its rows.

The tier takes its memory and reads its rows at the first step's access (:func:`load`), in chunks through the page
cache, each chunk's cached pages dropped after it (a memory limit holds the tier, not a second copy of it). A
lazily initialized file (:mod:`hotline.tiers.pending_rows`) keeps its pending bits over the tier's positions too:
the load reads only the span of the written records (none where a chunk is all pending), a tier slot whose
position is pending holds no value and is drawn when read (:func:`take`), and a write into the tier clears its
bits (:func:`put`). :func:`flush` writes the tier back, the pending slots left pending (a chunk of them alone
is not written). Tier reads are exact: the eager file's values bit for bit (``tests/test_lazy_init.py``).
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hotline._malloc import huge_full
from hotline.tiers import pending_rows as lazy

CHUNK_BYTES = 64 << 20  # bulk (sequential) reads and writes: export, load, flush


def load(file) -> None:
    """Takes the tier's memory and reads its written rows from the file (once: the first step's access)."""
    if file._cache_loaded:
        return
    with file._cache_lock:
        if file._cache_loaded:
            return
        pending = file.pending
        # zeros: a pending slot's bytes, written back as the file's never-written records are (zero pages
        # untouched until a write takes them)
        # huge pages, taken now: not a fault a row in the steps' write-backs (a budget the preflight counts whole)
        cache = huge_full((file.cache_rows, file.floats), 0, np.float32)
        chunk = max(1, CHUNK_BYTES // file.record)
        for lo in range(0, file.cache_rows, chunk):
            n = min(chunk, file.cache_rows - lo)
            if pending is None:
                cache[lo : lo + n] = file._read_positions(lo, n)
            else:  # pending slots are drawn when read, not now
                held = np.flatnonzero(~pending.range_mask(lo, lo + n))
                if held.shape[0]:
                    a, b = int(held[0]), int(held[-1]) + 1
                    cache[lo + a : lo + b] = file._read_positions(lo + a, b - a)
            with contextlib.suppress(OSError):
                os.posix_fadvise(file._bulk, lo * file.record, n * file.record, os.POSIX_FADV_DONTNEED)
        file.cache = cache
        file._cache_loaded = True


def take(file, out: np.ndarray, idx: np.ndarray, pos: np.ndarray, rows: np.ndarray) -> None:
    """``out[idx]``: the records of the tier's file positions ``pos`` (rows ``rows[idx]``), pending ones drawn.
    The bits are read before the slots (:func:`put` writes a slot before it clears its bit), so a write under
    way meanwhile gives the value before it or after it, never an unwritten slot's bytes."""
    pending = None if file.pending is None or not pos.shape[0] else file.pending.mask(pos)
    out[idx] = file.cache[pos]
    if pending is not None and pending.any():
        drawn = idx[pending]
        out[drawn] = file.pending.records(rows[drawn])


def put(file, pos: np.ndarray, records: np.ndarray) -> None:
    """Stores ``records`` at the tier's file positions ``pos``: they hold their rows' values now."""
    file.cache[pos] = records
    lazy.written(file.pending, pos)


def records(file, lo: int, n: int) -> np.ndarray:
    """Records [n, floats] at file positions ``lo...`` as their rows' values: the tier's from memory (its
    pending slots drawn), the rest from the file (:func:`~hotline.tiers.pending_rows.records_at`)."""
    c = max(0, min(file._cached() - lo, n))
    if not c:
        return lazy.records_at(file, lo, n)
    out = np.empty((n, file.floats), np.float32)
    out[:c] = file.cache[lo : lo + c]
    if file.pending is not None:
        file.pending.substitute(lo, out[:c])
    if c < n:
        out[c:] = lazy.records_at(file, lo + c, n - c)
    return out


def chunks_ahead(file, chunk: int):
    """Yields ``(lo, n, records)`` over the whole file in order, chunks of ``chunk`` positions (:func:`records`),
    the next chunk read and drawn on a thread while the caller takes this one (a checkpoint writes it): the
    file read and the draws of its pending rows (their kernel releases the GIL) overlap the caller's writes.
    Two chunks are held at a time."""
    spans = ((lo, min(chunk, file.num_rows - lo)) for lo in range(0, file.num_rows, chunk))
    with ThreadPoolExecutor(1, thread_name_prefix="hotline-rows-ahead") as pool:
        nxt = next(spans, None)
        job = None if nxt is None else pool.submit(records, file, *nxt)
        while job is not None:
            lo, n = nxt
            recs = job.result()
            nxt = next(spans, None)
            job = None if nxt is None else pool.submit(records, file, *nxt)
            yield lo, n, recs


def flush(file) -> None:
    """Writes the tier to the file in chunks, each made durable and dropped from the page cache after it (a
    memory limit must not fill with the tier's dirty pages); pending slots stay pending."""
    chunk = max(1, CHUNK_BYTES // file.record)
    for lo in range(0, file._cached(), chunk):
        n = min(chunk, file.cache_rows - lo)
        if file.pending is not None:
            held = np.flatnonzero(~file.pending.range_mask(lo, lo + n))
            if held.shape[0]:  # the span of the written slots, their bits as they are
                a, b = int(held[0]), int(held[-1]) + 1
                file._write_positions(lo + a, file.cache[lo + a : lo + b], clear=False)
        else:
            file._write_positions(lo, file.cache[lo : lo + n])
        file.drop_page_cache()
