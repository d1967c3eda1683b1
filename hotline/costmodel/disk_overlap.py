"""How the disk store's concurrent work overlaps, timed through its own code for the calibration's ``step``
section (``*_penalty``: the part of the shorter of two lanes that still costs time, 0 free, 1 none,
:func:`~hotline.costmodel.fitting.overlap_penalty`; pooled over pairs timed in ABBA order, and a gain the pairs
do not show beyond their noise priced as none, :func:`~hotline.costmodel.fitting.pooled_penalty`): the I/O
(reads beside write-backs) beside a forward and backward pass on the main thread, as long as the I/O
(``compute_penalty``) and shorter (``compute_penalties``: one point per share of :data:`BESIDE_SHARES`), and
a step's reads beside the previous steps' write-backs (``read_write_penalty``), fitted to a timed look-ahead
pipeline of the executor's own producer and writer threads beside the compute (:func:`pipeline_penalty`)."""

from __future__ import annotations

import threading
import time

import numpy as np

from hotline.costmodel.fitting import pooled_penalty, priced
from hotline.costmodel.phases import overlapped_at
from hotline.kinds import DEFAULT_LOOKAHEAD, Mode, staging_slots
from hotline.tiers.disk_file import PageSet, RowFile

PIPELINE_ROWS = 4096
"""Distinct rows per step of the timed look-ahead pipeline (:func:`_pipeline_timings`): of the order of what a
step of ``bench_disk_tier`` reads from disk."""
PIPELINE_STEPS = 4
"""Steps per timing of the look-ahead pipeline (each pair: that many steps one after the other, and pipelined)."""
PIPELINE_LOOKAHEAD = DEFAULT_LOOKAHEAD
"""The timed pipeline's look-ahead K (the producer reads at most K steps ahead of the compute)."""
BESIDE_SHARES = (1.0, 0.25)
"""The compute lane's length, as a share of the I/O's, at which the I/O beside a forward and backward pass is
timed (``compute_penalties``: one point each; the cost model interpolates between them by the lanes' ratio).
The part of the compute that costs time moves with that ratio (a compute as long as the I/O costs most of
itself, one a quarter as long little), and a look-ahead step on the disk store has a compute shorter than its
I/O (``bench_disk_tier``)."""


def overlap_penalties(f: RowFile, rng: np.random.Generator, repeats: int, compute, n: int) -> dict:
    """The penalties of the ``step`` section (module docstring), by name (:func:`beside_name`, ``read_write``
    and, for the record, ``read_write_pair``), each :func:`~hotline.costmodel.fitting.pooled_penalty`'s
    figures; ``n``: rows per batch of the reads and the write-backs timed together."""
    # Reads beside write-backs on two threads (kept as ``read_write_pair``, for the record: the look-ahead
    # pipeline below prices them), and that I/O beside the compute (``compute_penalty``, priced).
    # Look-ahead: the producer reads step j+1 while the writer writes step j back (one file, one pool). Every
    # timed write-back is of rows just read (untimed), as a step's is: a page written since is read again.
    # One batch of each per timing, three pairs per repeat: a virtual disk's speed swings within a second or so,
    # and a short pair times alone and together at nearly one speed (more, shorter pairs gave the pooled
    # penalty a smaller standard error than fewer, longer ones in the same time).
    k = 1

    def draws() -> list[np.ndarray]:
        return [rng.choice(f.num_rows, size=n, replace=False) for _ in range(k)]

    def jobs() -> tuple[list[np.ndarray], list[tuple]]:
        """``k`` batches to read, and ``k`` batches just read (untimed) to write back."""
        return draws(), [(b, *f.read_rows(b)) for b in draws()]

    def alone() -> tuple[float, float]:
        """Seconds of ``k`` reads, then of ``k`` write-backs, one after the other."""
        r, w = jobs()
        return _timed(lambda: [f.read_rows(b) for b in r]), _timed(lambda: [f.write_rows(*job) for job in w])

    def together(fn=None) -> float:
        """Seconds of ``k`` reads and ``k`` write-backs on two threads (beside ``fn`` on this thread)."""
        r, w = jobs()
        threads = [threading.Thread(target=lambda: [f.read_rows(b) for b in r]),
                   threading.Thread(target=lambda: [f.write_rows(*job) for job in w])]  # fmt: skip
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        if fn is not None:
            fn()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    # Each penalty pools ``3 * repeats`` paired measurements (:func:`pooled_penalty`), alone and together in ABBA
    # order: a drift of the disk's speed over the section weighs both sides alike, and one pair's burst is a
    # share of the sums, not a vote (a median of per-repeat penalties swung between calibrations in a row where
    # paired serial and together timings showed no gain).
    rw, beside = [], {share: [] for share in BESIDE_SHARES}
    compute()
    t_one = _timed(compute)
    for i in range(3 * repeats):  # pairs (see k above)
        first = i % 2 == 0  # alone first in even pairs, together first in odd ones
        tr, tw = alone() if first else (None, None)
        t_io = together()
        tr, tw = (tr, tw) if first else alone()
        rw.append((t_io, tr, tw))
        # That I/O beside the main thread's forward and backward (the two share this machine's cores), the
        # compute as long as the I/O and a share of it (BESIDE_SHARES; in turn, first one, then the other).
        for share in BESIDE_SHARES if first else BESIDE_SHARES[::-1]:
            reps = max(1, round(share * t_io / max(t_one, 1e-6)))

            def passes(reps: int = reps) -> None:
                for _ in range(reps):
                    compute()

            t_c = _timed(passes) if first else None
            t_all = together(passes)
            t_c = _timed(passes) if t_c is None else t_c
            beside[share].append((t_all, t_io, t_c))
    penalties = {beside_name(share): pooled_penalty(pairs) for share, pairs in beside.items()}
    curve = penalty_curve(penalties)
    penalties["read_write"] = pipeline_penalty(_pipeline_timings(f, rng, repeats, compute), curve)
    # for the record: the pair no longer prices (STEP_FORMAT 6)
    penalties["read_write_pair"] = pooled_penalty(rw)
    return penalties


def read_compute_write(f: RowFile, rows: np.ndarray, compute) -> tuple[PageSet, tuple, tuple]:
    """A sequential step's I/O: ``rows`` read, ``compute()``, and the rows written back over the pages the read
    fetched: (the read's pages, (read, compute, write-back) seconds, (read, write-back) CPU seconds)."""
    c0, t0 = time.process_time(), time.perf_counter()
    recs, ps = f.read_rows(rows)
    c1, t1 = time.process_time(), time.perf_counter()
    compute()
    c2, t2 = time.process_time(), time.perf_counter()
    f.write_rows(rows, recs, ps)
    c3, t3 = time.process_time(), time.perf_counter()
    return ps, (t1 - t0, t2 - t1, t3 - t2), (c1 - c0, c3 - c2)


def _pipeline_timings(f: RowFile, rng: np.random.Generator, repeats: int, compute) -> list[tuple]:
    """``2 * repeats`` paired timings ``(pipelined, reads, compute, write-backs)`` of :data:`PIPELINE_STEPS`
    steps of :data:`PIPELINE_ROWS` rows: one after the other as a sequential step runs them (each step's read,
    its compute, its write-back, each lane's seconds summed), and as look-ahead runs them (wall seconds): the
    executor's own threads (:class:`hotline.pipeline.threads.Producer` reading at most
    :data:`PIPELINE_LOOKAHEAD` steps ahead, :class:`~hotline.pipeline.threads.Worker` writing each step back
    after its compute, the compute on this thread), in ABBA order. The compute of a step is as many forward and
    backward passes as make it the shorter share of :data:`BESIDE_SHARES` (a quarter) of the step's I/O (a read
    and its write-back): the disk lane the longest, as in a look-ahead step on the disk store (its compute
    shorter than its I/O in ``bench_disk_tier``), and the compute beside it at the ratio whose penalty the
    calibration timed rather than one it interpolates."""
    from hotline.pipeline.threads import Producer, Worker

    n = min(PIPELINE_ROWS, f.num_rows // 2)

    def batch() -> np.ndarray:
        return rng.choice(f.num_rows, size=n, replace=False)

    def batches() -> list[np.ndarray]:
        return [batch() for _ in range(PIPELINE_STEPS)]

    compute()
    t_one = _timed(compute)
    f.read_rows(batch())  # untimed: the pool's threads and buffers at this size
    b = batch()
    # the compute a quarter of the step's I/O (a read and its write-back, about twice the read)
    reps = max(1, round(min(BESIDE_SHARES) * 2 * _timed(lambda: f.read_rows(b)) / max(t_one, 1e-6)))

    def passes() -> None:
        for _ in range(reps):
            compute()

    def serial() -> tuple[float, float, float]:
        lanes = np.zeros(3)
        for b in batches():
            lanes += read_compute_write(f, b, passes)[1]
        return tuple(float(x) for x in lanes)

    def pipelined() -> float:
        steps = batches()
        writer = Worker(
            "hotline-calibrate-write-back", _write_back(f), staging_slots(Mode.HOTLINE, PIPELINE_LOOKAHEAD)
        )
        producer = Producer("hotline-calibrate-prepare", PIPELINE_LOOKAHEAD)
        try:
            t0 = time.perf_counter()
            producer.start((b, *f.read_rows(b)) for b in steps)
            for job in producer:
                passes()
                writer.submit(job)
            writer.finish()
            return time.perf_counter() - t0
        finally:
            producer.close()
            writer.close()

    out = []
    for i in range(2 * repeats):
        if i % 2 == 0:
            lanes = serial()
            out.append((pipelined(), *lanes))
        else:
            t = pipelined()
            out.append((t, *serial()))
    return out


def _write_back(f: RowFile):
    """The writer's function: a job ``(rows, records, pages)``, as a fetch returned it, written back."""
    return lambda job: f.write_rows(*job)


def _lane_ratio(pairs: list) -> float:
    """The shorter lane over the longer, from the sums of paired timings ``(together, a alone, b alone)``."""
    a, b = (sum(t[i] for t in pairs) for i in (1, 2))
    return float(min(a, b) / max(a, b, 1e-12))


def beside_name(share: float) -> str:
    """The ``penalties_measured`` entry of the I/O beside a compute ``share`` of its length (one of
    :data:`BESIDE_SHARES`): ``compute`` for as long as the I/O (the one figure priced before), else
    ``compute_at_<share>``."""
    return "compute" if share == 1.0 else f"compute_at_{share:g}"


def penalty_curve(measured: dict) -> list:
    """``compute_penalties`` from the pooled penalties (:func:`pooled_penalty`) of the I/O beside compute at each
    of :data:`BESIDE_SHARES` in ``measured`` (``penalties_measured``, by :func:`beside_name`): one point
    ``[ratio as timed, penalty priced]`` each, sorted by ratio."""
    got = [measured[beside_name(share)] for share in BESIDE_SHARES]
    return sorted([_lane_ratio(m["pairs"]), m["penalty"]] for m in got)


def beside_penalties(step: dict, one=None) -> str:
    """The calibrated penalty of the I/O beside compute in words: one per compute length timed, by its share of
    the I/O's (``compute_penalties``), or the one figure of an older calibration (``one(step, "compute")``
    words it, where given)."""
    points = step.get("compute_penalties")
    if not points:
        return one(step, "compute") if one is not None else f"{step['compute_penalty']:.2f}"
    return ", ".join(f"{p:.2f} with the compute {r:.2f} of the I/O" for r, p in points)


def _read_write_fit(together: float, read: float, compute: float, write: float, compute_penalty: float | list) -> float:  # fmt: skip
    """The reads-beside-write-backs penalty with which the cost model's look-ahead step (the reads beside the
    write-backs, :func:`hotline.costmodel.phases.overlapped`, and that beside the compute at
    ``compute_penalty``, one figure or points by the lanes' ratio:
    :func:`~hotline.costmodel.phases.penalty_at`) takes ``together``
    seconds, in [0, 3]: the disk lane solved by bisection, the largest with which the step is no longer than
    ``together`` (where the compute lane is the longer and its penalty is 0, any disk lane up to the compute's
    gives the same step)."""

    def step(disk: float) -> float:
        return overlapped_at(disk, compute, compute_penalty)

    lo, hi = 0.0, max(together, compute)  # step(lo) <= together < step(hi), unless together < compute
    if step(hi) <= together:
        lo = hi
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if step(mid) <= together else (lo, mid)
    longer, shorter = max(read, write), min(read, write)
    return float(min(3.0, max(0.0, (lo - longer) / max(shorter, 1e-9))))


def pipeline_penalty(timings: list[tuple[float, float, float, float]], compute_penalty: float | list) -> dict:
    """The reads-beside-write-backs penalty the cost model prices look-ahead with, from paired timings
    ``(pipelined, reads, compute, write-backs)`` of a look-ahead pipeline (:func:`_pipeline_timings`): the
    penalty with which the model's step, at ``compute_penalty`` for the I/O beside the compute (one figure, or
    points by the lanes' ratio: :func:`~hotline.costmodel.phases.penalty_at`), takes the pipelined seconds
    (:func:`_read_write_fit`).
    ``pooled`` from the sums of the pairs, ``se`` the standard error of the pairs' own fits, and ``penalty`` by
    :func:`pooled_penalty`'s rule (a gain within the noise priced as none).

    A pair of threads, one reading and one writing a batch, priced it before (format 5) and credited a gain
    that ``bench_disk_tier``'s look-ahead runs did not show. The pipeline times what look-ahead does: the
    producer's reads, the writer's write-backs and the compute together, each
    waiting on the others as the executor's threads do."""
    if not timings:
        return {"penalty": 1.0, "pooled": 1.0, "se": None, "pairs": [], "compute_penalty": compute_penalty}
    pooled = _read_write_fit(*np.asarray(timings, float).sum(axis=0), compute_penalty)
    each = [_read_write_fit(*t, compute_penalty) for t in timings]
    pairs = [[float(x) for x in t] for t in timings]
    pc = compute_penalty if isinstance(compute_penalty, list) else float(compute_penalty)
    return {**priced(pooled, each), "pairs": pairs, "compute_penalty": pc}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
