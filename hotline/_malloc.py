"""Keeps glibc's allocator from handing a step's large buffers back to the kernel, only to fault them in again.

A training step on a CPU allocates the same large tensors every step (the looked-up rows, the interaction's
inputs, their gradients: tens of MiB at batch 4096). glibc serves a block above its mmap threshold with a fresh
``mmap`` and unmaps it on free, and trims the heap's top above its trim threshold, so every step pays the
kernel to zero those pages again: measured with ``ru_minflt`` on the emb-heavy config of
``benchmarks/bench_pipeline.py`` (batch 4096, dim 64), 5,000 page faults per step in device mode and 11,500-15,500
with look-ahead (whose producer thread allocates in its own arena), 14-57 ms of system time per step; with the
thresholds below, 0-1,200. PyTorch's CPU tuning guides reach the same end by preloading jemalloc or tcmalloc;
this needs no extra library: it is two ``mallopt`` calls.

:func:`keep_freed_memory` is called when a :class:`~hotline.Trainer` is made and when ``hotline calibrate``
starts (so the figures the cost model reads are taken as training runs). The cost: memory freed by a step
stays in the process for the next one (the resident size is the peak, not the average). It is a no-op off
glibc and when ``HOTLINE_MALLOC=default`` is set.

:func:`huge_zeros` gives the large arrays read and written at random rows (embedding tables, optimizer state,
scratch maps, the dispatcher's remap) a mapping of their own with transparent huge pages, so a random row does
not miss the TLB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

import numpy as np

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameters (malloc.h)."""

MMAP_THRESHOLD = 32 << 20
"""Blocks up to this size come from the heap and are reused; glibc refuses more on 64-bit (half its 64 MiB heap)."""

TRIM_THRESHOLD = 1 << 30
"""Free memory at the heap's top kept for reuse before any is returned to the kernel."""

_done: bool | None = None


def keep_freed_memory() -> bool:
    """Raises glibc's mmap and trim thresholds once per process (see the module's docstring); True when they
    are set, False where they cannot be (not glibc, or ``HOTLINE_MALLOC=default``)."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if os.environ.get("HOTLINE_MALLOC", "").strip().lower() == "default":
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows): nothing to tune
        return _done
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _done


HUGE_MIN_BYTES = 4 << 20
"""Arrays from this size up get a mapping of their own with transparent huge pages (smaller ones stay on the
heap, where the thresholds above keep them)."""


def huge_zeros(shape, dtype) -> np.ndarray:
    """A zero-filled array in an anonymous mapping of its own, advised to use transparent huge pages (2 MiB).

    For the large arrays read and written at random rows: embedding tables, their optimizer state, the
    dispatcher's remap and the update's scratch map. With 4 KiB pages nearly every random row of a table of
    GBs misses the TLB, and in a virtual machine each miss walks two page tables; with 2 MiB pages the
    translations of a GB fit the TLB. Where the kernel gives no huge pages (THP ``never``, another OS) the
    advice is ignored and the array is an ordinary zeroed mapping; below :data:`HUGE_MIN_BYTES`, np.zeros."""
    shape = tuple(int(n) for n in np.atleast_1d(shape))
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < HUGE_MIN_BYTES:
        return np.zeros(shape, dtype)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel built without THP
            pass
    return np.frombuffer(m, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)


def huge_full(shape, value, dtype) -> np.ndarray:
    """np.full in a :func:`huge_zeros` array (scratch maps of every row, all -1 between uses)."""
    out = huge_zeros(shape, dtype)
    out.fill(value)
    return out


def huge_copy(a: np.ndarray) -> np.ndarray:
    """``a``'s values in a :func:`huge_zeros` array."""
    out = huge_zeros(a.shape, a.dtype)
    out[...] = a
    return out
