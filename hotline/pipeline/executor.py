"""Pipelined executor: gathers the cold rows of later steps while the current step computes, and stays exact.

With look-ahead K, a producer thread loads, dispatches and gathers steps i+1..i+K (and, on CUDA, copies them
to the device on a side stream) while the main thread computes step i; a writer thread stores each step's
updated working rows back into host memory. Bounded queues give back-pressure, so memory does not grow with
the run's length, and the staging buffers form a ring of K + 3 slots reused for the whole run.

Exactness under look-ahead: a gather for step j may read a cold row that an earlier step, still in flight,
is about to update. Every row records the last step whose working set held it (``owner``); when step j is
dispatched, rows whose owner had not finished writing back are listed as stale, and just before step j
computes (after every earlier write-back has landed) those rows are read again. The result equals the
sequential step (``--lookahead 0``) and ``--mode device``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch

from hotline.datasets.format import Batch
from hotline.kernels.dispatch import claim_rows
from hotline.modes import StepStats
from hotline.tiers import PreparedStep, TieredMode

_END = object()
_POLL_S = 0.05


class _Failure:
    """An exception raised on a worker thread, carried to the main thread with its traceback."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class Executor:
    """Runs training steps with look-ahead ``lookahead`` over a :class:`TieredMode`.

    ``compute_step(prep) -> StepStats`` runs the step's compute (forward, backward, optimizer steps) on the
    main thread; the executor does everything around it. No thread or buffer outlives :meth:`progress`.
    """

    def __init__(
        self,
        mode: TieredMode,
        compute_step: Callable[[PreparedStep], StepStats],
        lookahead: int = 2,
        worker_threads: int = 1,
    ):
        if lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {lookahead}")
        self.mode = mode
        self.compute_step = compute_step
        self.lookahead = lookahead
        self.worker_threads = worker_threads
        self.ring = len(mode._staging)
        if lookahead and self.ring < lookahead + 3:
            raise ValueError(
                f"the mode has {self.ring} staging buffers; look-ahead {lookahead} needs {lookahead + 3}"
            )

    # -- the pipeline ------------------------------------------------------------------------------------
    def progress(self, batches: Iterable[Batch]) -> Iterator[StepStats]:
        """Runs one step per batch, yielding each step's stats in order."""
        if self.lookahead == 0:
            yield from self._sequential(batches)
            return
        self._written = 0  # steps < _written have their rows back in host memory
        self._computed = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._owner = np.full(self.mode.cold.w.shape[0], -1, dtype=np.int64)
        ready: queue.Queue = queue.Queue(maxsize=self.lookahead)
        self._write_q: queue.Queue = queue.Queue(maxsize=self.ring)
        self._writer_error: BaseException | None = None
        self._write_time = 0.0  # write-back seconds not yet reported (the writer runs behind the steps)
        copy_stream = torch.cuda.Stream(self.mode.device) if self.mode.device.type == "cuda" else None
        producer = threading.Thread(
            target=self._produce,
            args=(iter(batches), ready, copy_stream),
            name="hotline-prepare",
            daemon=True,
        )
        writer = threading.Thread(target=self._write_back_loop, name="hotline-write-back", daemon=True)
        producer.start()
        writer.start()
        step = 0
        try:
            while True:
                t0 = time.perf_counter()
                item = self._get(ready)
                waited = time.perf_counter() - t0
                if item is _END or item is None:  # None: stopped by a writer error
                    self._raise_writer_error()
                    break
                if isinstance(item, _Failure):
                    raise item.exc
                self._raise_writer_error()
                if item.stale is not None and item.stale.size:
                    t1 = time.perf_counter()
                    self._wait_written(step)
                    waited += time.perf_counter() - t1
                    self.mode.refresh(item)
                stats = self.compute_step(item)
                copied = self.mode.start_write_back(item)
                self._put(self._write_q, (item, copied))
                stats.times["stall"] = waited
                with self._cond:
                    stats.times["write_back"], self._write_time = self._write_time, 0.0
                stats.counters["stale_rows"] = 0 if item.stale is None else int(item.stale.size)
                step += 1
                self._computed = step
                yield stats
            self._put(self._write_q, _END)
            self._wait_written(step)
            self._raise_writer_error()
        finally:
            self._stop.set()
            producer.join()
            writer.join()  # it drains the rows already queued, then sees the stop
            self._owner = None

    def drain(self) -> None:
        """Blocks until every step yielded so far has written its rows back (call between yields)."""
        if self.lookahead and getattr(self, "_cond", None) is not None:
            self._wait_written(self._computed)

    def _sequential(self, batches: Iterable[Batch]) -> Iterator[StepStats]:
        for batch in batches:
            prep = self.mode.prepare(batch)
            stats = self.compute_step(prep)
            t0 = time.perf_counter()
            self.mode.finish_write_back(prep, self.mode.start_write_back(prep))
            stats.times["write_back"] = time.perf_counter() - t0
            stats.times["stall"] = sum(
                stats.times.get(k, 0.0) for k in ("dispatch", "gather", "h2d", "write_back")
            )
            yield stats

    # -- worker threads ----------------------------------------------------------------------------------
    def _produce(self, batches: Iterator[Batch], ready: queue.Queue, copy_stream) -> None:
        import numba

        numba.set_num_threads(max(1, min(self.worker_threads, numba.config.NUMBA_NUM_THREADS)))
        try:
            for j, batch in enumerate(_stoppable(batches, self._stop)):
                # The staging slot of step j was last used by step j - ring: its write-back must be done.
                self._wait_written(j - self.ring + 1)
                fresh_before = self._written

                def claim(ws, j=j, fresh_before=fresh_before):
                    return claim_rows(ws, self._owner, j, fresh_before)

                prep = self.mode.prepare(batch, claim=claim, copy_stream=copy_stream)
                prep.step = j
                if not self._put(ready, prep):
                    return
            self._put(ready, _END)
        except BaseException as e:  # noqa: BLE001 - carried to the main thread
            self._put(ready, _Failure(e))

    def _write_back_loop(self) -> None:
        while True:
            item = self._get(self._write_q)
            if item is _END or item is None:
                return
            prep, copied = item
            try:
                t0 = time.perf_counter()
                self.mode.finish_write_back(prep, copied)
                elapsed = time.perf_counter() - t0
            except BaseException as e:  # noqa: BLE001
                self._writer_error = e
                self._stop.set()
            with self._cond:
                self._written = prep.step + 1
                self._write_time += elapsed if self._writer_error is None else 0.0
                self._cond.notify_all()
            if self._writer_error is not None:
                return

    # -- helpers -----------------------------------------------------------------------------------------
    def _wait_written(self, upto: int) -> None:
        """Blocks until every step < ``upto`` has been written back (or the run stops)."""
        with self._cond:
            while self._written < upto and not self._stop.is_set():
                self._cond.wait(_POLL_S)
        self._raise_writer_error()

    def _raise_writer_error(self) -> None:
        if self._writer_error is not None:
            raise self._writer_error

    def _put(self, q: queue.Queue, item) -> bool:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: queue.Queue):
        while True:
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                if self._stop.is_set():
                    return None
                if q is not self._write_q and self._writer_error is not None:
                    raise self._writer_error from None


def _stoppable(it: Iterator, stop: threading.Event) -> Iterator:
    for x in it:
        if stop.is_set():
            return
        yield x


def overlap_ratio(times: dict[str, float]) -> float:
    """Share of the data-movement time (dispatch, gather, copies, write-back) hidden behind compute."""
    movement = sum(times.get(k, 0.0) for k in ("dispatch", "gather", "h2d", "write_back"))
    if movement <= 0:
        return 1.0
    return float(min(1.0, max(0.0, 1.0 - times.get("stall", 0.0) / movement)))
