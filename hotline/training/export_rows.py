"""A disk-store checkpoint's rows cut into an export's chunks in one streamed pass: no scratch copy of the table.

A rows file (:mod:`hotline.training.checkpoint_rows`; each rank's of N) holds the records in the store's file
order (by popularity), an export's chunks (:func:`~hotline.training.checkpoint_rows.chunk_grid`) are row ranges.
:class:`StreamedRows` reads the rows files once, in order (the ranks' files in step, a window of each at a time,
each file's sha256 on the same pass), and hands out each chunk as soon as the window that holds its last row
has been read: its :attr:`~StreamedRows.schedule` is the order in which the chunks complete, and the writer asks
for them in that order. The order region (and the bitmap before it) is read first, once more, to plan that
schedule, and fed to the file's sha256 on that pass; the stream feeds it the records (a file of the first
format, its order after the records, has its order read a third time for the digest).

A row that comes before its chunk's window (an "early" row: the popular rows at the head of the file, a chunk's
rows in the window before its last) is held in memory until its chunk goes out, up to :data:`HOLD_CHUNKS`
chunks' worth; beyond that the rows held are written to a scratch file in the export's temporary directory
(unlinked once open), sorted by chunk, and read back by their chunk. In the store's own order only the head's
counted rows that are not hot are early: with a hot tier that holds them, no row is written twice. Host memory:
a window, a chunk, the rows held and two small arrays per chunk; disk: the export itself, plus the early rows
beyond the hold (:attr:`~StreamedRows.spill_bytes`, known before anything is written).

The hot rows' copies in the files are stale (their current values are in the checkpoint's hot tier): they are
skipped, and the hot tier's values laid over each chunk. Each chunk is checked to hold every one of its rows
exactly once; a file whose records or order are not the ones its checkpoint records is refused (``error``)
once its digest is known, before the export is put under its name.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from hotline import _io
from hotline.training import checkpoint_delta
from hotline.training.checkpoint_rows import (
    CHUNK_BYTES,
    _corrupt,
    _rows_file_chunks,
    check_base,
    chunk_grid,
    order_chunks,
    read_header,
    rows_path,
)

HOLD_CHUNKS = 2
"""The early rows held in memory, in chunks' bytes; more go to the scratch file."""
_SLICES = 4
"""A window's records are sorted by chunk in this many slices (the index arrays' memory)."""


def _bits(rows: np.ndarray, n: int) -> np.ndarray:
    """A bitmap of ``n`` rows (bit ``r % 8`` of byte ``r // 8``) with the sorted ``rows`` set: a bit a row, so a
    row's membership is one look-up (a search of the hot rows for every row read was most of the export's time)."""
    bits = np.zeros((n + 7) // 8, np.uint8)
    if rows.size:
        rows = rows[np.r_[True, np.diff(rows) != 0]]  # sorted: each once
        at = rows >> 3
        first = np.r_[0, np.flatnonzero(np.diff(at)) + 1]
        one = (1 << (rows & 7)).astype(np.uint8)
        bits[at[first]] = np.add.reduceat(one, first)  # distinct bits: their sum is their or
    return bits


class StreamedRows:
    """The weights of a disk-store checkpoint (``parts``: ``(rank's checkpoint file, its record of the rows
    file)`` in rank order; rank ``r`` of ``N`` holds the global rows ``r, r + N, ...``) and its hot tier
    (``hot``: ``rows``, ``w``) as the chunks of :attr:`grid`, each asked for once, in :attr:`schedule`'s order
    (module docstring). The rows files' headers must have been checked (:func:`~hotline.training.\
checkpoint_rows.check_rows` without ``digest``). ``scratch``: where the early rows beyond the hold go (created
    only then)."""

    def __init__(self, parts, table_sizes, hot: dict, scratch: str | os.PathLike,
                 chunk_bytes: int | None = None, error: type[Exception] = ValueError):  # fmt: skip
        self.num_rows = sum(int(n) for n in table_sizes)
        self.world_size = N = len(parts)
        self._error, self._parts, self._scratch_path = error, parts, Path(scratch)
        self._files = [(rows_path(ck), info, *read_header(rows_path(ck))) for ck, info in parts]
        self.dim = D = int(self._files[0][2]["dim"])
        for r, (path, _, head, _) in enumerate(self._files):
            n = len(range(r, self.num_rows, N))
            if int(head["rows"]) != n or int(head["dim"]) != D:
                raise error(f"checkpoint {parts[r][0]}: its rows {path.name} hold {head['rows']} rows of dim "
                            f"{head['dim']}, its tables {n} of dim {D}")  # fmt: skip
        chunk_bytes = chunk_bytes or CHUNK_BYTES
        self.grid = chunk_grid(table_sizes, max(1, chunk_bytes // (4 * D)))
        self._starts = np.array([g for *_, g in self.grid] + [self.num_rows], np.int64)
        order = np.argsort(hot["rows"].numpy(), kind="stable")  # the hot tier: its size, not the table's
        self._hot_rows = hot["rows"].numpy()[order].astype(np.int64)
        self._hot_w = hot["w"].numpy()[order]
        self._hot_bits = _bits(self._hot_rows, self.num_rows)
        record = int(self._files[0][2]["record_bytes"])
        self._window_rows = max(1, chunk_bytes // (record * N))  # each rank's part of a window
        self._hold_bytes = HOLD_CHUNKS * chunk_bytes
        self._digests = [hashlib.sha256() for _ in parts]  # the plan feeds them the bytes up to the records
        self._plan()
        self._held: dict[int, list] = {}  # chunk -> [(ids in the chunk, weights)], in memory
        self._held_bytes = 0
        self._spilled: dict[int, list] = {}  # chunk -> [(offset, rows)] in the scratch file
        self._spill, self._spill_end = None, 0
        self._due: dict[int, list] = {}  # chunk -> [(ids, weights)]: the window's rows of chunks it completes
        self._window = 0  # the next window to read
        self._asked = 0
        self._streams = [
            _rows_file_chunks(path, head, start, self._window_rows, digest, digested=True)
            for (path, _, head, start), digest in zip(self._files, self._digests)
        ]

    # -- the plan: which window completes each chunk ----------------------------------------------------------
    def _global(self, order: np.ndarray, rank: int):
        """A rank's chunk of its order as global rows without the hot ones, their chunks, and which of the
        chunk's records they are (None: all)."""
        rows = order * self.world_size + rank
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise ValueError(f"its rows name rows outside 0..{self.num_rows - 1}")
        keep = None
        if self._hot_rows.size:
            keep = (self._hot_bits[rows >> 3] >> (rows & 7).astype(np.uint8)) & 1 == 0
            rows = rows[keep]
        return rows, np.searchsorted(self._starts, rows, side="right") - 1, keep

    def _plan(self) -> None:
        """:attr:`schedule` (chunks by the window that completes them), the early rows, :attr:`spill_bytes`:
        from the files' orders, read once; a checked count of each chunk's rows."""
        K = len(self.grid)
        last = np.full(K, -1, np.int64)  # the window of each chunk's last (not hot) row
        in_last = np.zeros(K, np.int64)  # its rows in that window
        count = np.zeros(K, np.int64)
        try:
            for r, (path, _, head, start) in enumerate(self._files):
                chunks = order_chunks(path, head, start, self._window_rows, self._digests[r])
                for j, order in enumerate(chunks):
                    _, chunk, _ = self._global(order, r)
                    c = np.bincount(chunk, minlength=K)
                    k = np.flatnonzero(c)
                    c = c[k]
                    count[k] += c
                    newer, same = j > last[k], j == last[k]
                    in_last[k[newer]], last[k[newer]] = c[newer], j
                    in_last[k[same]] += c[same]
            hot = np.bincount(np.searchsorted(self._starts, self._hot_rows, side="right") - 1, minlength=K)
            if not np.array_equal(count + hot, np.diff(self._starts)):
                raise ValueError("its rows do not hold every row once")
        except ValueError as e:
            self._refuse(e)
        self._last = last
        self.schedule = np.lexsort((np.arange(K), last)).tolist()
        early = int((count - in_last).sum())
        self.early_rows = early
        """Rows read before their chunk's window (held, or beyond the hold written to the scratch file)."""
        bytes_each = 4 * (self.dim + 1)
        self.spill_bytes = early * bytes_each if early * bytes_each > self._hold_bytes else 0
        """The scratch file's size at most (0: every early row held in memory)."""

    def _refuse(self, e: ValueError, streamed: bool = False):
        """``e`` said as the checkpoint's: a damaged file (its sha256 not the recorded one) by that, else as
        it is. ``streamed``: the digests are the streams' (read to their end); else each file is read now."""
        for r, ((ck, _), (path, info, head, _)) in enumerate(zip(self._parts, self._files)):
            want = info.get("sha256") if isinstance(info, dict) else None
            if checkpoint_delta.is_delta(head):
                if _io.sha256(path) != want:
                    raise _corrupt(ck, path, self._error) from None
                check_base(ck, path, head, self._error)  # its size and sha256: says which file
                continue
            if streamed:
                for _ in self._streams[r]:
                    pass
                got = self._digests[r].hexdigest()
            else:
                got = _io.sha256(path)
            if got != want:
                raise _corrupt(ck, path, self._error) from None
        raise self._error(f"checkpoint {self._parts[0][0]}: {e}") from None

    # -- the stream ----------------------------------------------------------------------------------------
    def _read_window(self) -> bool:
        """Reads the next window of every rank's file: its rows of the chunks it completes to :attr:`_due`,
        the early ones held; False when every file is read."""
        parts = [(r, part) for r, part in enumerate(next(s, None) for s in self._streams) if part is not None]
        if not parts:
            return False
        j = self._window
        self._window += 1
        for r, (order, rec) in parts:  # in slices: the index arrays a slice's size, not the window's
            step = max(1, -(-order.shape[0] // _SLICES))
            for lo in range(0, order.shape[0], step):
                self._place(j, r, order[lo : lo + step], rec[lo : lo + step])
        if self._held_bytes > self._hold_bytes:
            self._spill_held()
        return True

    def _place(self, j: int, rank: int, order: np.ndarray, rec: np.ndarray) -> None:
        """Rank ``rank``'s records ``rec`` of rows ``order`` (window ``j``) sorted by chunk: to :attr:`_due`
        (views) for the chunks ``j`` completes, held (copies) for the later ones."""
        rows, chunk, keep = self._global(order, rank)
        by = np.argsort(chunk, kind="stable")
        chunk = chunk[by]
        ids = (rows[by] - self._starts[chunk]).astype(np.int32)
        w = rec[by if keep is None else np.flatnonzero(keep)[by], : self.dim]  # one copy, in chunk order
        del rows, by
        cuts = np.flatnonzero(np.diff(chunk)) + 1
        for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, chunk.size].tolist()):
            if lo == hi:
                continue
            k = int(chunk[lo])
            if self._last[k] == j:
                self._due.setdefault(k, []).append((ids[lo:hi], w[lo:hi]))
            else:
                self._held.setdefault(k, []).append((ids[lo:hi].copy(), w[lo:hi].copy()))
                self._held_bytes += (hi - lo) * (4 * self.dim + 4)

    def _spill_held(self) -> None:
        """Writes every row held to the scratch file, chunk by chunk, and forgets them."""
        if self._spill is None:
            self._spill = open(self._scratch_path, "w+b")  # noqa: SIM115 -- closed by close()
            os.unlink(self._scratch_path)  # its space is freed when it closes, or when the process ends
        fd = self._spill.fileno()
        for k in sorted(self._held):
            ids = np.concatenate([i for i, _ in self._held[k]])
            w = np.concatenate([w for _, w in self._held[k]])
            os.pwrite(fd, memoryview(np.ascontiguousarray(w)).cast("B"), self._spill_end)
            os.pwrite(fd, memoryview(ids).cast("B"), self._spill_end + w.nbytes)
            self._spilled.setdefault(k, []).append((self._spill_end, ids.shape[0]))
            self._spill_end += w.nbytes + ids.nbytes
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        self._held, self._held_bytes = {}, 0

    def _unspill(self, at: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
        w, ids = np.empty((rows, self.dim), np.float32), np.empty(rows, np.int32)
        for a, off in ((w, at), (ids, at + w.nbytes)):
            if os.preadv(self._spill.fileno(), [memoryview(a).cast("B")], off) != a.nbytes:
                raise OSError(f"export scratch file {self._scratch_path} ends early")
        return ids, w

    def chunk(self, k: int) -> np.ndarray:
        """Chunk ``k`` of the grid: its rows' weights ``[rows, dim]`` in row order (a new array); the chunks
        must be asked for in :attr:`schedule`'s order."""
        if self._asked >= len(self.schedule) or self.schedule[self._asked] != k:
            raise RuntimeError(f"export chunk {k} asked for out of the rows' order (schedule)")
        self._asked += 1
        try:
            while self._window <= self._last[k]:
                if self._due:
                    raise RuntimeError(
                        f"export chunks {sorted(self._due)} were not asked for in their window"
                    )
                self._read_window()
            _, _, m, g = self.grid[k]
            parts = self._held.pop(k, [])
            self._held_bytes -= sum(ids.shape[0] for ids, _ in parts) * (4 * self.dim + 4)
            parts += [self._unspill(*at) for at in self._spilled.pop(k, [])]
            parts += self._due.pop(k, [])
            lo, hi = np.searchsorted(self._hot_rows, [g, g + m])
            parts.append(((self._hot_rows[lo:hi] - g).astype(np.int32), self._hot_w[lo:hi]))
            out = np.empty((m, self.dim), np.float32)
            seen = np.zeros(m, bool)
            for ids, w in parts:
                out[ids] = w
                seen[ids] = True
            if sum(ids.shape[0] for ids, _ in parts) != m or not seen.all():
                raise ValueError(f"its rows do not hold the rows {g}..{g + m - 1} once each")
        except ValueError as e:
            self._refuse(e, streamed=True)
        return out

    def finish(self) -> None:
        """Reads what is left of the files (hot rows' stale copies) and checks every file's sha256: ``error``
        when one is not the one its checkpoint records. Call it after the last chunk, before the export is put
        under its name."""
        while self._read_window():
            pass
        if self._asked != len(self.schedule) or self._due:
            raise RuntimeError("export chunks left unwritten")
        for (ck, _), (path, info, head, _), digest in zip(self._parts, self._files, self._digests):
            want = info.get("sha256")
            if checkpoint_delta.is_delta(head):
                if _io.sha256(path) != want:
                    raise _corrupt(ck, path, self._error)
                want = head["base"]["sha256"]
            if digest.hexdigest() != want:
                if checkpoint_delta.is_delta(head):
                    check_base(ck, path, head, self._error)
                raise _corrupt(ck, path, self._error)

    def close(self) -> None:
        for stream in self._streams:
            stream.close()
        if self._spill is not None:
            self._spill.close()
