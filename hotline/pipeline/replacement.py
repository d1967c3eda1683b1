"""Re-placement during training: the hot set follows the data, exactly.

The dispatcher counts every lookup (decayed, :class:`~hotline.profiling.online.OnlineCounts`). Every
``--replace-every`` steps, or with ``--replace auto`` when the measured hot-lookup share has fallen
``--replace-threshold`` below what the placement delivered in its first steps, the run is DRAINED: the batch
source is gated, so the look-ahead thread dispatches no step past the boundary (with auto, the boundary is K+1
steps after the step that decided: the most the look-ahead thread can have taken by then, so where it falls
never depends on thread timing), every step already dispatched against the old placement computes and writes
back; then, between two steps, the hottest rows under the same budget become the hot set
(:meth:`TieredMode.replace`: values and optimizer state move between the tiers, no arithmetic), and the next
steps are dispatched against the new placement.

On N ranks every rank re-places at the same step with the same rows: ``--replace-every`` counts the same
steps, ``--replace auto`` decides from the hot-lookup share of every rank's lookups together, the look-ahead
producers stop the segment at the same step (a batch one of them took too many goes back to the source), and
the rows are chosen from the globally reduced counts.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from hotline.profiling.online import OnlineCounts
from hotline.tiers.base import StepStats

AUTO_WINDOW = 20
"""Steps over which ``--replace auto`` measures the hot-lookup share (what a placement delivers, and now)."""


class _Source:
    """An iterator of batches that can say whether another one is coming, and take one back (never losing it)."""

    def __init__(self, batches: Iterable):
        self._it = iter(batches)
        self._next = None

    def more(self) -> bool:
        if self._next is None:
            self._next = next(self._it, None)
        return self._next is not None

    def take(self):
        batch = self._next if self._next is not None else next(self._it, None)
        self._next = None
        return batch

    def put_back(self, batch) -> None:
        if self._next is not None:
            raise RuntimeError("a batch source holds one batch back at most")
        self._next = batch


class _Gate:
    """Batches of a shared source until ``limit`` were taken (``limit`` may be set while it runs).

    On N ranks the look-ahead producers agree step by step whether to go on (the executor's ``all_ok``), so
    a segment ends on every rank at the first step at which any rank's gate is shut: a rank that had already
    taken that step's batch gives it back (:meth:`give_back`), and the next segment starts with it."""

    def __init__(self, source: _Source, limit: int | None):
        self.source, self.limit = source, limit
        self.taken = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.limit is not None and self.taken >= self.limit:
            raise StopIteration
        batch = self.source.take()
        if batch is None:
            raise StopIteration
        self.taken += 1
        return batch

    def give_back(self, batch) -> None:
        """Returns a batch taken but not run (the other ranks stopped at this step)."""
        self.source.put_back(batch)
        self.taken -= 1


def hot_share(stats: StepStats) -> float:
    """A step's hot-lookup share; on N ranks of every rank's lookups together (the trainer sums the counters
    over ranks in its dense all-reduce), so ``--replace auto`` decides on the same step on every rank, as one
    process would on the global batch."""
    return stats.counters["hot_lookups"] / max(1.0, stats.counters["lookups"])


def start_counting(mode, config) -> OnlineCounts:
    """The online counts of a run that re-places (kept by the dispatcher, restored by a checkpoint)."""
    mode.dispatcher.counts = OnlineCounts(mode.layout.num_rows, config.count_decay)
    return mode.dispatcher.counts


def progress_replacing(
    run: Callable[[Iterable], Iterator[StepStats]],
    batches: Iterable,
    mode,
    config,
    on_replace,
    start_step: int = 0,
) -> Iterator[StepStats]:
    """``run(batches)`` (the executor's progress) in segments between re-placements, every
    ``config.replace_every`` steps counted from step 0 (a resumed run keeps the schedule);
    ``on_replace(record)`` hears of each one (promoted / demoted rows, hot share before)."""
    counts = mode.dispatcher.counts if mode.dispatcher.counts is not None else start_counting(mode, config)
    source = _Source(batches)
    every = config.replace_every
    first = every - start_step % every if every else None
    while True:
        gate = _Gate(source, first)
        first = every or None
        recent: deque[float] = deque(maxlen=AUTO_WINDOW)
        promised, draining = None, False
        for yielded, stats in enumerate(run(gate), 1):
            recent.append(hot_share(stats))
            if config.replace == "auto" and len(recent) == AUTO_WINDOW and not draining:
                now = sum(recent) / AUTO_WINDOW
                if promised is None:
                    promised = now
                elif now < promised - config.replace_threshold:
                    # Drain: the segment ends after the steps the look-ahead thread may have taken by now (K
                    # queued, one in its hands), so where the re-placement falls never depends on timing;
                    # sooner than a --replace-every boundary, never later.
                    end = yielded + (config.lookahead + 1 if config.lookahead else 0)
                    gate.limit = max(gate.taken, end if gate.limit is None else min(gate.limit, end))
                    draining = True
            yield stats
        if not source.more():  # no step left: nothing to re-place for
            return
        before = sum(recent) / len(recent) if recent else float("nan")
        t0 = time.perf_counter()
        raw = counts.summed(mode.comm)  # every rank chooses from the global counts: the same rows
        moved = mode.replace(counts.top(mode.placement.num_hot, raw))
        seconds = time.perf_counter() - t0  # choosing the rows (counts reduced over ranks) and moving them
        on_replace(
            {"kind": "replace", "hot_share_before": before, "promised": promised, "seconds": seconds, **moved}
        )
