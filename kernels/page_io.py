"""Runs of pages read or written with ``pread``/``pwrite`` in a Numba loop that holds no GIL: a step's disk reads
(thousands of 4 KiB requests once its rows were written, on up to ``--cold-io-depth`` threads) would otherwise
take the GIL back after every request and slow the step's compute on the other threads.

:func:`io_runs` stops at the first request that does not move all its bytes and returns its index: the caller
issues that one and the rest through ``os.preadv``/``os.pwritev`` (its twin, :func:`io_runs_twin`), which retries
an interrupted call and raises the error named. Where libc's ``pread`` cannot be found (not Linux), ``AVAILABLE``
is False and the callers use the twin alone. ``tests/test_page_io.py`` checks both against each other.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
from numba import njit

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _pread, _pwrite = _libc.pread, _libc.pwrite
    for _f in (_pread, _pwrite):  # the buffer's address passed as an integer of a pointer's width
        _f.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int64]
        _f.restype = ctypes.c_ssize_t
    AVAILABLE = True
except (OSError, AttributeError):  # pragma: no cover - not a libc with pread
    AVAILABLE = False


if AVAILABLE:
    # not cached: Numba keeps no ctypes pointer across processes (compiled in well under 1 s)
    @njit(nogil=True)
    def _read_runs(fd, base, at, off, size):
        for i in range(at.shape[0]):
            if _pread(fd, base + at[i], size[i], off[i]) != size[i]:
                return i
        return -1

    @njit(nogil=True)
    def _write_runs(fd, base, at, off, size):
        for i in range(at.shape[0]):
            if _pwrite(fd, base + at[i], size[i], off[i]) != size[i]:
                return i
        return -1


def io_runs(
    write: bool, fd: int, buffer: np.ndarray, at: np.ndarray, off: np.ndarray, size: np.ndarray
) -> int:
    """Reads (or writes) ``size[i]`` bytes at file offset ``off[i]`` into (from) ``buffer`` (contiguous uint8) at
    byte ``at[i]``, in order, the GIL released; returns -1, or the index of the first request that moved fewer
    bytes (an error, an interrupt, the file's end: the caller goes on from there with :func:`io_runs_twin`)."""
    if not at.shape[0]:
        return -1
    if not AVAILABLE or not buffer.flags.c_contiguous or buffer.dtype != np.uint8:
        return 0  # every request through the twin
    run = _write_runs if write else _read_runs
    return int(run(fd, buffer.ctypes.data, np.asarray(at, np.int64), np.asarray(off, np.int64),
                   np.asarray(size, np.int64)))  # fmt: skip


def io_runs_twin(write: bool, fd: int, buffer: np.ndarray, at, off, size) -> list[int]:
    """:func:`io_runs` through ``os.preadv``/``os.pwritev``: the bytes each request moved (OSError as raised)."""
    mem = memoryview(buffer)
    call = os.pwritev if write else os.preadv
    return [call(fd, [mem[a : a + n]], o) for a, o, n in zip(np.asarray(at).tolist(), np.asarray(off).tolist(),
                                                            np.asarray(size).tolist())]  # fmt: skip
