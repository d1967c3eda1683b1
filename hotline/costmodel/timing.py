"""How the timing probes time: the mean of a few calls after a warm-up, with the caches flushed between calls,
under the thread counts and memory policy a Trainer runs with; and what the probes record beside their figures
(the CPU's model, the load average, how far the rounds of a figure moved)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

import numpy as np

REPEATS = 4
"""Timed calls of each shape per round (after its untimed warm-up calls)."""


def rounds_spread(rounds: list) -> float:
    """How far a figure's rounds moved: the largest (slowest - fastest) / median over its shapes."""
    a = np.asarray(rounds, dtype=np.float64).reshape(len(rounds), -1)
    mid = np.median(a, axis=0)
    return float(np.max((a.max(axis=0) - a.min(axis=0)) / np.where(mid > 0, mid, 1.0)))


def mean_s(
    fn: Callable[[], object], repeats: int = 5, warmup: int = 1, flush: Callable[[], object] | None = None
) -> float:
    """Mean seconds of ``fn`` after ``warmup`` calls: the mean, not the median, because a run's samples/s
    averages its steps, the occasional slow one (a page fault, a neighbour on a shared host) included.

    ``flush``: run (untimed) before each timed call, to start it with cold caches as a training step's host
    work does (the dense pass before it streamed hundreds of MB)."""
    for _ in range(warmup):
        fn()
    total = 0.0
    for _ in range(repeats):
        if flush is not None:
            flush()
        t0 = time.perf_counter()
        fn()
        total += time.perf_counter() - t0
    return total / repeats


def flusher(big: np.ndarray, nbytes: int = 96 << 20) -> Callable[[], None]:
    """Reads ``nbytes`` of ``big`` (more than any last-level cache), evicting what the last call left there."""
    part = big[: nbytes // big.itemsize]
    return lambda: float(part.sum())


@contextlib.contextmanager
def as_training(threads: int):
    """Timings taken as a Trainer runs them: glibc keeps a step's freed memory (the call a Trainer makes,
    :func:`hotline._malloc.keep_freed_memory`), torch and Numba at ``threads`` (Numba's capped at its pool);
    the threads they had are restored after."""
    import numba
    import torch

    from hotline._malloc import keep_freed_memory

    keep_freed_memory()
    torch_before, numba_before = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        torch.set_num_threads(torch_before)
        numba.set_num_threads(numba_before)


def with_threads(n: int, fn: Callable[[], float]) -> float:
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        return fn()
    finally:
        numba.set_num_threads(before)


def load_average() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "unknown"


def cpu_model() -> str:
    """The CPU's model name as Linux reports it (``/proc/cpuinfo``), or "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""
