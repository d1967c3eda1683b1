"""Delta checkpoints of the disk store: only the records written since the last full copy of its file.

A full checkpoint of a disk-store run copies the store's whole file into its rows file
(:mod:`hotline.training.checkpoint_rows`); from then on the file marks every position a step writes
(:mod:`hotline.tiers.written_rows`, one bit a row). The next checkpoints are deltas on that full one (their
base) as long as it can serve (:func:`delta_base`): a delta's rows file (``CHECKPOINT.rows``, format
:data:`DELTA_FORMAT`) holds a header that names its base (file name, bytes, sha256, step), the bitmap of the
positions written since the base (``ceil(rows / 8)`` bytes, padded to a page), then their records in position
order: its size is about the rows written times the record, not the table. The base plus the delta is the
store's file as it stood at the delta's step, record for record, so every reader (resume, ``evaluate``,
``predict``, ``export``) reads the base's chunks with the delta's records laid over them (:func:`overlay`).

A delta's base is always a full copy (never another delta): a chain is one file long. A checkpoint is full when
there is no base (the run's first, or after a load from another file order), when the base's file is gone,
replaced or of another size, when it lies in another directory or under the new checkpoint's own name, when
more than :data:`MAX_SHARE` of the rows were written since (a delta would be most of a copy), or after
:data:`FULL_EVERY` deltas. A delta is written as a full one is (atomically, with its sha256), before its
checkpoint's file; the bitmap is cleared only once a full checkpoint is committed. Rotation keeps a base while a
kept checkpoint needs it (:mod:`hotline.training.checkpoint_dir`); a reader refuses a delta whose base is
missing or not the one it names (its size and sha256), before it changes anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hotline.tiers.written_rows import track, tracker

DELTA_FORMAT = "hotline-checkpoint-rows-delta/1"
FULL_EVERY = 8
"""After this many deltas on one base, the next checkpoint is a full copy."""
MAX_SHARE = 0.5
"""A checkpoint is a full copy when more than this share of the rows were written since the base."""
_PAGE = 4096


def is_delta(head: dict) -> bool:
    return head.get("format") == DELTA_FORMAT


def base_of(path: Path, head: dict) -> Path:
    """The base's rows file of the delta ``path`` (same directory)."""
    return path.with_name(str(head["base"]["file"]))


def _identity(path: Path) -> tuple[int, int, int]:
    st = os.stat(path, follow_symlinks=False)
    return st.st_ino, st.st_mtime_ns, st.st_size


def delta_base(host, path: Path) -> dict | None:
    """The base a delta of the store ``host`` written to ``path`` (a rows file) would stand on, or None when
    the checkpoint must be a full copy (module docstring)."""
    written = tracker(host.file)
    base = None if written is None else written.base
    if base is None or base["deltas"] >= FULL_EVERY:
        return None
    where = Path(base["path"])
    if where.parent != path.parent or where.name == path.name:
        return None
    try:
        if _identity(where) != base["identity"]:  # removed, replaced or rewritten since it was written
            return None
    except OSError:
        return None
    if written.count() > MAX_SHARE * host.num_rows:
        return None
    return base


def delta_header(base: dict, host) -> dict:
    """What a delta's header says besides a full rows file's: its base, the rows it holds, its place in the
    chain."""
    return {
        "format": DELTA_FORMAT,
        "base": {k: base[k] for k in ("bytes", "sha256", "step")} | {"file": Path(base["path"]).name},
        "changed": tracker(host.file).count(),
        "deltas": base["deltas"] + 1,
    }


def pieces(host, chunk_rows: int) -> Iterator:
    """The bytes of a delta's body after its header: the bitmap (padded to a page), then the marked positions'
    records in position order, read ``chunk_rows`` positions of the file at a time (their pages only)."""
    bits = tracker(host.file).bits
    yield bits
    yield bytes(-bits.nbytes % _PAGE)
    f, n = host.file, host.num_rows
    step = max(1, chunk_rows // 8)
    for a in range(0, bits.shape[0], step):
        pos = np.flatnonzero(np.unpackbits(bits[a : a + step], bitorder="little")) + 8 * a
        pos = pos[pos < n]
        if pos.shape[0]:
            rows = np.asarray(f.order[pos], np.int64)  # the order's window of these positions, read once
            rec, _ = f.read_rows(rows)
            yield rec


def records_at(head: dict, start: int) -> int:
    """The byte where a delta's records start (``start``: where its bitmap starts)."""
    bits = -(-int(head["rows"]) // 8)
    return start + bits + (-bits % _PAGE)


def bits_at(f, start: int, lo: int, m: int) -> np.ndarray:
    """bool [m] (fewer where the file ends): bits ``lo .. lo + m - 1`` of the bitmap at byte ``start`` of ``f``."""
    a = lo // 8
    raw = np.frombuffer(os.pread(f.fileno(), -(-(lo + m) // 8) - a, start + a), np.uint8)
    return np.unpackbits(raw, bitorder="little")[lo - 8 * a : lo - 8 * a + m].astype(bool)


class DeltaRecords:
    """The delta ``path``'s records (header ``head``, bitmap at byte ``start``), a chunk of positions at a time in
    file order (:meth:`next`); leaving the ``with`` block without an error checks that every record was read."""

    def __init__(self, path: Path, head: dict, start: int):
        self.path, self.start, self.changed = path, start, int(head["changed"])
        self.floats = int(head["dim"]) + int(head["state_floats"])
        self._bits, self._rec = open(path, "rb"), open(path, "rb")
        self._rec.seek(records_at(head, start))
        self.lo = self.seen = 0

    def next(self, m: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The next ``m`` positions: which the delta holds (bool [m]) and their records [k, floats] (None for none)."""
        mask = bits_at(self._bits, self.start, self.lo, m)
        k = int(np.count_nonzero(mask))
        if mask.shape[0] != m or self.seen + k > self.changed:
            raise OSError(f"checkpoint rows {self.path} end early or mark more rows than they hold")
        new = None
        if k:
            new = np.fromfile(self._rec, np.float32, k * self.floats)
            if new.shape[0] != k * self.floats:
                raise OSError(f"checkpoint rows {self.path} end early (at changed row {self.seen})")
            new = new.reshape(k, self.floats)
        self.lo, self.seen = self.lo + m, self.seen + k
        return mask, new

    def __enter__(self) -> DeltaRecords:
        return self

    def __exit__(self, kind, *_) -> None:
        for f in (self._bits, self._rec):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            f.close()
        if kind is None and self.seen != self.changed:
            raise OSError(
                f"checkpoint rows {self.path} hold {self.changed} changed rows, their bitmap {self.seen}"
            )


def overlay(base_chunks, path: Path, head: dict, start: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The base's ``(order, records)`` chunks (``base_chunks``, in file order, their records writable) with the
    records of the delta ``path`` (header ``head``, bitmap at byte ``start``) laid over them."""
    with DeltaRecords(path, head, start) as delta:
        for order, rec in base_chunks:
            mask, new = delta.next(order.shape[0])
            if new is not None:
                rec = rec.copy()  # the base's digest may still be reading its bytes
                rec[mask] = new
            yield order, rec


def committed(host, path: Path, record: dict, step: int) -> None:
    """After the checkpoint of ``step`` whose rows ``host`` wrote to ``path`` (``record``: what its file records
    of them) is committed: a full copy becomes the base of the next
    deltas (nothing marked since), a delta counts one more on its base."""
    if record.get("format") != DELTA_FORMAT:
        track(host.file).base = {"path": str(path), "bytes": int(record["bytes"]), "sha256": record["sha256"],
                                 "step": int(step), "identity": _identity(path), "deltas": 0}  # fmt: skip
    else:
        tracker(host.file).base["deltas"] += 1


def resumed(host, path: Path, head: dict, start: int, record: dict) -> None:
    """After the rows file ``path`` (header ``head``, its body at ``start``; ``record``: its checkpoint's record
    of it) was loaded into ``host`` position by position: the next checkpoints are deltas on the loaded one's
    base, with the positions its delta holds marked (a full one: nothing marked)."""
    if not is_delta(head):
        committed(host, path, record, int(head["step"]))
        return
    base = base_of(path, head)
    written = track(host.file)
    written.base = {"path": str(base), "bytes": int(head["base"]["bytes"]), "sha256": head["base"]["sha256"],
                    "step": int(head["base"]["step"]), "identity": _identity(base),
                    "deltas": int(head["deltas"])}  # fmt: skip
    with open(path, "rb") as f:
        f.seek(start)
        bits = np.fromfile(f, np.uint8, written.bits.shape[0])
    written.bits[:] = bits
