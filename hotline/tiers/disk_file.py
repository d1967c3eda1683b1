"""Embedding rows and their optimizer state in one file on local disk. A :class:`RowFile` stores ``num_rows``
records of ``dim`` weights and ``state`` optimizer floats (float32, ``4 * (dim + state)`` bytes each, packed;
a record may straddle pages) in one file, in a popularity order:
record ``i`` of the file holds row ``order[i]`` (rows counted most often first, so the popular-but-not-hot
rows share pages), and ``positions[row]`` is where a row stands. A record is the row's weights followed by its
whole optimizer state as the optimizer lays it out (row-wise Adagrad: one float; Adagrad: D accumulators;
Adam: D first moments, D second moments, the row's step count). The order is kept beside the file
(``FILE.order.npy``) with a manifest (``FILE.json``, the file's header) that records its record: rows, dim,
the optimizer and its state floats, the record's bytes, and the order file's sha256. :meth:`RowFile.open`
takes an existing file as it stands and refuses, with one line, one made for another record (another
optimizer's state, another dim).

The file ends with one more page that names it (:mod:`hotline.tiers.store_files`: the three files as outputs
under the one output policy, each replaced only when provably the store's own by its content).
Reads and writes of a step's rows go through pages (4 KiB): the pages that hold the rows are read, rows of
one step that share a page are fetched by one read, neighbouring pages form one read (up to ``MAX_RUN_PAGES``),
and the reads are spread over ``io_depth`` I/O threads that call ``os.preadv`` (the GIL is released during
the system call). The file is opened with ``O_DIRECT`` where the filesystem allows it, so the OS page cache is
bypassed (``mode`` says which: ``direct`` or ``buffered`` with the reason); the buffers are aligned to 4096
bytes for it. A step's writes are held in memory and swept to the file in file order (``held_bytes``:
:mod:`~hotline.tiers.held_rows`), or rewrite whole pages in place (read-modify-write), from one thread at a
time. Each page carries the number of the write that last changed it, each fetched page the write its bytes
are from; a look-ahead fetch's pages are tracked until its write, every write copying the bytes of the pages
it changed into them, so a step reads each of its pages from disk once (see :meth:`RowFile.read_rows`).

``cache_bytes`` keeps the head of the file (the most popular rows, by the order) in host memory: a DRAM tier
between the hot rows and the disk, authoritative for its rows (written back by :meth:`flush`), taken and read
at the first step's access, not when the store is made (start-up's temporaries are freed by then)
(:mod:`hotline.tiers.dram_tier`). Rows never written are drawn when read, the tier's too (lazy initialization,
:mod:`hotline.tiers.pending_rows`). An I/O error or a full disk raises ``OSError`` naming the file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from hotline import _io
from hotline.tiers import dram_tier
from hotline.tiers import pending_rows as lazy
from hotline.tiers.direct_out import npy_header, write_direct
from hotline.tiers.disk_pages import (  # noqa: F401 - pages_per_record, positions_of re-exported
    OrderFile,
    PageSet,
    aligned_bytes,
    get_records,
    named_error,
    pages_of,
    pages_per_record,
    positions_of,
    put_records,
    runs,
    span_io,
    spanned,
    transfer,
)
from hotline.tiers.held_rows import HeldRows
from hotline.tiers.store_files import (
    FORMAT,
    PAGE,
    _tail,
    check_cold_path,
    check_record,
    is_own_rows,
    manifest_path,
    order_path,
    read_manifest,
)
from hotline.tiers.written_rows import mark_written, mark_written_range


class RowFile:
    """Records of rows in one file, in a popularity order (module docstring)."""

    per_row = ("_page_stamp",)  # 4 bytes a page: under a byte a row, counted all the same

    def __init__(
        self,
        path: str | os.PathLike,
        num_rows: int,
        dim: int,
        state_floats: int,
        order: np.ndarray | None = None,
        io_depth: int = 32,
        direct: bool = True,
        cache_bytes: int = 0,
        optimizer: str = "",
        create: bool = True,
        force: bool = False,
        held_bytes: int = 0,
    ):
        """``optimizer`` names the state's layout in the header; ``create=False`` (:meth:`open`) keeps the file
        as it stands instead of making it again; ``force`` (``--force``) replaces files at the store's paths
        that are not provably its own (:func:`check_cold_path`); ``held_bytes`` (``--cold-write-buffer``): the
        writes held in memory and swept to the file in order (:mod:`~hotline.tiers.held_rows`; 0: in place)."""
        if io_depth < 1:
            raise ValueError(f"--cold-io-depth must be >= 1, got {io_depth}")
        if cache_bytes < 0:
            raise ValueError(f"--cold-cache must be >= 0, got {cache_bytes}")
        self.path = check_cold_path(path, force) if create else Path(path)
        self.num_rows, self.dim, self.S = int(num_rows), int(dim), int(state_floats)
        self.optimizer = optimizer
        self.floats = self.dim + self.S
        self.record = 4 * self.floats
        wide = np.int32 if self.num_rows < 2**31 else np.int64
        self.order = np.arange(self.num_rows, dtype=wide) if order is None else order
        """int32 (int64 from 2**31 rows) [rows]: the row at each file position; read from its file on disk
        (``FILE.order.npy``, an :class:`OrderFile`) once the file is made, so it costs no host memory per row."""
        if not isinstance(self.order, OrderFile):
            self.order = np.asarray(self.order)
        if not np.issubdtype(self.order.dtype, np.integer):
            raise ValueError(f"the row order must hold integers, not {self.order.dtype}")
        if self.order.shape != (self.num_rows,):
            raise ValueError(f"the row order has {self.order.shape[0]} rows, the file {self.num_rows}")
        self.positions = positions_of(self.order)
        """Each row's file position, ``positions[rows]`` (:func:`positions_of`: no array of every row where the
        order is mostly one ascending run, as the disk store's is)."""
        self.num_pages = -(-self.num_rows * self.record // PAGE)
        self.size = self.num_pages * PAGE
        self.io_depth = int(io_depth)
        self._fd = self._bulk = -1
        if create:
            self._create(direct)
        else:
            self._attach(direct)
        self._page_stamp = np.zeros(self.num_pages, np.uint32)  # the write that last changed each page
        self._writes = 0  # writes completed (they complete in order: one writer at a time)
        self._write_lock = threading.Lock()
        # the tracked page sets (read_rows(track)): fetched, not yet written
        self._live: weakref.WeakSet[PageSet] = weakref.WeakSet()
        self._pool = ThreadPoolExecutor(self.io_depth, thread_name_prefix="hotline-disk-io")
        self.cache_rows = min(self.num_rows, int(cache_bytes) // self.record)
        """Rows of the DRAM tier: file positions [0, cache_rows)."""
        self.cache = np.zeros((0, self.floats), np.float32)
        """float32 [cache_rows, floats] once :meth:`_load_cache` has run (the first step's access), else empty."""
        self._cache_lock = threading.Lock()
        self._cache_loaded = not self.cache_rows
        self.bytes_read = self.bytes_written = 0
        self.pending: lazy.PendingRows | None = None  # rows not written yet, drawn when read
        held = HeldRows(self.num_rows, self.record, held_bytes) if held_bytes > 0 else None
        self.held = held if held is not None and held.capacity else None

    @classmethod
    def open(cls, path: str | os.PathLike, dim: int, state_floats: int, optimizer: str = "",
             io_depth: int = 32, direct: bool = True, cache_bytes: int = 0) -> RowFile:  # fmt: skip
        """The existing file Hotline made at ``path`` as it stands; refused in one line when its header records
        another record (optimizer state, dim) or the file is not the size its header says."""
        path = Path(path)
        manifest = read_manifest(path)
        if manifest is None or path.is_symlink() or not path.is_file():
            raise ValueError(
                f"cold store {path} is not a cold-row file Hotline made (no manifest of its own)"
            )
        check_record(path, manifest, int(dim), int(state_floats), optimizer)
        lazy.refuse_lazy(path, manifest)
        rows = manifest.get("rows")
        if not isinstance(rows, int) or rows < 0:
            raise ValueError(f"cold store {path}: its manifest gives no row count ({rows!r})")
        try:
            order = OrderFile(order_path(path))
        except (OSError, ValueError) as e:
            raise ValueError(
                f"cold store {path}: its row order {order_path(path).name} cannot be read: {e}"
            ) from None
        return cls(path, rows, dim, state_floats, order, io_depth, direct, cache_bytes,
                   optimizer, create=False)  # fmt: skip

    # -- the file ---------------------------------------------------------------------------------------
    def _lock(self, flags: int, what: str) -> None:
        """Opens the file (the bulk, buffered descriptor), locked against other runs."""
        path = self.path
        try:
            self._bulk = os.open(path, flags, 0o644)
        except OSError as e:
            raise named_error(e, path, what) from None
        try:
            fcntl.flock(self._bulk, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._bulk)
            self._bulk = -1
            raise ValueError(
                f"cold store {path} is in use by another Hotline run (choose another --cold-dir)"
            ) from None

    def _create(self, direct: bool) -> None:
        """Creates (or re-creates, if Hotline made it) the file at its full size, locked against other runs."""
        path = self.path
        self._lock(os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, "create")
        _, digest, _ = write_direct(order_path(path), [npy_header(self.order), self.order], direct)  # fmt: skip
        self.order = OrderFile(order_path(path))  # read in chunks (export, load): on disk
        _io.write_json(
            manifest_path(path),
            {"format": FORMAT, "rows": self.num_rows, "dim": self.dim, "optimizer": self.optimizer,
             "state_floats": self.S, "record_bytes": self.record, "order": order_path(path).name,
             "order_sha256": digest},
        )  # fmt: skip
        try:
            os.ftruncate(self._bulk, 0)
            os.posix_fallocate(self._bulk, 0, self.size + PAGE)  # a full disk is found now, not mid-run
            if os.pwrite(self._bulk, _tail(self.num_rows, self.record), self.size) != PAGE:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            os.close(self._bulk)
            self._bulk = -1
            raise named_error(e, path, f"reserving {self.size + PAGE} bytes") from None
        self._open_direct(direct)

    def _attach(self, direct: bool) -> None:
        """Opens the existing file as it stands (:meth:`open`), locked against other runs."""
        self._lock(os.O_RDWR, "open")
        size = os.fstat(self._bulk).st_size
        if size != self.size + PAGE:
            os.close(self._bulk)
            self._bulk = -1
            raise ValueError(
                f"cold store {self.path} is {size} bytes, its header says {self.size + PAGE} ({self.num_rows} "
                f"records of {self.record} bytes in 4 KiB pages, and its last page): truncated or not this "
                f"store's file"
            )
        if not is_own_rows(self.path):
            os.close(self._bulk)
            self._bulk = -1
            raise ValueError(
                f"cold store {self.path} does not end with the store's last page: not this store's file"
            )
        self._open_direct(direct)

    def _open_direct(self, direct: bool) -> None:
        """The descriptor of a step's page reads and writes: O_DIRECT where asked and allowed."""
        path = self.path
        self.mode = "buffered (O_DIRECT not asked for)"
        self._fd = self._bulk
        if direct:
            try:
                self._fd = os.open(path, os.O_RDWR | os.O_DIRECT)
                self.mode = "direct"
            except (OSError, AttributeError) as e:
                self.mode = f"buffered (O_DIRECT refused by the filesystem: {getattr(e, 'strerror', e)})"

    @property
    def direct(self) -> bool:
        return self.mode == "direct"

    def close(self) -> None:
        """Writes the DRAM cache to the file and closes it (the file and its side files stay)."""
        if self._bulk < 0:
            return
        try:
            if getattr(self, "cache_rows", 0) or getattr(getattr(self, "held", None), "count", 0):
                self.flush(sweep=self.pending is None)  # a lazy file is never opened again
        finally:
            if getattr(self, "_pool", None) is not None:
                self._pool.shutdown()
            if self._fd != self._bulk:
                os.close(self._fd)
            os.close(self._bulk)
            self._fd = self._bulk = -1

    def _cached(self) -> int:
        """Rows held in the DRAM tier now: ``cache_rows`` once it is loaded, 0 before (every row on disk)."""
        return self.cache_rows if self._cache_loaded else 0

    def _load_cache(self) -> None:
        """Takes the DRAM tier's memory and reads its rows (once, at the first step's access: :mod:`dram_tier`)."""
        dram_tier.load(self)

    def flush(self, sweep: bool = True) -> None:
        """Makes the file hold every row's current value (the held writes swept to it, the DRAM tier's rows
        written to it: :func:`dram_tier.flush`) and durable."""
        if sweep and self.held is not None:
            self.held.sweep(self)
        dram_tier.flush(self)
        try:
            os.fsync(self._bulk)
        except OSError as e:
            raise named_error(e, self.path, "fsync") from None

    def drop_page_cache(self) -> None:
        """Asks the kernel to drop the file's pages from the page cache (after bulk buffered I/O)."""
        with contextlib.suppress(OSError):
            os.fdatasync(self._bulk)
            os.posix_fadvise(self._bulk, 0, 0, os.POSIX_FADV_DONTNEED)

    # -- bulk, sequential (initial fill, export, load) --------------------------------------------------
    def _write_positions(self, start: int, records: np.ndarray, clear: bool = True) -> None:
        """Records for file positions ``start, start+1, ...`` (buffered, sequential); ``clear`` False: their
        pending bits stay as they are (the DRAM tier's flush, a sweep)."""
        if clear:
            lazy.written(self.pending, start, start + records.shape[0])
        data = np.ascontiguousarray(records, np.float32).reshape(-1).view(np.uint8)
        self.bytes_written += span_io(self._bulk, self.path, True, data, start * self.record)

    def _read_positions(self, start: int, count: int, held: bool = True) -> np.ndarray:
        """Records [count, floats] at file positions ``start...`` (buffered, sequential), the held writes laid
        over them (``held`` False: the file's bytes alone, a sweep's)."""
        out = np.empty((count, self.floats), np.float32)
        if held and self.held is not None:
            self.held.read(lambda: self._read_into(out, start), lambda: self.held.over_range(start, out))
        else:
            self._read_into(out, start)
        return out

    def _read_into(self, out: np.ndarray, start: int) -> None:
        span_io(self._bulk, self.path, False, out.reshape(-1).view(np.uint8), start * self.record)

    def put_rows(self, rows: np.ndarray, records: np.ndarray) -> None:
        """Records [U, floats] of ``rows`` (bulk, buffered: a run of consecutive file positions is one write;
        the initial fill, load)."""
        pos = self.positions[rows].astype(np.int64)
        order = np.argsort(pos, kind="stable")
        pos, records = pos[order], records[order]
        breaks = np.flatnonzero(np.diff(pos) != 1) + 1
        for lo, hi in zip([0, *breaks.tolist()], [*breaks.tolist(), pos.shape[0]]):
            if hi > lo:
                self.put_positions(int(pos[lo]), records[lo:hi])

    def put_positions(self, start: int, records: np.ndarray) -> None:
        """Records at file positions ``start...`` (those in the DRAM cache go there; held writes swept first)."""
        if self.held is not None and self.held.count:
            self.held.sweep(self)
        n_cached = max(0, min(self._cached() - start, records.shape[0]))
        if n_cached:
            self.cache[start : start + n_cached] = records[:n_cached]
            lazy.written(self.pending, start, start + n_cached)
        if n_cached < records.shape[0]:
            self._write_positions(start + n_cached, records[n_cached:])
        mark_written_range(self, start, start + records.shape[0])

    def read_all(self, chunk_rows: int | None = None, rows: bool = True):
        """Yields ``(rows, records)`` over the whole file in order (the DRAM cache's rows from memory);
        ``rows=False``: None for the rows (a pass over the records alone does not read the order)."""
        chunk = chunk_rows or max(1, dram_tier.CHUNK_BYTES // self.record)
        for lo, n, recs in dram_tier.chunks_ahead(self, chunk):  # the next chunk read and drawn meanwhile
            yield (self.order[lo : lo + n] if rows else None), recs
        self.drop_page_cache()

    # -- a step's rows: coalesced page reads on the I/O threads ----------------------------------------
    def _split(self, rows: np.ndarray):
        """``rows`` split into those in the DRAM cache and those on disk (their indices and positions)."""
        self._load_cache()
        pos = self.positions[rows].astype(np.int64)  # byte offsets are int64
        cached = pos < self.cache_rows
        if not self.cache_rows:
            return np.zeros(0, np.int64), pos[:0], np.arange(rows.shape[0]), pos
        return np.flatnonzero(cached), pos[cached], np.flatnonzero(~cached), pos[~cached]

    def _io(self, write: bool, pages: np.ndarray, buffer: np.ndarray, which: np.ndarray | None = None) -> int:
        """Reads (or writes) ``pages`` into (from) ``buffer`` (:func:`transfer`), a read with the held writes laid
        over it; returns the system calls."""
        done = [0]

        def run() -> None:
            calls, moved = transfer(
                self._fd, self.path, self._pool, self.io_depth, write, pages, buffer, which
            )
            done[0] += calls
            if write:
                self.bytes_written += moved
            else:
                self.bytes_read += moved

        if write or self.held is None:
            run()
        else:
            at = np.arange(pages.shape[0]) if which is None else which
            self.held.read(run, lambda: self.held.over_pages(pages[at], at, buffer))
        return done[0]

    def read_rows(self, rows: np.ndarray, out: np.ndarray | None = None, skip: np.ndarray | None = None,
                  track: bool = False) -> tuple[np.ndarray, PageSet]:  # fmt: skip
        """Records [U, floats] of the distinct ``rows`` (into ``out`` if given), and the pages read. ``skip``:
        indices of rows left as they are in ``out`` (stale rows a refresh reads again): a page only they need is
        not read now (``PageSet.read_at`` -1; :meth:`write_rows` reads it first, :meth:`reread` may fill it).
        ``track``: until these pages are written back (:meth:`write_rows` with them), every write of a page
        they share copies the page's new bytes into them, so neither the refresh nor their write-back reads it
        again from disk (a look-ahead fetch's pages: earlier steps write while it waits)."""
        out = np.empty((rows.shape[0], self.floats), np.float32) if out is None else out
        ci, cpos, di, dpos = self._split(rows)
        version = self._writes  # read before the pages: a write completing later re-stamps them
        pages, offsets = pages_of(dpos, self.record)
        buffer = aligned_bytes(pages.shape[0] * PAGE)
        read_at = np.full(pages.shape[0], version, np.int64)
        keep = np.ones(di.shape[0], bool)
        if skip is not None and skip.shape[0] and di.shape[0]:
            skipped = np.zeros(rows.shape[0], bool)
            skipped[skip] = True
            keep = ~skipped[di]
        need, drawn, which, blank = lazy.plan_reads(self, dpos, keep, pages, offsets, read_at, buffer)
        reads = self._io(False, pages, buffer, which)
        if ci.shape[0]:
            dram_tier.take(self, out, ci, cpos, rows)
        if need.any():
            out[di[need]] = get_records(buffer, offsets[need], self.record).view(np.float32)
        lazy.draw_into(self.pending, out, rows, di[keep & drawn])
        ps = PageSet(pages, buffer, offsets, read_at, di, reads, int(di.shape[0]), drawn_rows=int(drawn.sum()),
                     blank_pages=blank)  # fmt: skip
        if track and pages.shape[0]:
            with self._write_lock:  # from the next write on (one under way now stamps its pages: read again)
                self._live.add(ps)
        return out, ps

    def reread(self, rows: np.ndarray, pages: PageSet, idx: np.ndarray) -> np.ndarray:
        """Records [len(idx), floats] of ``rows[idx]`` read again now (after the writes of earlier steps), where
        ``rows`` and ``pages`` are a fetch's (:meth:`read_rows`): the pages are read into the fetch's page set,
        so its write reads them again only if a later write changes them. Rows of the DRAM tier come from
        memory."""
        out = np.empty((idx.shape[0], self.floats), np.float32)
        where = pages.records_of(idx)
        disk = where >= 0
        if not disk.all():  # the DRAM tier's
            tier = np.flatnonzero(~disk)
            dram_tier.take(self, out, tier, self.positions[rows[idx[tier]]], rows[idx])
        disk &= ~lazy.draw_pending(self, rows, idx, disk, out)  # still pending: drawn
        if disk.any():
            offsets = pages.offsets[where[disk]]
            which = np.unique(spanned(offsets, self.record))
            version = self._writes  # before the read, as read_rows
            with pages.lock:  # pages a write has copied its bytes into since they were read: current
                which = which[pages.read_at[which] < self._page_stamp[pages.pages[which]]]
            fresh = aligned_bytes(which.shape[0] * PAGE)
            self._io(False, pages.pages[which], fresh)
            with pages.lock:
                newer = pages.read_at[which] > version  # a write copied newer bytes in meanwhile: keep those
                take = which[~newer]
                pages.buffer.reshape(-1, PAGE)[take] = fresh.reshape(-1, PAGE)[~newer]
                pages.read_at[take] = version
                out[disk] = get_records(pages.buffer, offsets, self.record).view(np.float32)
        return out

    def pages_of_subset(self, pages: PageSet, idx: np.ndarray) -> PageSet:
        """The page set of the rows at indices ``idx`` of a fetch's rows (``pages``, no longer tracked): the same
        pages, bytes and versions, for :meth:`write_rows` of those rows."""
        with self._write_lock:
            self._live.discard(pages)
        at = pages.records_of(idx)
        on = at >= 0
        return PageSet(pages.pages, pages.buffer, pages.offsets[at[on]], pages.read_at, np.flatnonzero(on),
                       pages.reads, int(on.sum()), pages.lock)  # fmt: skip

    def write_rows(self, rows: np.ndarray, records: np.ndarray, pages: PageSet | None = None) -> int:
        """Stores records [U, floats] of the distinct ``rows``: held (:mod:`~hotline.tiers.held_rows`), or in place.
        ``pages``: what the rows' fetch read (its pages that a later write changed are read again first, where
        their bytes are needed). Returns the system calls made."""
        records = np.ascontiguousarray(records, np.float32)
        ci, cpos, di, dpos = self._split(rows)
        mark_written(self, cpos, dpos)  # for a delta checkpoint, where one tracks the file
        if ci.shape[0]:
            dram_tier.put(self, cpos, records[ci])
        if pages is not None:
            with self._write_lock:
                self._live.discard(pages)
        if not di.shape[0]:
            return 0
        with self._write_lock:
            held = self.held
            if held is not None and not held.fits(di.shape[0]):
                held.sweep(self)  # the file in order: held writes are a file's current values from here on
                held = held if held.fits(di.shape[0]) else None  # more than it holds: in place
            if pages is None or pages.offsets.shape[0] != di.shape[0]:
                page_ids, offsets = pages_of(dpos, self.record)
                buffer = aligned_bytes(page_ids.shape[0] * PAGE)
                read = ~lazy.blank_pages(self, page_ids, buffer)  # pending records only: not read
            else:
                page_ids, offsets, buffer = pages.pages, pages.offsets, pages.buffer
                read = self._page_stamp[page_ids] > pages.read_at  # changed since they were read, or not read
            if held is not None:  # no page written: only those copied into tracked page sets need their bytes
                live = [ps.pages for ps in self._live]
                read &= np.isin(page_ids, np.concatenate(live)) if live else False
            calls = self._io(False, page_ids, buffer, np.flatnonzero(read)) if read.any() else 0
            put_records(buffer, offsets, records[di])
            lazy.written(self.pending, dpos)  # before the write is published: readers of its version see it
            stamp = self._writes + 1
            self._page_stamp[page_ids] = stamp
            if held is not None:
                held.put(dpos, records[di])  # swept to the file in order later: no page written now
            else:
                calls += self._io(True, page_ids, buffer)
            self._writes = stamp
            self._copy_to_live(page_ids, buffer, stamp)
        return calls

    def _copy_to_live(self, page_ids: np.ndarray, buffer: np.ndarray, stamp: int) -> None:
        """Copies the bytes of the pages just written (``page_ids``, write ``stamp``) into the tracked page sets
        that hold them too (:meth:`read_rows` ``track``), which then need not read them again. Under the write
        lock."""
        src = buffer.reshape(-1, PAGE)
        for live in list(self._live):
            _, theirs, ours = np.intersect1d(live.pages, page_ids, assume_unique=True, return_indices=True)
            if theirs.shape[0]:
                with live.lock:
                    live.buffer.reshape(-1, PAGE)[theirs] = src[ours]
                    live.read_at[theirs] = stamp
