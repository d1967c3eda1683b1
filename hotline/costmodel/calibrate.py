"""Calibration: times this host's dispatch, gather, scatter, sparse update, memory copy and dense compute, and
writes the hardware description the cost model reads (the CPU as its own device: the link is shared memory).

Every figure is timed with Hotline's own code paths (the dispatcher, the gather / scatter kernels, the sparse
optimizer, the DLRM forward and backward), as the mean of a few calls after a warm-up, once in each of
:data:`ROUNDS` rounds with the median round kept, at one thread and at ``threads`` (host work of a look-ahead
runs on the producer's threads; compute on all of them). The dense compute is fitted, by non-negative least
squares over several model shapes, to the cost model's own formula (FLOPs at a rate, bytes at a bandwidth, a
fixed cost per pass), so predictions use the same units it measured.
"""

from __future__ import annotations

import os
import platform
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from hotline.costmodel.dense_timing import REFERENCE, dense_timer, overlapped_pass
from hotline.costmodel.fitting import nnls, overlap_penalty, pooled_penalty
from hotline.costmodel.timing import (
    REPEATS,
    as_training,
    flusher,
    load_average,
    mean_s,
    rounds_spread,
    with_threads,
)

VERSION = 1

ROUNDS = 3
"""Rounds of the calibration: every figure is timed once per round and the median round counts."""


def _criteo_like(rng: np.random.Generator, n: int) -> tuple[list[int], np.ndarray, list[np.ndarray]]:
    """Ids [n, 26, 1] of Criteo-like lookups (Kaggle's table sizes up to 1M rows, Zipf ranks) whose popular rows
    are scattered over each table as in real data, and each table's rows by rank (most popular first)."""
    from hotline.datasets.synthetic import KAGGLE_TABLE_SIZES
    from hotline.datasets.zipf import sample_zipf

    sizes = [min(int(x), 1_000_000) for x in KAGGLE_TABLE_SIZES]
    by_rank = [rng.permutation(size).astype(np.int64) for size in sizes]
    ids = np.stack([by_rank[t][sample_zipf(rng, size, 1.05, n)] for t, size in enumerate(sizes)], axis=1)
    return sizes, ids.astype(np.int32)[:, :, None], by_rank


def _dispatch_timer(
    rng: np.random.Generator, flush: Callable[[], object], batch: int = 4096
) -> tuple[Callable[[], np.ndarray], Callable[[np.ndarray], dict]]:
    """Dispatch of Criteo-like batches (Kaggle's 26 table sizes up to 1M rows, Zipf ids) under placements from
    nothing hot to most lookups hot: ``(time, fit)``, one round's seconds per placement and the fit of a round
    (or of the rounds' median) to ns per lookup and per cold lookup (the cold ones also get a working-buffer
    slot)."""
    from hotline.dispatch import Dispatcher
    from hotline.placement import Placement

    sizes, ids, by_rank = _criteo_like(rng, batch * 8)
    setups = []
    for share in (0.0, 0.001, 0.01, 0.1):  # hot: the most popular rows of each table
        hot = [order[: int(share * order.shape[0])] for order in by_rank]
        placement = Placement.from_hot_ids(sizes, hot, dataset_fingerprint="", embedding_dim=16, bytes_per_row=64,
                                           hbm_budget_bytes=64 * max(1, sum(h.size for h in hot)))  # fmt: skip
        d = Dispatcher(placement, 1, batch)
        cold = sum(int(np.count_nonzero(placement.remap[t][ids[:, t, 0]] < 0)) for t in range(len(sizes))) / 8
        setups.append((d, cold))
    feats = [[batch * len(sizes), cold] for _, cold in setups]

    def time_round() -> np.ndarray:
        secs = []
        for d, _ in setups:
            i = [0]

            def one(d=d, i=i) -> None:
                b = i[0] % 8
                i[0] += 1
                d.split(ids[b * batch : (b + 1) * batch])

            secs.append(mean_s(one, repeats=REPEATS, warmup=2, flush=flush))
        return np.asarray(secs)

    def fit(secs: np.ndarray) -> dict:
        per_lookup, per_cold = nnls(feats, list(secs))
        return {"per_lookup": 1e9 * per_lookup, "per_cold_lookup": 1e9 * per_cold}

    return time_round, fit


def _gather_scatter_gbps(
    rng: np.random.Generator, big: np.ndarray, dim: int = 64
) -> tuple[Callable[[], float], Callable[[], float]]:
    """Gather and scatter of distinct rows scattered over a table far larger than any cache (``big``), a fresh
    set of rows each call (repeating one set would time rows left in cache)."""
    from hotline.kernels.gather import gather_rows, scatter_rows

    table = big.reshape(-1, dim)
    flush = flusher(big)
    sets = []
    for _ in range(4):
        rows = np.unique(rng.integers(0, table.shape[0], 40_000)).astype(np.int64)
        rng.shuffle(rows)
        sets.append(rows)
    out = np.empty((max(r.shape[0] for r in sets), dim), np.float32)
    nbytes = float(np.mean([r.shape[0] for r in sets])) * dim * 4
    i = [0]

    def timed(kernel) -> float:
        def one() -> None:
            rows = sets[i[0] % len(sets)]
            i[0] += 1
            kernel(table, rows, out[: rows.shape[0]])

        return nbytes / mean_s(one, repeats=REPEATS, warmup=2, flush=flush) / 1e9

    return (lambda: timed(gather_rows)), (lambda: timed(scatter_rows))


def _memcpy_gbps() -> float:
    src = np.ones(32 << 20, np.float32)  # 128 MiB
    dst = np.empty_like(src)
    return src.nbytes / mean_s(lambda: np.copyto(dst, src), repeats=3) / 1e9


def _handover_us(rounds: int = 1000) -> float:
    """One queue hand-over between two threads (the executor's producer -> main thread), in microseconds."""
    a, b = queue.Queue(), queue.Queue()

    def echo() -> None:
        for _ in range(rounds):
            b.put(a.get())

    t = threading.Thread(target=echo)
    t.start()
    t0 = time.perf_counter()
    for i in range(rounds):
        a.put(i)
        b.get()
    elapsed = time.perf_counter() - t0
    t.join()
    return 1e6 * elapsed / (2 * rounds)


def _overlap_timings(rng: np.random.Generator, big: np.ndarray) -> tuple[float, float, float]:
    """``(together, device alone, host alone)`` seconds of one round: a look-ahead producer's host work (dispatch
    and gather of Criteo-like batches on a worker thread with one Numba thread, the kernels releasing the GIL
    as the producer's do) beside the compute (a tiered forward and backward on the threads the executor's
    core-share rule leaves it, :class:`hotline.pipeline.threads.CoreShare`) on this CPU, and each alone. Their
    penalty (:func:`overlap_penalty`: 0 free overlap, 1 none, more than 1 worse than one after the other, the
    two contending for the cores: a parallel region waits for its thread that lost its core), pooled over the
    rounds (:func:`_pooled_overlap`), prices the look-ahead step on a CPU device."""
    import numba

    from hotline.dispatch import Dispatcher
    from hotline.kernels.gather import gather_rows
    from hotline.pipeline.threads import CoreShare
    from hotline.placement import Placement

    one = overlapped_pass(rng)
    batch = 1024
    sizes, ids, by_rank = _criteo_like(rng, batch * 4)
    hot = [order[: int(0.01 * order.shape[0])] for order in by_rank]
    placement = Placement.from_hot_ids(sizes, hot, dataset_fingerprint="", embedding_dim=64, bytes_per_row=256,
                                       hbm_budget_bytes=256 * max(1, sum(h.size for h in hot)))  # fmt: skip
    d = Dispatcher(placement, 1, batch)
    table = big.reshape(-1, 64)
    out = np.empty((batch * len(sizes), 64), np.float32)

    def device_work(n: int = 12) -> None:
        for _ in range(n):
            one()

    def host_work(n: int) -> None:
        numba.set_num_threads(1)  # thread-local, as in the producer
        for k in range(n):
            b = k % 4
            micro = d.split(ids[b * batch : (b + 1) * batch])
            rows = micro.working_set % table.shape[0]
            gather_rows(table, rows, out[: rows.shape[0]])

    device_work(2)
    host_work(2)
    t_d = mean_s(device_work, repeats=3, warmup=0)
    t_one = mean_s(lambda: host_work(4), repeats=3, warmup=0) / 4
    n_host = max(1, int(0.5 * t_d / max(t_one, 1e-6)))
    t_h = mean_s(lambda: host_work(n_host), repeats=3, warmup=0)

    share = CoreShare(worker_threads=1)
    share.busy_share = t_h / max(t_h, t_d)  # what the executor would have measured

    def together() -> None:
        worker = threading.Thread(target=host_work, args=(n_host,))
        worker.start()
        with share.lowered():
            device_work()
        worker.join()

    t_both = mean_s(together, repeats=3, warmup=1)
    return t_both, t_d, t_h


def _pooled_overlap(rounds: list[tuple[float, float, float]]) -> dict:
    """The overlap penalty the cost model prices, from each round's :func:`_overlap_timings`: pooled over the
    rounds (the sums of their timings), and a gain within the rounds' noise priced as none (1), as the disk
    calibration prices its penalties (:func:`~hotline.costmodel.fitting.pooled_penalty`). One round's
    penalty is a small difference of two noisy times over a third: a median round can price the host work
    as nearly free, and a look-ahead step as its device work alone."""
    return pooled_penalty(rounds)


def _update_timer(
    rng: np.random.Generator, big: np.ndarray
) -> tuple[Callable[[], np.ndarray], Callable[[np.ndarray], dict]]:
    """Sparse SGD update (coalesce + row update) of skewed lookups scattered over a table far larger than any
    cache (``big``: what Hotline's tables are), over lookups n, distinct rows u and dim D, a fresh set of ids
    each call: ``(time, fit)``, one round's seconds per shape and their fit to n, n*D, u*D and a fixed cost."""
    import torch

    from hotline.datasets.zipf import sample_zipf
    from hotline.kernels import sparse_update
    from hotline.tiers.sparse_optim import SparseOptimizer

    opt = SparseOptimizer("sgd", 0.01)
    flat = torch.from_numpy(big)
    flush = flusher(big)
    feats, calls = [], []
    shapes = (
        (100_000, 64),
        (200_000, 64),
        (25_000, 64),
        (50_000, 32),
        (200_000, 16),
        (100_000, 16),
        (10_000, 16),
    )
    for n, D in shapes:
        rows = flat.shape[0] // D
        table = flat[: rows * D].view(rows, D)
        sets = []
        for _ in range(4):
            ids = sample_zipf(rng, rows, 1.05, n)  # skewed, as lookups are
            ids = rng.permutation(rows)[ids]  # popular rows scattered over the table
            sets.append((torch.from_numpy(ids), int(np.unique(ids).shape[0])))
        grads = torch.randn(n, D)
        scratch = sparse_update.new_scratch(rows)
        i = [0]

        def one(table=table, grads=grads, scratch=scratch, sets=sets, i=i) -> None:
            ids = sets[i[0] % len(sets)][0]
            i[0] += 1
            opt.step(table, torch.zeros(0), ids, grads, scratch)

        calls.append(one)
        unique = float(np.mean([u for _, u in sets]))
        feats.append([n, n * D, unique * D, 1.0])

    def time_round() -> np.ndarray:
        return np.asarray([mean_s(one, repeats=REPEATS, warmup=1, flush=flush) for one in calls])

    def fit(secs: np.ndarray) -> dict:
        per_lookup, per_lookup_float, per_row_float, overhead = nnls(feats, list(secs))
        return {
            "update_ns_per_lookup": 1e9 * per_lookup,
            "update_ns_per_lookup_float": 1e9 * per_lookup_float,
            "update_ns_per_row_float": 1e9 * per_row_float,
            "update_overhead_us": 1e6 * overhead,
        }

    return time_round, fit


def calibrate(
    threads: int | None = None, seed: int = 0, progress: Callable[[str], None] | None = None
) -> dict:
    """Times this host (at ``threads`` torch/numba threads; default: all cores) and returns its hardware
    description: the CPU is its own device, the link shared memory. Takes well under a minute."""
    cores = os.cpu_count() or 1
    threads = int(threads or cores)
    say = progress or (lambda _: None)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    with as_training(threads):
        # 1 GiB: tables far larger than any cache (the values do not matter)
        big = np.ones(256 << 20, np.float32)
        say("setting up")
        flush = flusher(big)
        dispatch_time, dispatch_fit = _dispatch_timer(rng, flush)
        gather, scatter = _gather_scatter_gbps(rng, big)
        update_time, update_fit = _update_timer(rng, big)
        dense_time, dense_fit = dense_timer(rng)
        # Every figure is timed once per round, ROUNDS rounds over, and the median round of each counts: a
        # slow spell of this machine (a VM's neighbours) that lasts a part of the calibration moves one round's
        # figures, not the description (a single pass once timed a whole phase 2-3x slow).
        timed: dict[str, list] = {}
        for r in range(ROUNDS):
            say(
                f"round {r + 1} of {ROUNDS}: dispatch, gather and scatter, copies, overlap, sparse update, dense compute"
            )
            for key, fn in (
                ("dispatch_1", lambda: with_threads(1, dispatch_time)),
                ("dispatch_n", dispatch_time),
                ("gather_1", lambda: with_threads(1, gather)),
                ("gather_n", gather),
                ("scatter_1", lambda: with_threads(1, scatter)),
                ("scatter_n", scatter),
                ("memcpy", _memcpy_gbps),
                ("handover", _handover_us),
                ("overlap", lambda big=big: _overlap_timings(rng, big)),
                ("update", update_time),
                ("dense", lambda first=(r == 0): dense_time(first)),
            ):
                timed.setdefault(key, []).append(fn())
        mid = {k: np.median(np.asarray(v, dtype=np.float64), axis=0) for k, v in timed.items()}
        overlap = _pooled_overlap(timed["overlap"])
        d1, dn = dispatch_fit(mid["dispatch_1"]), dispatch_fit(mid["dispatch_n"])
        host = {
            "dispatch_ns_per_lookup": {"1": d1["per_lookup"], "n": dn["per_lookup"]},
            "dispatch_ns_per_cold_lookup": {"1": d1["per_cold_lookup"], "n": dn["per_cold_lookup"]},
            "gather_gbps": {"1": float(mid["gather_1"]), "n": float(mid["gather_n"])},
            "scatter_gbps": {"1": float(mid["scatter_1"]), "n": float(mid["scatter_n"])},
            "memcpy_gbps": float(mid["memcpy"]),
            "handover_us": float(mid["handover"]),
            "threads": threads,
            "cores": cores,
            "overlap_penalty": overlap["penalty"],
            "overlap": {k: overlap[k] for k in ("pooled", "se", "pairs")},
        }
        # The device is this CPU: device mode reads its rows out of host memory at the gather bandwidth.
        device = {"kind": "cpu", "gather_gbps": host["gather_gbps"]["n"], **update_fit(mid["update"])}
        del big
        device.update(dense_fit(mid["dense"]))
        device["reference_pass_us"] = 1e6 * float(mid["dense"][REFERENCE])  # its pass with its assembly
        spread = {k: rounds_spread(v) for k, v in timed.items()}
        spread["overlap"] = rounds_spread(
            [overlap_penalty(*t) for t in timed["overlap"]]
        )  # the penalty's rounds
    return {
        "format": "hotline-hardware",
        "version": VERSION,
        "name": f"{platform.node() or 'this host'} ({platform.processor() or platform.machine()}, {threads} threads)",
        "source": f"hotline calibrate, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, "
        f"load average {load_average()} (timings on a loaded machine are not this host's figures)",
        "calibration_s": time.perf_counter() - t0,
        "rounds": ROUNDS,
        "rounds_spread": spread,
        "host": host,
        "device": device,
        "link": {"shared_memory": True, "h2d_gbps": host["memcpy_gbps"], "d2h_gbps": host["memcpy_gbps"]},
    }
