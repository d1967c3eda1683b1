"""The disk cold store: every cold row and its optimizer state in a file on local disk, read and written in place.

:class:`DiskColdStore` is the :class:`~hotline.tiers.cold_store.ColdStore` of one rank whose rows live in a
:class:`~hotline.tiers.disk_file.RowFile` (``--cold-store disk --cold-dir DIR``): a step's working set is read
from the file (coalesced page reads on a pool of I/O threads, O_DIRECT where the filesystem allows), updated
in the working buffer like the host-memory store's, and written back in place. The claim rule of the
look-ahead is the same as the host store's (:class:`~hotline.tiers.cold_store.ClaimBook`), so a run is
bit-identical to the host-memory store and to ``--mode device`` where that one is.

:class:`DiskRows` is the same file as the row holder of one rank's shard on N ranks
(:class:`~hotline.tiers.sharded_store.ShardedColdStore`): each rank keeps its own file.

The file's row order follows the profile's counts (:func:`popularity_order`): rows counted most often first,
never-counted rows after them in id order, so a step's popular-but-not-hot rows share pages; the order is
kept beside the file. Re-placement moves rows between the hot tier and the file (``demote``/``promote``);
rows keep their place in the file.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from hotline.distributed.comm import Comm
from hotline.kernels import sparse_update
from hotline.table_layout import TableLayout
from hotline.tiers.cold_store import _EMPTY, ClaimBook, ColdFetch, OneRankStore
from hotline.tiers.disk_file import PAGE, RowFile
from hotline.tiers.sparse_optim import SparseOptimizer

_INIT_CHUNK_FLOATS = 16 << 20


def cold_file(cold_dir: str | os.PathLike, rank: int = 0, world_size: int = 1) -> Path:
    """The cold-row file of ``rank`` in ``cold_dir``."""
    name = (
        "hotline-cold-rows.bin"
        if world_size == 1
        else f"hotline-cold-rows.rank{rank:03d}-of-{world_size:03d}.bin"
    )
    return Path(cold_dir) / name


def popularity_order(counts: np.ndarray | None, num_rows: int, last: np.ndarray | None = None,
                     table_sizes=None, counted: np.ndarray | None = None,
                     once: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Rows in file order (int32 below 2**31 rows, else int64): counted rows by count, most first (ties by id),
    then the never-counted rows in id order, then ``last`` (the hot rows, in id order: their copies in the file
    are not read while they are hot). ``counted``: the counted rows already in that order (a profile's
    :attr:`~hotline.profiling.profile.Profile.order`), in place of ``counts``; else they are ordered by a counting
    sort over the counts' values (:func:`~hotline.kernels.profile.order_by_count`). With ``table_sizes`` the
    never-counted rows go table by table, the table whose unseen rows are likeliest looked up first: by its rows
    counted once per unseen row (Good-Turing: the once-counted rows estimate the lookups that fall on unseen
    rows; ``once``, per table, with ``counted``), so the DRAM tier at the file's head holds them. The rest goes
    in chunks: besides the order itself it holds two arrays of the counted rows (int32 below 2**31 rows) at
    most, never a sort or a count of every row."""
    from hotline.kernels.profile import order_by_count

    if counted is None and counts is not None:
        counts = np.asarray(counts)
        if counts.shape != (num_rows,):
            raise ValueError(f"the profile counts {counts.shape[0]} rows, the store holds {num_rows}")
        counted = order_by_count(counts)
        if table_sizes is not None and once is None:
            once = once_per_table(counts, table_sizes)
    wide = np.int32 if num_rows < 2**31 else np.int64
    head = np.zeros(0, wide) if counted is None else np.asarray(counted)
    if head.size and (int(head.min()) < 0 or int(head.max()) >= num_rows):
        raise ValueError(f"the profile's counted rows lie outside the store's {num_rows} rows")
    last = np.zeros(0, np.int64) if last is None else np.unique(np.asarray(last, np.int64))
    if last.size:  # the hot rows go last, whatever their counts
        head = head[~np.isin(head, last)]
    out = np.empty(num_rows, wide)
    out[: head.shape[0]] = head
    at = head.shape[0]
    seen = np.sort(head)
    del head
    chunk = 1 << 20
    ranges = [(0, num_rows)]
    if table_sizes is not None:
        sizes = np.asarray(table_sizes, np.int64)
        ends = np.cumsum(sizes)
        ranges = list(zip((ends - sizes).tolist(), ends.tolist()))
        if once is not None:
            unseen = sizes.copy()  # each table's rows in its block: neither counted nor hot
            for taken in (seen, last):
                unseen -= np.bincount(np.searchsorted(ends, taken, "right"), minlength=sizes.shape[0])
            rate = np.divide(
                np.asarray(once, np.float64), unseen, out=np.zeros(sizes.shape[0]), where=unseen > 0
            )
            ranges = [ranges[t] for t in np.argsort(-rate, kind="stable")]
    for a, b in ranges:
        for lo in range(a, b, chunk):
            hi = min(b, lo + chunk)
            free = np.ones(hi - lo, bool)
            for taken in (seen, last):
                x, y = np.searchsorted(taken, [lo, hi])
                free[taken[x:y] - lo] = False
            ids = lo + np.flatnonzero(free)
            out[at : at + ids.shape[0]] = ids
            at += ids.shape[0]
    out[at:] = last
    return out


def once_per_table(counts: np.ndarray, table_sizes) -> np.ndarray:
    """int64 [tables]: the rows of each table counted exactly once in ``counts`` (a count of every fused row),
    read in chunks (:func:`popularity_order`'s Good-Turing estimate of the lookups on unseen rows)."""
    ends = np.cumsum(np.asarray(table_sizes, np.int64))
    once = np.zeros(ends.shape[0], np.int64)
    for t, (a, b) in enumerate(zip((ends - np.asarray(table_sizes, np.int64)).tolist(), ends.tolist())):
        for lo in range(a, b, 1 << 20):
            once[t] += np.count_nonzero(counts[lo : min(b, lo + (1 << 20))] == 1)
    return once


def table_chunks(rows: int, dim: int, seed: int, table: int, chunk: int | None = None):
    """The initial weights of one table (:func:`hotline.models.dlrm.init_embedding_table`) chunk by chunk:
    ``(first_row, weights)``. One generator drawn in order, so the chunks are the same numbers as the
    whole table (tested), without holding the table."""
    chunk = chunk or max(1, _INIT_CHUNK_FLOATS // max(1, dim))  # the draws are float64: 128 MiB at a time
    rng = np.random.default_rng([seed, 7919, table])
    bound = 1.0 / math.sqrt(rows)
    for lo in range(0, rows, chunk):
        yield lo, rng.uniform(-bound, bound, size=(min(chunk, rows - lo), dim)).astype(np.float32)


class DiskRows(ClaimBook):
    """One process's rows (local ids) in a :class:`RowFile`, with the claim rule's bookkeeping: the row holder
    of a one-rank disk store and of a rank's shard on N ranks."""

    def __init__(self, path, num_rows: int, dim: int, optimizer: SparseOptimizer, order=None,
                 io_depth: int = 32, direct: bool = True, cache_bytes: int = 0, force: bool = False,
                 held_bytes: int = 0):  # fmt: skip
        super().__init__(num_rows)
        self.dim, self.S = int(dim), optimizer.state_floats_per_row
        self.state_shape = optimizer.state_shape  # rows -> their state's shape ([U], [U, S] or [0])
        self._wrote_nonfinite = False  # an update wrote NaN or infinity (a diverging run, not a damaged file)
        self.file = RowFile(path, num_rows, dim, self.S, order, io_depth, direct, cache_bytes, optimizer.kind,
                            force=force, held_bytes=held_bytes)  # fmt: skip

    def _state(self, rows: int, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """A state array of ``rows`` rows (``out[:rows]`` when given) and its [rows, S] view (the records'
        state columns)."""
        s = out[:rows] if out is not None and self.S else np.empty(self.state_shape(rows), np.float32)
        return s, s.reshape(rows, self.S)

    def fill_initial(self, layout: TableLayout, seed: int, rank: int = 0, world_size: int = 1,
                     hot: np.ndarray | None = None, lazy: bool = True) -> np.ndarray | None:  # fmt: skip
        """Gives every row its initial weights (those every mode starts from) and zero state: with ``lazy``, none
        is written, each drawn when first read until written (:func:`~hotline.tiers.initial_fill.lazy_fill`);
        else all written in file order at the disk's sequential rate (:func:`~hotline.tiers.initial_fill.
        fill_file`). The tables are never whole in memory. This process holds fused rows ``rank::world_size``.
        ``hot``: fused ids whose initial weights are returned, from the same draws (the hot tier's); None returns
        None."""
        from hotline.tiers.initial_fill import fill_file, lazy_fill

        t0 = time.perf_counter()
        hot_w = (lazy_fill if lazy else fill_file)(self.file, layout, self.dim, seed, rank, world_size, hot)
        self.file.flush()
        self.file.drop_page_cache()
        self.fill_s = time.perf_counter() - t0  # the fill's seconds (the start-up breakdown)
        return hot_w

    # -- rows -----------------------------------------------------------------------------------------
    def get(self, rows: np.ndarray, out_w: np.ndarray | None = None, out_s: np.ndarray | None = None,
            skip: np.ndarray | None = None, track: bool = False):  # fmt: skip
        """Weights [U, D] and state (the optimizer's :meth:`~SparseOptimizer.state_shape`: [U], [U, S], or [0]
        for SGD) of ``rows`` (into ``out_*`` when given), and the pages read. ``skip``: indices of rows whose
        values are not read (stale rows a refresh reads again); ``track``: the pages kept current by later
        writes until they are written back (see :meth:`RowFile.read_rows`)."""
        if track and self.file.held is not None:  # a training run's fetch: the held writes' memory taken now
            self.file.held.take()  # (before the first step ends, not in the steps' write-backs)
        rec, pages = self.file.read_rows(rows, skip=skip, track=track)
        self._check_read(rows, rec, skip)
        return (*self._split_records(rec, out_w, out_s), pages)

    def reread(self, rows: np.ndarray, pages, idx: np.ndarray):
        """Weights and state of ``rows[idx]`` read again into the fetch's pages (:meth:`RowFile.reread`)."""
        rec = self.file.reread(rows, pages, idx)
        self._check_read(rows[idx], rec)
        return self._split_records(rec)

    def _check_read(self, rows: np.ndarray, rec: np.ndarray, skip: np.ndarray | None = None) -> None:
        """Raises ValueError naming the file and the row when a record read holds a value that is not finite
        while this run never wrote one (:meth:`put` keeps count): the file was changed under the run, not a
        diverging update (that is the loss check's to say)."""
        if self._wrote_nonfinite or np.isfinite(rec).all():
            return
        bad = ~np.isfinite(rec).all(axis=1)
        if skip is not None and skip.size:
            bad[skip] = False  # not read: their values come with the refresh
        if not bad.any():
            return
        i = int(np.flatnonzero(bad)[0])
        row, value = int(rows[i]), rec[i][~np.isfinite(rec[i])][0]
        raise ValueError(
            f"cold store {self.file.path}: row {row} (record {int(self.file.positions[row])} of the file) holds "
            f"{value}, which this run never wrote: the file was changed under the run or its disk returned bad "
            f"data; resume from the last checkpoint (--resume) into a fresh --cold-dir"
        )

    def _split_records(
        self, rec: np.ndarray, out_w: np.ndarray | None = None, out_s: np.ndarray | None = None
    ):
        """Records [U, D + S] as weights [U, D] and state (into ``out_*`` when given)."""
        U, D = rec.shape[0], self.dim
        w = out_w[:U] if out_w is not None else np.empty((U, D), np.float32)
        w[:] = rec[:, :D]
        s, cols = self._state(U, out_s)
        cols[:] = rec[:, D:]
        return w, s

    def put(self, rows: np.ndarray, w: np.ndarray, s: np.ndarray, pages=None) -> int:
        """Stores weights and state of the distinct ``rows`` in place; returns the system calls made."""
        U = rows.shape[0]
        rec = np.empty((U, self.dim + self.S), np.float32)
        rec[:, : self.dim] = w
        rec[:, self.dim :] = s.reshape(U, self.S)
        if not self._wrote_nonfinite and not np.isfinite(rec).all():
            self._wrote_nonfinite = True  # a diverging update: the loss check names it, not the file
        return self.file.write_rows(rows, rec, pages)

    def apply(self, optimizer: SparseOptimizer, rows: np.ndarray, grads: torch.Tensor, pages=None) -> int:
        """One sparse update of ``rows`` (local ids, may repeat: their gradients summed) in place: read,
        update the copy with the same kernel, write back. Returns the rows updated. ``pages``: what a tracked
        fetch of these same ``rows`` read (:meth:`get` with ``track``), kept current by the writes since: the
        rows are taken from it, reading from disk only the pages no write has brought up to date."""
        uniq, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
        if pages is None:
            w, s, pages = self.get(uniq)
        else:
            w, s = self.reread(rows, pages, first)
            pages = self.file.pages_of_subset(pages, first)
        wt, st = torch.from_numpy(w), torch.from_numpy(s)
        touched = optimizer.step(wt, st, torch.from_numpy(inverse.reshape(-1).astype(np.int64)), grads)
        self.put(uniq, w, s, pages)
        return touched

    def all(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row's weight [rows, D] and state (local ids, read in file order)."""
        w = np.empty((self.num_rows, self.dim), np.float32)
        s, cols = self._state(self.num_rows)
        for rows, rec in self.file.read_all():
            w[rows] = rec[:, : self.dim]
            cols[rows] = rec[:, self.dim :]
        return w, s

    def replace_all(self, weights: np.ndarray, state: np.ndarray) -> None:
        """Every row's weight and state (local ids), written in file order."""
        f = self.file
        cols = state.reshape(self.num_rows, self.S)
        chunk = max(1, (64 << 20) // f.record)
        for lo in range(0, self.num_rows, chunk):
            rows = f.order[lo : lo + chunk]
            rec = np.empty((rows.shape[0], self.dim + self.S), np.float32)
            rec[:, : self.dim] = weights[rows]
            rec[:, self.dim :] = cols[rows]
            self._wrote_nonfinite |= not np.isfinite(rec).all()
            f.put_positions(lo, rec)
        f.flush()
        f.drop_page_cache()

    def close(self) -> None:
        self.file.close()


class DiskColdStore(OneRankStore):
    """Every row of one rank in a file on local disk (see the module docstring)."""

    on_disk = True
    """The rows are on disk: the dispatcher finds hot slots by a table of the hot rows
    (:func:`hotline.dispatch.index_for`), not a remap of every row."""

    def __init__(self, path, layout: TableLayout, dim: int, optimizer: SparseOptimizer, seed: int,
                 order: np.ndarray | None = None, io_depth: int = 32, direct: bool = True,
                 cache_bytes: int = 0, max_rows: int = 0, force: bool = False, hot=None,
                 lazy: bool = True, held_bytes: int = 0):  # fmt: skip
        """``lazy``: rows drawn when first read, not written at start-up (:meth:`DiskRows.fill_initial`)."""
        self.comm = Comm()
        order = order() if callable(order) else order  # made here: nothing else holds it through the fill
        self.host = DiskRows(
            path, layout.num_rows, dim, optimizer, order, io_depth, direct, cache_bytes, force, held_bytes
        )
        self.file = self.host.file
        self.dim, self.S = int(dim), optimizer.state_floats_per_row
        self._scratch = sparse_update.new_scratch(max_rows)
        del order  # on disk now (the file's order file)
        self.hot_initial = self.host.fill_initial(layout, seed, hot=hot, lazy=lazy)  # the hot rows' weights

    def fetch(self, rows, out_values, out_state, step=-1) -> ColdFetch:
        stale, owner, slot = self.host.claim_with_owners(rows, step) if step >= 0 else (_EMPTY,) * 3
        t0 = time.perf_counter()
        # stale rows: read by the refresh; the pages kept current by the writes of earlier steps meanwhile
        w, s, pages = self.host.get(rows, out_values, out_state, skip=stale, track=step >= 0)
        return ColdFetch(
            rows, w, s, step=step, stale=stale, stale_owner=owner, stale_slot=slot, route=pages,
            times={"disk_read": time.perf_counter() - t0},
            counters={"disk_bytes_read": pages.pages_read * PAGE, "disk_pages": pages.pages.shape[0],
                      "disk_reads": pages.reads, "disk_rows": pages.disk_rows, "drawn_rows": pages.drawn_rows},
        )  # fmt: skip

    def refresh(self, fetch: ColdFetch, slots=None):
        slots = fetch.stale if slots is None else slots
        # into the fetch's pages (read from disk only where no write has brought them up to date)
        w, s = self.host.reread(fetch.rows, fetch.route, slots)
        return slots, w, s

    def close(self) -> None:
        self.host.close()
