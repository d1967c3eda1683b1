"""Phase times on the device's own clock: CUDA events around each phase, on the stream that runs it.

Host timers around asynchronous launches measure launch cost, not work. :class:`StreamPhases` records an
event pair per phase on the phase's stream (copy-in on the side stream; compute, sparse update and copy-back
on the compute stream) and reads them after one final synchronise: per-phase device seconds, the share of
the window the device was busy (the union of all intervals), and how much copy-in time overlapped compute.
On the CPU the same object records host clock intervals, so the interval arithmetic is tested there.

A benchmark installs it before the first step and skips its warm-up by step (``from_step``): installed
after the warm-up, the look-ahead's copies of the K+1 steps prepared during it would go unrecorded while
their compute is recorded.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch

COPY_PHASES = ("h2d",)
"""Phases that run on the side (copy) stream; the rest run on the compute stream."""


class _HostEvent:
    """A CPU stand-in for ``torch.cuda.Event(enable_timing=True)`` (seconds from a shared origin)."""

    def __init__(self, origin: float):
        self.origin = origin
        self.t = 0.0

    def record(self, stream=None) -> None:
        self.t = time.perf_counter() - self.origin


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by ``intervals`` ([start, end) pairs, any order, overlapping or not)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def intersection_length(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Length of time covered by both ``xs`` and ``ys`` (each a list of intervals)."""
    return union_length(xs) + union_length(ys) - union_length(xs + ys)


class StreamPhases:
    """Records device intervals of named phases; :meth:`summary` after the run (it synchronises once).

    ``from_step``: phases tagged with an earlier step (the warm-up) are not recorded."""

    def __init__(self, device: torch.device | str, from_step: int = 0):
        self.device = torch.device(device)
        self.from_step = int(from_step)
        self.cuda = self.device.type == "cuda"
        self._origin = time.perf_counter()
        self._pairs: dict[str, list[tuple[object, object]]] = defaultdict(list)
        self._first = None

    def _event(self):
        return torch.cuda.Event(enable_timing=True) if self.cuda else _HostEvent(self._origin)

    def phase(self, name: str, stream=None, step: int | None = None):
        """Times the work queued inside the block on ``stream`` (the current stream of the device if None);
        ``step``: the step the work belongs to (untimed before ``from_step``; None: always timed)."""
        if step is not None and step < self.from_step:
            return contextlib.nullcontext()
        return self._timed(name, stream)

    @contextlib.contextmanager
    def _timed(self, name: str, stream):
        start, end = self._event(), self._event()
        if self.cuda:
            stream = stream if stream is not None else torch.cuda.current_stream(self.device)
            start.record(stream)
        else:
            start.record()
        try:
            yield
        finally:
            end.record(stream) if self.cuda else end.record()
            if self._first is None:
                self._first = start
            self._pairs[name].append((start, end))

    def intervals(self) -> dict[str, list[tuple[float, float]]]:
        """Seconds since the first recorded event, per phase (synchronises the device first)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            first = self._first
            return {k: [(first.elapsed_time(a) / 1e3, first.elapsed_time(b) / 1e3) for a, b in v]
                    for k, v in self._pairs.items()}  # fmt: skip
        return {k: [(a.t, b.t) for a, b in v] for k, v in self._pairs.items()}

    def summary(self) -> dict:
        """Per-phase device seconds, busy share of the recorded window, and copy/compute overlap."""
        spans = self.intervals()
        everything = [iv for v in spans.values() for iv in v]
        if not everything:
            return {"phase_s": {}, "busy_share": 0.0, "copy_overlap_share": 0.0, "window_s": 0.0}
        window = max(b for _, b in everything) - min(a for a, _ in everything)
        copies = [iv for k in COPY_PHASES for iv in spans.get(k, [])]
        compute = [iv for k, v in spans.items() if k not in COPY_PHASES for iv in v]
        copy_time = union_length(copies)
        return {
            "phase_s": {k: sum(b - a for a, b in v) for k, v in spans.items()},
            "busy_share": union_length(everything) / window if window > 0 else 1.0,
            "copy_overlap_share": intersection_length(copies, compute) / copy_time if copy_time > 0 else 0.0,
            "window_s": window,
        }
