"""The rows of a disk-store checkpoint, streamed: a copy of the store's file beside the checkpoint, never
the whole table in memory.

A checkpoint of a run whose cold rows live on disk (``--cold-store disk``, one rank or each of N) keeps every
row and its optimizer state in a side file, ``CHECKPOINT.rows`` (``step-000000123.pt.rows``): a header, a bitmap
of the store's file positions never written (bit ``i % 8`` of byte ``i // 8``, padded to a page: lazy
initialization's pending rows, :mod:`hotline.tiers.pending_rows`; the header names how to draw them), the
store's file order (int32, int64 beyond 2**31 rows: position ``i`` holds row ``order[i]``), then the records of
the positions not marked, in position order (the row and its whole optimizer state, ``4 * (dim + state)`` bytes
each, packed; the DRAM tier's rows as they stand in memory). A row never written is not drawn into the file:
every reader draws it (:func:`_rows_file_chunks`), so a checkpoint writes the rows a run wrote, not the table.
:data:`ROWS_FORMAT_1` files (every record, then the order) still load. The store's file is read in order in
chunks of :data:`CHUNK_BYTES` (the next chunk on a thread) and the side file written in order with ``O_DIRECT``
where the filesystem allows it (:func:`~hotline.tiers.direct_out.write_direct`: the read, the write and the
sha256 overlap, no page cache), so the host memory it takes is two chunks and two write buffers, not the table.
The hot rows are the one part not in it: their current values are on the device, and the checkpoint's own
file holds them.

Crash-safe as every checkpoint: the side file is written under a temporary name, fsynced and renamed, and
only then the checkpoint's file (which records the side file's size and sha256) and its digest, the commit. A
run killed mid-copy leaves a temporary a later run removes, or a complete side file with no checkpoint file,
which the next run of the same fingerprint removes (the header names the run and the step: the side file is
known by its content, like the checkpoint). Loading checks the size and the sha256 (one streamed pass) before
anything is changed, then copies the records into the store chunk by chunk: position by position where the
store's order is the checkpoint's, row by row where it is not (another placement's file). Into a lazily
initialized store that draws the rows never written as the file names them, those stay pending (the store's
bits set from the bitmap) and only the records held are written (:func:`~hotline.training.checkpoint_held.put_held`).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from hotline import _io
from hotline.kernels.initial_rows import draw_fused, jump_tables
from hotline.tiers.direct_out import write_direct
from hotline.tiers.written_rows import untrack
from hotline.training import checkpoint_delta
from hotline.training.checkpoint_held import (
    ahead,
    held_records,
    loads_lazily,
    overlay_held,
    pending_of,
    put_held,
)

ROWS_FORMAT = "hotline-checkpoint-rows/2"
ROWS_FORMAT_1 = "hotline-checkpoint-rows/1"
"""The first format: every record written, those of rows never written drawn into it (still read)."""
FULL_FORMATS = (ROWS_FORMAT, ROWS_FORMAT_1)
MAGIC = b"HOTLINE CHECKPOINT ROWS\n"
CHUNK_BYTES = 64 << 20
"""The chunk of a copy (read when a copy starts): the host memory a checkpoint's rows take while they are
written or loaded."""
_PAGE = 4096
_SYNC_CHUNKS = 4
"""A copy writes its bytes out and drops them from the page cache every this many chunks."""


def rows_path(checkpoint: str | os.PathLike) -> Path:
    """The side file of the checkpoint file ``checkpoint``."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.name + ".rows")


def disk_rows(mode):
    """The disk store's rows of this rank (:class:`~hotline.tiers.disk_store.DiskRows`), or None when the
    mode keeps its cold rows in memory (or has none)."""
    from hotline.tiers.disk_store import DiskRows

    host = getattr(getattr(mode, "cold", None), "host", None)
    return host if isinstance(host, DiskRows) else None


def _order_dtype(num_rows: int) -> np.dtype:
    return np.dtype(np.int32) if num_rows < 2**31 else np.dtype(np.int64)


def _header(host, step: int, run: dict, fields: dict) -> bytes:
    """The side file's first bytes: magic, the JSON header's length, the header (``fields``: a full file's
    initial rows and held records, or a delta's fields), padded to whole pages."""
    head = json.dumps(
        {
            "format": ROWS_FORMAT,
            "step": int(step),
            "run": run,
            "rows": int(host.num_rows),
            "dim": host.dim,
            "state_floats": host.S,
            "record_bytes": host.file.record,
            "order_dtype": _order_dtype(host.num_rows).str,
            **fields,
        },  # fmt: skip
        sort_keys=True,
    ).encode()
    raw = MAGIC + struct.pack("<Q", len(head)) + head
    return raw + b"\0" * (-len(raw) % _PAGE)


def read_header(path: str | os.PathLike) -> tuple[dict, int] | None:
    """The side file's header and the byte where its records start, or None when it is not one."""
    try:
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return None
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 1 << 24:
                return None
            head = json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return None
    if not isinstance(head, dict) or head.get("format") not in (*FULL_FORMATS, checkpoint_delta.DELTA_FORMAT):
        return None
    raw = len(MAGIC) + 8 + n
    return head, raw + (-raw % _PAGE)


def _order_chunks(host, chunk: int) -> Iterator[np.ndarray]:
    """The store's row order in chunks of ``chunk`` rows, read from its file (an
    :class:`~hotline.tiers.disk_pages.OrderFile`: nothing mapped, a chunk held)."""
    from hotline.tiers.disk_pages import order_chunks

    return order_chunks(host.file.order, chunk)


def write_rows(host, checkpoint: str | os.PathLike, step: int, run: dict, base: dict | None = None,
               seed: int | None = None, chunk_bytes: int | None = None) -> dict:  # fmt: skip
    """Writes the side file of ``checkpoint`` from the store ``host`` (its file in order, in chunks; the DRAM
    tier's rows from memory), atomically; returns what the checkpoint records of it (format, name, bytes,
    sha256). ``seed``: the one that drew the store's initial rows: its rows never written are named by the
    bitmap, not drawn into the file
    (:func:`~hotline.training.checkpoint_held.pending_of`). ``base``: a delta on it instead
    (:func:`~hotline.training.checkpoint_delta.delta_base`): the rows written since it only. A file there that is
    not a rows file by its content (or a link) is refused (ValueError), and kept."""
    path = rows_path(checkpoint)
    if path.is_symlink() or (path.exists() and read_header(path) is None):
        raise ValueError(
            f"checkpoint {checkpoint}: {path} exists and is not a checkpoint's rows file: move it away (a "
            f"disk-store checkpoint writes its rows there); nothing was written"
        )
    f_rows = host.file
    chunk = max(1, (chunk_bytes or CHUNK_BYTES) // f_rows.record) // 8 * 8 or 8  # whole bitmap bytes

    def pieces():
        if base is not None:
            yield _header(host, step, run, checkpoint_delta.delta_header(base, host))
            yield from checkpoint_delta.pieces(host, chunk)
            return
        pending = pending_of(host, seed)
        n = host.num_rows
        initial = None
        if pending is not None:
            initial = {"seed": int(seed), "table_rows": pending.table_rows.tolist(), "rank": pending.rank,
                       "world_size": pending.world_size}  # fmt: skip
        held = n if pending is None else n - pending.count()
        yield _header(host, step, run, {"initial": initial, "held": held})
        bits = -(-n // 8)
        if pending is None:  # every record held: a bitmap of zeros
            yield from (bytes(min(1 << 20, bits - lo)) for lo in range(0, bits, 1 << 20))
        else:
            yield pending.bits  # the store is still while it is written: copied as it stands
        yield bytes(-bits % _PAGE)
        dtype = _order_dtype(n)
        for order in _order_chunks(host, chunk):
            yield np.ascontiguousarray(order, dtype)
        if pending is None:
            for _, rec in f_rows.read_all(chunk, rows=False):
                yield rec
            return
        spans = ((lo, min(chunk, n - lo)) for lo in range(0, n, chunk))
        for rec in ahead(lambda span: held_records(f_rows, pending, *span), spans):
            if rec.shape[0]:
                yield rec
        f_rows.drop_page_cache()

    size, sha, _ = write_direct(path, pieces(), buffer_bytes=(chunk_bytes or CHUNK_BYTES) // 2)
    kind = ROWS_FORMAT if base is None else checkpoint_delta.DELTA_FORMAT
    return {"format": kind, "file": path.name, "bytes": size, "sha256": sha}


def record_of(num_rows: int, dim: int, state_floats: int) -> dict:
    """What a store of ``num_rows`` rows of ``dim`` weights and ``state_floats`` state floats each needs of a
    side file's header."""
    return {"rows": int(num_rows), "dim": int(dim), "state_floats": int(state_floats),
            "record_bytes": 4 * (int(dim) + int(state_floats))}  # fmt: skip


def check_rows(checkpoint: str | os.PathLike, info, step: int, want: dict, error: type[Exception],
               digest: bool = True) -> None:  # fmt: skip
    """Raises ``error`` unless the side file of ``checkpoint`` is the one it records (``info``: size, sha256),
    of ``step``, and holds the records ``want`` (:func:`record_of`); reads the whole file once (without
    ``digest``: its header and size only, for a reader that checks the sha256 on its own pass), changes
    nothing."""
    path = rows_path(checkpoint)
    found = read_header(path) if path.is_file() and not path.is_symlink() else None
    if found is None or not isinstance(info, dict):
        raise error(
            f"checkpoint {checkpoint}: its rows {path.name} are missing or not a checkpoint's rows file "
            f"(delete the checkpoint to resume from the previous one)"
        )
    head, _ = found
    if head.get("step") != step:
        raise error(
            f"checkpoint {checkpoint}: its rows {path.name} are of step {head.get('step')}, it is {step}"
        )
    theirs = {k: head.get(k) for k in want}
    if theirs != want:
        raise error(
            f"checkpoint {checkpoint}: its rows {path.name} hold {theirs}, this run needs {want} "
            f"(another model, optimizer or number of ranks)"
        )
    if path.stat().st_size != info.get("bytes") or (digest and _io.sha256(path) != info.get("sha256")):
        raise _corrupt(checkpoint, path, error)
    if checkpoint_delta.is_delta(head):
        check_base(checkpoint, path, head, error, digest)


def check_base(checkpoint, path: Path, head: dict, error: type[Exception], digest: bool = True) -> None:
    """Raises ``error`` unless the base of the delta ``path`` (header ``head``) is there, a full rows file of
    the same run and records, of the size (and with ``digest``, the sha256) the delta names; changes nothing."""
    base = checkpoint_delta.base_of(path, head)
    found = read_header(base) if base.is_file() and not base.is_symlink() else None
    named = head["base"]
    same = ("run", "rows", "dim", "state_floats", "record_bytes")
    if (
        found is None
        or found[0].get("format") not in FULL_FORMATS
        or found[0].get("step") != named.get("step")
        or any(found[0].get(k) != head.get(k) for k in same)
    ):
        raise error(
            f"checkpoint {checkpoint}: its rows {path.name} are a delta on {base.name} (step {named.get('step')}), "
            f"which is missing or not that checkpoint's rows file: restore it, or delete this checkpoint to resume "
            f"from the one before"
        )
    if base.stat().st_size != named.get("bytes") or (digest and _io.sha256(base) != named.get("sha256")):
        raise error(
            f"checkpoint {checkpoint}: its rows {path.name} are a delta on {base.name}, which is damaged (its size "
            f"or sha256 is not the one the delta records): restore it, or delete this checkpoint to resume from "
            f"the one before"
        )


def _corrupt(checkpoint, path: Path, error: type[Exception]) -> Exception:
    return error(
        f"checkpoint {checkpoint}: its rows {path.name} are corrupt or cut short (their size or sha256 "
        f"does not match the checkpoint's record; delete both to resume from the previous checkpoint)"
    )


def regions(head: dict, start: int) -> tuple[int, int]:
    """Where a full side file's order and its records start (``start``: the header's end): in this format the
    bitmap, the order, then the records held; in :data:`ROWS_FORMAT_1` the records, then the order."""
    n = int(head["rows"])
    if head["format"] == ROWS_FORMAT_1:
        return start + n * int(head["record_bytes"]), start
    bits = -(-n // 8)
    order_at = start + bits + (-bits % _PAGE)
    return order_at, order_at + n * np.dtype(head["order_dtype"]).itemsize


def _drawer(head: dict):
    """``draw(order, records, mask)``: the initial records of the rows ``order`` where ``mask`` into
    ``records`` (a full side file's rows never written), or None when it names none."""
    initial = head.get("initial")
    if not initial:
        return None
    table_rows = np.asarray(initial["table_rows"], np.int64)
    jumps = jump_tables(int(initial["seed"]), table_rows.shape[0])
    world, rank, dim = int(initial["world_size"]), int(initial["rank"]), int(head["dim"])
    total = int(table_rows.sum())

    def draw(order, rec, mask):
        if order.shape[0] and (order.min() < 0 or order.max() * world + rank >= total):
            raise OSError("checkpoint rows are corrupt: their order names rows outside the tables")
        return draw_fused(order, table_rows, dim, jumps, rec, world, rank, mask)

    return draw


def _drawn(head: dict, order: np.ndarray, drawn: np.ndarray, held: np.ndarray) -> np.ndarray:
    """The records of a chunk of rows ``order``: ``held`` at the rows not ``drawn``, the others drawn."""
    rec = np.empty((order.shape[0], held.shape[1]), np.float32)
    rec[~drawn] = held
    _drawer(head)(order, rec, drawn)
    return rec


def _feed_blocks(f, digest_feed, start: int, end: int, block: int) -> None:
    """Feeds the bytes ``start .. end - 1`` of the open file ``f`` to ``digest_feed``, a block at a time."""
    f.seek(start)
    while start < end:
        data = f.read(min(block, end - start))
        if not data:
            raise OSError(f"checkpoint rows {f.name} end early (at byte {start})")
        digest_feed(data)
        start += len(data)


def _rows_file_chunks(
    path: Path, head: dict, start: int, chunk: int, digest=None, digested: bool = False, lazy: bool = False
) -> Iterator[tuple[np.ndarray, ...]]:
    """``(order, records)`` of the side file ``path`` in chunks of ``chunk`` rows, the rows never written
    drawn (``lazy``, this format or a delta on it: ``(order, records held, bool [rows] never written)``); ``digest`` (a hashlib object): fed the whole file's bytes in order on the way (this format: the
    header, bitmap and order first, unless ``digested`` says the caller's pass over the order fed them
    (:func:`order_chunks`), then the records as they are read; :data:`ROWS_FORMAT_1`: the header, the records,
    then the order, read a second time). A delta's: its base's chunks with its records laid over them
    (:func:`~hotline.training.checkpoint_delta.overlay`), ``digest`` fed the base's bytes."""
    if checkpoint_delta.is_delta(head):
        base = checkpoint_delta.base_of(path, head)
        base_head, base_start = read_header(base)
        chunks = _rows_file_chunks(base, base_head, base_start, chunk, digest, digested, lazy)
        yield from (overlay_held if lazy else checkpoint_delta.overlay)(chunks, path, head, start)
        return
    n, floats = int(head["rows"]), int(head["dim"]) + int(head["state_floats"])
    dtype = np.dtype(head["order_dtype"])
    order_at, rec_at = regions(head, start)
    first = head["format"] == ROWS_FORMAT_1
    draw = None if first else _drawer(head)
    block = chunk * int(head["record_bytes"])
    with (
        open(path, "rb") as rec_f,
        open(path, "rb") as ord_f,
        ThreadPoolExecutor(1, thread_name_prefix="hotline-rows-digest") as hashing,
    ):
        pending = None

        def feed(data) -> None:  # the digest runs on its thread while the next chunk is read and used
            nonlocal pending
            if pending is not None:
                pending.result()
            pending = hashing.submit(digest.update, data)

        if digest is not None and (first or not digested):
            _feed_blocks(rec_f, feed, 0, rec_at, block)
        rec_f.seek(rec_at)
        ord_f.seek(order_at)
        held = 0
        for lo in range(0, n, chunk):
            m = min(chunk, n - lo)
            order = np.fromfile(ord_f, dtype, m).astype(np.int64)
            if first:
                rec = np.fromfile(rec_f, np.float32, m * floats).reshape(m, floats)
                k = m
            else:
                a = lo // 8
                raw = np.frombuffer(os.pread(ord_f.fileno(), -(-(lo + m) // 8) - a, start + a), np.uint8)
                drawn = np.unpackbits(raw, bitorder="little")[lo - 8 * a : lo - 8 * a + m].astype(bool)
                k = m - int(np.count_nonzero(drawn))
                got = np.fromfile(rec_f, np.float32, k * floats).reshape(-1, floats)
                if drawn.shape[0] != m or got.shape[0] != k or (k < m and draw is None):
                    raise OSError(f"checkpoint rows {path} are corrupt or cut short (at row {lo})")
                rec = got if k == m or lazy else np.empty((m, floats), np.float32)
                if k < m and not lazy:
                    rec[~drawn] = got
                    draw(order, rec, drawn)
            held += k
            if (rec.shape[0] != m and not lazy) or order.shape[0] != m:
                raise OSError(f"checkpoint rows {path} end early (at row {lo})")
            if digest is not None and k:
                feed(memoryview(rec if first else got).cast("B"))  # the caller reads these, never writes them
            yield (order, rec, drawn) if lazy else (order, rec)
        if not first and held != int(head.get("held", -1)):
            raise OSError(
                f"checkpoint rows {path} are corrupt: {head.get('held')} records, their bitmap {held}"
            )
        if digest is not None:
            if first:
                _feed_blocks(rec_f, feed, order_at, order_at + n * dtype.itemsize, block)
            if pending is not None:
                pending.result()
        for f in (rec_f, ord_f):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def order_chunks(path: Path, head: dict, start: int, rows: int, digest=None) -> Iterator[np.ndarray]:
    """The record order of the side file ``path`` (a delta's: its base's) in chunks of ``rows`` (int64);
    ``digest``: fed the file's bytes up to its records on the way, where those are the header, bitmap and order
    (this format; then :func:`_rows_file_chunks` with ``digested`` feeds the rest), else not fed."""
    if checkpoint_delta.is_delta(head):
        base = checkpoint_delta.base_of(path, head)
        yield from order_chunks(base, *read_header(base), rows, digest)
        return
    n, dtype = int(head["rows"]), np.dtype(head["order_dtype"])
    order_at, _ = regions(head, start)
    if head["format"] == ROWS_FORMAT_1:
        digest = None
    with open(path, "rb") as f:
        if digest is not None:
            _feed_blocks(f, digest.update, 0, order_at, rows * dtype.itemsize)
        f.seek(order_at)
        for lo in range(0, n, rows):
            raw = f.read(min(rows, n - lo) * dtype.itemsize)
            order = np.frombuffer(raw, dtype)
            if order.shape[0] != min(rows, n - lo):
                raise OSError(f"checkpoint rows {path} end early (in its order, at row {lo})")
            if digest is not None:
                digest.update(raw)
            yield order.astype(np.int64)
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def load_rows(
    host, checkpoint: str | os.PathLike, chunk_bytes: int | None = None, record: dict | None = None
) -> None:
    """Copies the side file of ``checkpoint`` (checked first: :func:`check_rows`; a delta: its base with its
    records over it) into the store ``host``, chunk by chunk: every row's weights and state as the checkpoint
    holds them (the hot rows' copies too, which the caller then overwrites from the checkpoint's hot tier).
    ``record`` (the checkpoint's record of the file): where the file order is the checkpoint's, the next
    checkpoints may be deltas on the loaded one's base (:func:`~hotline.training.checkpoint_delta.resumed`);
    otherwise the next is a full copy."""
    path = rows_path(checkpoint)
    head, start = read_header(path)
    f = host.file
    untrack(f)  # what it held before is gone
    chunk = max(1, (chunk_bytes or CHUNK_BYTES) // f.record)
    lo, same = 0, True
    full = read_header(checkpoint_delta.base_of(path, head))[0] if checkpoint_delta.is_delta(head) else head
    pending = loads_lazily(host, full)  # rows never written left pending: the written rows alone loaded
    chunks = _rows_file_chunks(path, head, start, chunk, lazy=pending is not None)
    for (order, rec, *drawn), own in zip(chunks, _order_chunks(host, chunk)):
        host._wrote_nonfinite |= not np.isfinite(rec).all()
        if np.array_equal(order, own):
            if drawn:
                put_held(f, pending, lo, drawn[0], rec)
            else:
                f.put_positions(lo, rec)  # the same order: one sequential write
        else:
            if drawn:  # this chunk's rows live elsewhere in this store: drawn and written
                rec = _drawn(full, order, drawn[0], rec)
            f.put_rows(order, rec)  # another order (another placement's file): row by row
            same = False
        lo += order.shape[0]
        if (lo // chunk) % _SYNC_CHUNKS == 0:
            f.drop_page_cache()  # written out, dropped: no memory-limit's worth of dirty pages
    f.flush()
    f.drop_page_cache()
    if same and record is not None:
        checkpoint_delta.resumed(host, path, head, start, record)


def read_tables(
    checkpoint: str | os.PathLike, state_shape, state: bool = True, chunk_bytes: int | None = None
):
    """Every row's weights and state in row order, whole in memory (for a store that holds them there:
    a disk-store checkpoint loaded by the host-memory store or by ``--mode device``): ``(weights [rows, D],
    state)`` with the state in ``state_shape(rows)`` (empty without ``state``)."""
    path = rows_path(checkpoint)
    head, start = read_header(path)
    n, D, S = int(head["rows"]), int(head["dim"]), int(head["state_floats"])
    w = np.empty((n, D), np.float32)
    s = np.empty(state_shape(n) if state else (0,), np.float32)
    cols = s.reshape(n, S) if s.size else None
    chunk = max(1, (chunk_bytes or CHUNK_BYTES) // int(head["record_bytes"]))
    for order, rec in _rows_file_chunks(path, head, start, chunk):
        w[order] = rec[:, :D]
        if cols is not None:
            cols[order] = rec[:, D:]
    return w, s


def chunk_grid(table_sizes, chunk_rows: int) -> list[tuple[int, int, int, int]]:
    """Every table cut into row ranges of at most ``chunk_rows`` rows, in order: ``(table, first row, rows,
    first global row)`` each (global rows: the tables' rows one after another, as a checkpoint numbers them)."""
    grid, start = [], 0
    for t, n in enumerate(int(n) for n in table_sizes):
        grid += [(t, lo, min(chunk_rows, n - lo), start + lo) for lo in range(0, n, chunk_rows)]
        start += n
    return grid
