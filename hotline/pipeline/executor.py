"""Pipelined executor: prepares the cold rows of later steps while the current step computes, and stays exact.

With look-ahead K, a producer thread loads, dispatches and fetches steps i+1..i+K (and, on CUDA, copies them
to the device on a side stream) while the main thread computes step i; a writer thread stores each step's
updated working rows back into the cold store (on N ranks: sends its cold gradients to the rows' owners),
starting once the step's sparse update is done, beside its dense all-reduce. Bounded queues give
back-pressure, so memory does not grow with the run's length, and the staging buffers form a ring of K + 3
slots reused for the whole run. The same executor runs one rank or N: on N ranks the producer threads of all
ranks agree before each step whether to go on (one all-reduce on the look-ahead group), so they stop together
at the end, when one rank's caller stops early, or when another rank failed; they also exchange each step's
count of distinct hot rows there, so the step's hot-row exchange runs no collective of sizes on the main
thread.

Exactness under look-ahead (the claim rule, applied by the cold store when it fetches ahead): a fetch for
step j may read a cold row that an earlier step, still in flight, is about to update. Every row records the
last step whose working set held it; when step j is fetched, rows whose holder had not finished its update
are flagged stale, and before step j first reads its working rows (after its popular micro-batch, once every
earlier update has landed or from a live step's buffer) those rows are read again. The result equals the
sequential step (``--lookahead 0``) and ``--mode device``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial

import numpy as np
import torch

from hotline.datasets.format import Batch
from hotline.distributed.comm import Comm
from hotline.kernels import sparse_update
from hotline.kinds import DEFAULT_LOOKAHEAD, Mode, staging_slots
from hotline.pipeline.threads import END, POLL_S, CoreShare, Producer, Worker, check_concurrent_kernels
from hotline.tiers.base import StepStats
from hotline.tiers.tiered import PreparedStep, TieredMode

MOVEMENT = ("dispatch", "gather", "h2d", "write_back")
"""The phases that move rows (what look-ahead hides behind compute)."""


class Executor:
    """Runs training steps with look-ahead ``lookahead`` over a :class:`TieredMode` (one rank or N).

    ``compute_step(prep) -> StepStats`` runs the step's compute (forward, backward, optimizer steps) on the
    main thread; the executor does everything around it. No thread or buffer outlives :meth:`progress`.
    """

    def __init__(
        self,
        mode: TieredMode,
        compute_step: Callable[[PreparedStep], StepStats],
        lookahead: int = DEFAULT_LOOKAHEAD,
        worker_threads: int = 1,
        forward_stale: bool = True,
        share_cores: bool = False,
        hook: Callable[[str, int], None] | None = None,
    ):
        if lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {lookahead}")
        self.mode = mode
        self.compute_step = compute_step
        self.lookahead = lookahead
        self.worker_threads = worker_threads
        self.share_cores = (
            share_cores  # apply CoreShare's thread rule to the compute (changes torch's threads)
        )
        self.forward_stale = (
            forward_stale  # stale rows from a live earlier step's buffer, not after its write-back
        )
        self.ring = len(mode._staging)
        if lookahead and self.ring < (need := staging_slots(Mode.HOTLINE, lookahead)):
            raise ValueError(f"the mode has {self.ring} staging buffers; look-ahead {lookahead} needs {need}")
        self._cond: threading.Condition | None = None
        self._computed = 0
        # Tests only (None in production): called as hook(point, step) at "prepared" (producer, step j is in its
        # staging slot), "submitted" (main, step i is live and queued for write-back), "write_back" and
        # "written" (writer, before and after step i's rows are stored); it may block to widen a race window.
        self._hook = hook or _no_hook

    # -- the pipeline ------------------------------------------------------------------------------------
    def progress(self, batches: Iterable[Batch]) -> Iterator[StepStats]:
        """Runs one step per batch, yielding each step's stats in order."""
        if self.lookahead == 0:
            yield from self._sequential(batches)
            return
        check_concurrent_kernels()  # before any thread starts: workqueue would abort the process
        self._written = 0  # steps < _written have their rows back in the cold store
        self._computed = 0
        self._cond = threading.Condition()
        self._write_time = 0.0  # write-back seconds not yet reported (the writer runs behind the steps)
        self._live: dict[int, PreparedStep] = {}  # computed steps whose rows are not written back yet
        self._busy = 0.0  # seconds the producer and writer worked since the last step (the core-share rule)
        share = CoreShare(self.worker_threads, device=self.mode.device)  # on CUDA: torch's threads unchanged
        mode = self.mode
        copy_stream = torch.cuda.Stream(mode.device) if mode.device.type == "cuda" else None
        with mode.cold.lookahead() as channel:
            # Both threads bind the mode's device when they start (CUDA's current device is per thread).
            producer = Producer("hotline-prepare", self.lookahead, self.worker_threads, device=mode.device)
            writer = Worker(
                "hotline-write-back", self._write_back, self.ring, on_error=self._wake, device=mode.device
            )
            self._writer = writer
            try:
                producer.start(self._prepared(batches, channel, producer, copy_stream), run_to_end=True)
                for step in itertools.count():
                    t0 = time.perf_counter()
                    item = producer.get(check=writer.raise_error)
                    waited = time.perf_counter() - t0
                    if item is END:
                        break
                    writer.raise_error()
                    refreshed = {"forwarded": 0, "s": 0.0}
                    # The compute runs both at its points (PreparedStep.reached): the refresh waits for the
                    # earlier steps' updates only once the popular micro-batch is computed, and the write-back
                    # starts before the dense all-reduce, so the two overlap the compute on either side.
                    item.hooks["cold"] = partial(self._refresh, item, step, share, refreshed)
                    item.hooks["updated"] = partial(self._submit, item, step, writer)
                    # with share_cores, the producer keeps its measured share of the cores; without, torch
                    # keeps its threads (its reductions then match device mode's bit for bit)
                    with share.lowered() if self.share_cores else _unchanged() as threads:
                        stats = self.compute_step(item)
                    if item.hooks:
                        raise RuntimeError(f"step {step}'s compute never reached {sorted(item.hooks)}: "
                                           f"compute_step must run the mode's compute")  # fmt: skip
                    forwarded = refreshed["forwarded"]
                    waited += refreshed["s"]
                    with self._cond:
                        busy, self._busy = self._busy, 0.0
                    share.record(busy, time.perf_counter() - t0)
                    stats.counters["compute_threads"] = threads
                    stats.counters["producer_busy_share"] = share.busy_share
                    stats.times["stall"] = waited
                    # the stale rows read again: part of the stall, so a counter, not a phase (phases add up)
                    stats.counters["refresh_s"] = refreshed["s"]
                    with self._cond:
                        stats.times["write_back"], self._write_time = self._write_time, 0.0
                    stats.counters["stale_rows"] = int(item.stale.size)
                    stats.counters["stale_forwarded"] = forwarded
                    self._computed = step + 1
                    yield stats
                writer.finish()
            finally:
                producer.close()
                writer.close()  # it drains the rows already queued, then sees the stop
                self._cond = None
                self._live = {}
                # The writer's function is this executor's method: no reference cycle outlives the run.
                self._writer = None

    def _refresh(self, item: PreparedStep, step: int, share: CoreShare, out: dict) -> None:
        """Reads step ``step``'s stale rows again (a collective on N ranks: every rank, every step), once the
        earlier steps' updates landed or from their live buffers (``out``: what was forwarded, the seconds)."""
        mode = self.mode
        if not mode.needs_refresh(item):
            return
        t0 = time.perf_counter()
        if self.forward_stale and mode.cold.forwards_stale:
            # Under the lock no write-back completes, so no live step's staging slot is reused by the
            # producer while its rows are read.
            with self._cond, share.between_steps():
                out["forwarded"] = mode.refresh(item, self._live)
        else:
            self._wait_written(step)
            with share.between_steps():
                mode.refresh(item)
        out["s"] = time.perf_counter() - t0

    def _submit(self, item: PreparedStep, step: int, writer: Worker) -> None:
        """Hands step ``step``'s final rows (or, sharded, its gradients) to the writer: live first."""
        with self._cond:
            self._live[step] = item
        writer.submit((item, self.mode.start_write_back(item)))
        self._hook("submitted", step)

    def drain(self) -> None:
        """Blocks until every step yielded so far has written its rows back (call between yields)."""
        if self.lookahead and self._cond is not None:
            self._wait_written(self._computed)

    def _sequential(self, batches: Iterable[Batch]) -> Iterator[StepStats]:
        for batch in batches:
            prep = self.mode.prepare(batch)
            stats = self.compute_step(prep)
            t0 = time.perf_counter()
            self.mode.finish_write_back(prep, self.mode.start_write_back(prep))
            stats.times["write_back"] = time.perf_counter() - t0
            stats.times["stall"] = sum(stats.times.get(k, 0.0) for k in MOVEMENT)
            yield stats

    # -- the two threads ---------------------------------------------------------------------------------
    def _prepared(self, batches: Iterable[Batch], channel, producer: Producer, copy_stream):
        """The producer's source: step j's batch dispatched, fetched ahead and copied to the device."""
        source = batches
        batches = iter(batches)
        for j in itertools.count():
            batch = None if producer.stopping else next(batches, None)
            # Every rank's thread takes the same decision, or one would wait forever in a collective.
            if not channel.all_ok(batch is not None):
                if batch is not None and hasattr(source, "give_back"):  # another rank stopped here: not lost
                    source.give_back(batch)
                return
            # The staging slot of step j was last used by step j - ring: its write-back must be done, even
            # when the run is stopping (the writer drains every computed step; preparing into the slot
            # before that would hand the draining writer overwritten rows to store).
            if not self._wait_written(j - self.ring + 1):
                raise RuntimeError(f"step {j - self.ring} was never written back; step {j} not prepared")
            t0 = time.perf_counter()
            prep = self.mode.prepare(batch, step=j, copy_stream=copy_stream)
            prep.hot_sizes = _hot_sizes(channel, self.mode, prep)
            with self._cond:
                self._busy += time.perf_counter() - t0
            self._hook("prepared", j)
            yield prep

    def _write_back(self, item) -> None:
        prep, copied = item
        self._hook("write_back", prep.step)
        t0 = time.perf_counter()
        self.mode.finish_write_back(prep, copied)
        elapsed = time.perf_counter() - t0
        with self._cond:
            self._written = prep.step + 1
            self._live.pop(prep.step, None)
            self._write_time += elapsed
            self._busy += elapsed
            self._cond.notify_all()
        self._hook("written", prep.step)

    def _wake(self, error: BaseException) -> None:
        with self._cond:
            self._cond.notify_all()

    def _wait_written(self, upto: int) -> bool:
        """Blocks until every step < ``upto`` has been written back, or the writer stopped (its error is
        raised); returns whether they were written."""
        writer = self._writer
        with self._cond:
            while self._written < upto and not writer.stopping:
                self._cond.wait(POLL_S)
            written = self._written >= upto
        writer.raise_error()
        return written


def _hot_sizes(channel: Comm, mode: TieredMode, prep: PreparedStep) -> list[int] | None:
    """Every rank's count of distinct hot rows in its step (what its share of the hot rows' gradient exchange
    sends), exchanged on the look-ahead group, so that the step's exchange runs no collective of sizes."""
    if mode.comm.world_size == 1 or not mode.hot_rows.shape[0]:
        return None
    if "hot_rows" in prep.index:  # the device path's: found on the host while the batch was prepared
        n = int(prep.index["hot_rows"].shape[0])
    else:  # the step's hot lookups of both micro-batches, as torch.unique counts them there
        ids = np.concatenate([prep.micro.pop_ids, prep.micro.hot_slot])
        n = int(sparse_update.distinct(ids, mode._prep_scratch)[0].shape[0])
    return channel.all_gather_sizes(n)


def _no_hook(point: str, step: int) -> None:
    pass


@contextmanager
def _unchanged() -> Iterator[int]:
    yield torch.get_num_threads()


def overlap_ratio(times: dict[str, float]) -> float:
    """Share of the data-movement time (dispatch, gather, copies, write-back) hidden behind compute."""
    movement = sum(times.get(k, 0.0) for k in MOVEMENT)
    if movement <= 0:
        return 1.0
    return float(min(1.0, max(0.0, 1.0 - times.get("stall", 0.0) / movement)))
