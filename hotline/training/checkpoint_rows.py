"""The rows of a disk-store checkpoint, streamed: a copy of the store's file beside the checkpoint, never
the whole table in memory.

A checkpoint of a run whose cold rows live on disk (``--cold-store disk``, one rank or each of N) keeps every
row and its optimizer state in a side file, ``CHECKPOINT.rows`` (``step-000000123.pt.rows``): a header, the
store's records in its file order (the row and its whole optimizer state, ``4 * (dim + state)`` bytes each,
packed; the DRAM tier's rows as they stand in memory), then that order (int32, int64 beyond 2**31 rows):
record ``i`` is row ``order[i]``. The store's file is read in order in chunks of :data:`CHUNK_BYTES` and the side
file written in order with ``O_DIRECT`` where the filesystem allows it (:func:`~hotline.training.direct_out.\
write_direct`: the read, the write and the sha256 overlap, no page cache), so the host memory it takes is a chunk
and two write buffers, not the table. The hot rows are the one part not in it: their
current values are on the device, and the checkpoint's own file holds them.

Crash-safe as every checkpoint: the side file is written under a temporary name, fsynced and renamed, and
only then the checkpoint's file (which records the side file's size and sha256) and its digest, the commit. A
run killed mid-copy leaves a temporary a later run removes, or a complete side file with no checkpoint file,
which the next run of the same fingerprint removes (the header names the run and the step: the side file is
known by its content, like the checkpoint). Loading checks the size and the sha256 (one streamed pass) before
anything is changed, then copies the records into the store chunk by chunk: position by position where the
store's order is the checkpoint's, row by row where it is not (another placement's file).
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
from hotline.tiers.written_rows import untrack
from hotline.training import checkpoint_delta
from hotline.training.direct_out import write_direct

ROWS_FORMAT = "hotline-checkpoint-rows/1"
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


def _header(host, step: int, run: dict, delta: dict | None = None) -> bytes:
    """The side file's first bytes: magic, the JSON header's length, the header (a delta's with ``delta``'s
    fields), padded to whole pages."""
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
            **(delta or {}),
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
    if not isinstance(head, dict) or head.get("format") not in (ROWS_FORMAT, checkpoint_delta.DELTA_FORMAT):
        return None
    raw = len(MAGIC) + 8 + n
    return head, raw + (-raw % _PAGE)


def _order_chunks(host, chunk: int) -> Iterator[np.ndarray]:
    """The store's row order in chunks of ``chunk`` rows, read from its file (an
    :class:`~hotline.tiers.disk_pages.OrderFile`: nothing mapped, a chunk held)."""
    from hotline.tiers.disk_pages import order_chunks

    return order_chunks(host.file.order, chunk)


def write_rows(host, checkpoint: str | os.PathLike, step: int, run: dict, chunk_bytes: int | None = None,
               base: dict | None = None) -> dict:  # fmt: skip
    """Writes the side file of ``checkpoint`` from the store ``host`` (its file in order, in chunks; the DRAM
    tier's rows from memory), atomically; returns what the checkpoint records of it (format, name, bytes,
    sha256). ``base``: a delta on it instead (:func:`~hotline.training.checkpoint_delta.delta_base`): the rows
    written since it only. A file there that is not a rows file by its content (or a link) is refused
    (ValueError), and kept."""
    path = rows_path(checkpoint)
    if path.is_symlink() or (path.exists() and read_header(path) is None):
        raise ValueError(
            f"checkpoint {checkpoint}: {path} exists and is not a checkpoint's rows file: move it away (a "
            f"disk-store checkpoint writes its rows there); nothing was written"
        )
    f_rows = host.file
    chunk = max(1, (chunk_bytes or CHUNK_BYTES) // f_rows.record)

    def pieces():
        if base is not None:
            yield _header(host, step, run, checkpoint_delta.delta_header(base, host))
            yield from checkpoint_delta.pieces(host, chunk)
            return
        yield _header(host, step, run)
        for _, rec in f_rows.read_all(chunk, rows=False):  # the order follows, read once
            yield rec
        dtype = _order_dtype(host.num_rows)
        for order in _order_chunks(host, chunk):
            yield np.ascontiguousarray(order, dtype)

    size, sha, _ = write_direct(path, pieces(), buffer_bytes=(chunk_bytes or CHUNK_BYTES) // 2)
    kind = ROWS_FORMAT if base is None else checkpoint_delta.DELTA_FORMAT
    return {"format": kind, "file": path.name, "bytes": size, "sha256": sha}


def record_of(num_rows: int, dim: int, state_floats: int) -> dict:
    """What a store of ``num_rows`` rows of ``dim`` weights and ``state_floats`` state floats each needs of a
    side file's header."""
    return {"rows": int(num_rows), "dim": int(dim), "state_floats": int(state_floats),
            "record_bytes": 4 * (int(dim) + int(state_floats))}  # fmt: skip


def _written_out(f) -> None:
    """Makes what was written to ``f`` durable and drops it from the page cache: a copy of a table larger than
    the memory limit must not fill that memory with dirty pages (a cgroup counts them)."""
    f.flush()
    os.fdatasync(f.fileno())
    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


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
        or found[0].get("format") != ROWS_FORMAT
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


def _rows_file_chunks(
    path: Path, head: dict, start: int, chunk: int, digest=None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(order, records)`` of the side file ``path`` in chunks of ``chunk`` rows; ``digest`` (a hashlib
    object): fed the whole file's bytes in order on the way (the header, the records as they are read, then
    the order, read a second time: its bytes come after all the records; a tenth of the file at dim 8). A
    delta's: its base's chunks with its records laid over them (:func:`~hotline.training.checkpoint_delta.\
overlay`), ``digest`` fed the base's bytes."""
    if checkpoint_delta.is_delta(head):
        base = checkpoint_delta.base_of(path, head)
        base_head, base_start = read_header(base)
        yield from checkpoint_delta.overlay(
            _rows_file_chunks(base, base_head, base_start, chunk, digest), path, head, start
        )
        return
    n, floats = int(head["rows"]), int(head["dim"]) + int(head["state_floats"])
    dtype = np.dtype(head["order_dtype"])
    order_at = start + n * int(head["record_bytes"])
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

        if digest is not None:
            feed(rec_f.read(start))
        rec_f.seek(start)
        ord_f.seek(order_at)
        for lo in range(0, n, chunk):
            m = min(chunk, n - lo)
            rec = np.fromfile(rec_f, np.float32, m * floats).reshape(m, floats)
            order = np.fromfile(ord_f, dtype, m).astype(np.int64)
            if rec.shape[0] != m or order.shape[0] != m:
                raise OSError(f"checkpoint rows {path} end early (at row {lo})")
            if digest is not None:
                feed(memoryview(rec).cast("B"))  # the caller reads ``rec``, never writes it
            yield order, rec
        if digest is not None:
            rec_f.seek(order_at)
            while block := rec_f.read(chunk * int(head["record_bytes"])):  # a chunk's bytes at a time
                feed(block)
            pending.result()
        for f in (rec_f, ord_f):
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
    for (order, rec), own in zip(_rows_file_chunks(path, head, start, chunk), _order_chunks(host, chunk)):
        host._wrote_nonfinite |= not np.isfinite(rec).all()
        if np.array_equal(order, own):
            f.put_positions(lo, rec)  # the same order: one sequential write
        else:
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
