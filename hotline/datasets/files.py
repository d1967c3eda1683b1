"""One ``.npy`` array file of a dataset directory, checked when it is opened and read without a memory map.

A memory-mapped file that shrinks while a run reads it kills the process with SIGBUS (exit 135, no message).
An :class:`ArrayFile` instead validates the file at open (the ``.npy`` header against meta.json's shape and
dtype, and the file's size against the header: nothing missing, nothing extra) and reads rows with ``pread``
into fresh arrays: a short read, or a file whose size, time or identity changed since it was opened, is a
:class:`DatasetError` naming the file. It also gives each file a cheap content digest
(:func:`sampled_digest`), so that a file swapped for (or linked to) another dataset's is refused.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np


class DatasetError(ValueError):
    """A dataset directory is missing, incomplete, or does not match its meta.json."""


DIGEST_BLOCK = 1 << 16
DIGEST_BLOCKS = 16
""":func:`sampled_digest` hashes the whole of a file up to 1 MiB, else 16 blocks of 64 KiB spread evenly over it
(the first and the last included): at most 1 MiB read per file, whatever its size."""


GATHER_BLOCK_BYTES = 8 << 20
"""Rows picked by index (a random sample) are read in stretches of at most this many bytes: a stretch where
they are dense (at least one row in 16) in one read, a sparse one run of consecutive rows by run."""


def sampled_digest(fd: int, size: int) -> str:
    """A cheap content digest of the open file ``fd`` of ``size`` bytes: SHA-256 of its size and of
    :data:`DIGEST_BLOCKS` evenly spread blocks (the whole file when it is small)."""
    h = hashlib.sha256(str(size).encode())
    if size <= DIGEST_BLOCK * DIGEST_BLOCKS:
        offsets = range(0, size, DIGEST_BLOCK)
    else:
        last = size - DIGEST_BLOCK
        offsets = sorted({last * i // (DIGEST_BLOCKS - 1) for i in range(DIGEST_BLOCKS)})
    for offset in offsets:
        h.update(os.pread(fd, DIGEST_BLOCK, offset))
    return h.hexdigest()


class ArrayFile:
    """A read-only ``.npy`` file of known shape and dtype, read row by row with ``pread`` (no memory map).

    Indexing returns a fresh in-memory array: ``a[lo:hi]``, ``a[i]``, ``a[rows]`` (an integer array: the
    profiler's random sample), and ``np.asarray(a)`` for the whole file. Every read first checks that the file
    is still the one opened (:meth:`check_unchanged`)."""

    def __init__(self, path: str | os.PathLike, shape: tuple[int, ...], dtype):
        self.path = Path(path)
        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        self._file = open(self.path, "rb")  # noqa: SIM115 - held for the life of the object; closed in close()
        try:
            header = self._read_header()
            if header is not None:
                raise DatasetError(f"{self.path} cannot be read as a .npy array: {header}")
            st = os.fstat(self._file.fileno())
            want = self.offset + self.nbytes
            if st.st_size != want:
                what = "is truncated" if st.st_size < want else "has extra bytes at its end"
                raise DatasetError(
                    f"{self.path} {what}: it has {st.st_size:,} bytes, but its .npy header and meta.json's "
                    f"shape {self.shape} {self.dtype} need {want:,}"
                )
            self._identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            self.digest = sampled_digest(self._file.fileno(), st.st_size)
        except BaseException:
            self._file.close()
            raise

    def _read_header(self) -> str | None:
        """Reads and checks the ``.npy`` header (sets ``offset``); returns what is wrong with it, or None."""
        f = self._file
        start = f.read(6)
        if start[:2] == b"PK":
            return "it is a zip archive (an .npz file?), not a single .npy array"
        if start != b"\x93NUMPY":
            return "it does not start with the .npy magic bytes"
        f.seek(0)
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                return f".npy format version {version} is not supported (1.0 and 2.0 are)"
        except (ValueError, OSError, EOFError) as e:
            return f"its header is damaged ({e})"
        if dtype.hasobject:
            return "it holds Python objects (a pickle), which Hotline never loads"
        if tuple(shape) != self.shape or dtype != self.dtype:
            raise DatasetError(
                f"{self.path} has shape {tuple(shape)} and dtype {dtype}; meta.json expects {self.shape} "
                f"{self.dtype}"
            )
        if fortran and len(shape) > 1:
            return "it is stored in Fortran order; Hotline writes C order"
        self.offset = f.tell()
        return None

    # ----------------------------------------------------------------------------------------- shape
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"ArrayFile({str(self.path)!r}, shape={self.shape}, dtype={self.dtype})"

    # ----------------------------------------------------------------------------------------- reads
    def check_unchanged(self) -> None:
        """Raises DatasetError if the file was truncated, rewritten or replaced since it was opened."""
        st = os.fstat(self._file.fileno())
        now = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        try:
            named = os.stat(self.path)
            replaced = (named.st_dev, named.st_ino) != now[:2]
        except OSError:
            replaced = True
        if now != self._identity or replaced:
            how = (
                f"its size went from {self._identity[2]:,} to {st.st_size:,} bytes"
                if st.st_size != self._identity[2]
                else "it was replaced or removed"
                if replaced
                else "it was written to"
            )
            raise DatasetError(
                f"{self.path} changed while this run was reading it ({how}): a dataset must not be rewritten "
                "under a running job; run again once it is complete"
            )

    def _read_rows(self, out: np.ndarray, first: int) -> None:
        """Fills ``out`` (C-contiguous, rows of this file) with rows ``first..`` read from the file."""
        view = memoryview(out.reshape(-1).view(np.uint8))
        offset, done = self.offset + first * self.row_bytes, 0
        while done < len(view):
            n = os.preadv(self._file.fileno(), [view[done:]], offset + done)
            if n <= 0:
                self.check_unchanged()  # names the change when there was one
                raise DatasetError(
                    f"{self.path}: read {offset + done:,} bytes into the file and found its end: the file is "
                    "shorter than when it was opened"
                )
            done += n

    def _rows(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((max(0, stop - start), *self.shape[1:]), self.dtype)
        if out.size:
            self._read_rows(out, start)
        return out

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        """Rows at the integer positions ``rows`` (any order, repeats allowed), read run by run."""
        n = self.shape[0]
        if rows.size == 0:
            return np.empty((0, *self.shape[1:]), self.dtype)
        rows = np.where(rows < 0, rows + n, rows).astype(np.int64, copy=False)
        if rows.min() < 0 or rows.max() >= n:
            raise IndexError(f"{self.path}: row index out of range [0, {n})")
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        unique, first_of = np.unique(ordered, return_index=True)
        got = np.empty((len(unique), *self.shape[1:]), self.dtype)
        block = max(1, GATHER_BLOCK_BYTES // max(1, self.row_bytes))
        i = 0
        while i < len(unique):  # block by block: a dense stretch in one read, a sparse one run by run
            j = int(np.searchsorted(unique, unique[i] + block))
            part = unique[i:j]
            if part[-1] - part[0] + 1 <= 16 * len(part):
                got[i:j] = self._rows(int(part[0]), int(part[-1]) + 1)[part - part[0]]
            else:
                breaks = np.flatnonzero(np.diff(part) != 1) + 1
                for a, b in zip(np.r_[0, breaks], np.r_[breaks, len(part)]):
                    self._read_rows(got[i + a : i + b], int(part[a]))
            i = j
        out = np.empty((len(rows), *self.shape[1:]), self.dtype)
        out[order] = got[np.searchsorted(unique, ordered)]
        return out

    def __getitem__(self, index) -> np.ndarray:
        rest = ()
        if isinstance(index, tuple):
            index, rest = (index[0], index[1:]) if index else (slice(None), ())
        self.check_unchanged()
        if isinstance(index, slice):
            start, stop, step = index.indices(self.shape[0])
            if step == 1:
                out = self._rows(start, stop)
            else:
                out = self._gather(np.arange(start, stop, step, dtype=np.int64))
        elif isinstance(index, (int, np.integer)):
            i = int(index) + (self.shape[0] if index < 0 else 0)
            if not 0 <= i < self.shape[0]:
                raise IndexError(f"{self.path}: row {int(index)} out of range [0, {self.shape[0]})")
            row = self._rows(i, i + 1)[0]
            return row[rest] if rest else row
        else:
            rows = np.asarray(index)
            if rows.dtype == bool:
                rows = np.flatnonzero(rows)
            out = self._gather(rows.reshape(-1)).reshape(*rows.shape, *self.shape[1:])
        return out[(slice(None), *rest)] if rest else out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self[:]
        return a if dtype is None else a.astype(dtype, copy=False)

    def __reduce__(self):
        return ArrayFile, (
            self.path,
            self.shape,
            self.dtype.str,
        )  # another process opens (and checks) it anew

    def close(self) -> None:
        self._file.close()

    def __del__(self) -> None:
        f = getattr(self, "_file", None)
        if f is not None:
            f.close()
