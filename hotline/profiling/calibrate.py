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

import contextlib
import os
import platform
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from hotline.profiling.costmodel import Workload, arch_of, compute_terms
from hotline.profiling.fitting import nnls, overlap_penalty, pooled_penalty

VERSION = 1

ROUNDS = 3
"""Rounds of the calibration: every figure is timed once per round and the median round counts."""
_REPEATS = 4
"""Timed calls of each shape per round (after its untimed warm-up calls)."""


def _spread(rounds: list) -> float:
    """How far a figure's rounds moved: the largest (slowest - fastest) / median over its shapes."""
    a = np.asarray(rounds, dtype=np.float64).reshape(len(rounds), -1)
    mid = np.median(a, axis=0)
    return float(np.max((a.max(axis=0) - a.min(axis=0)) / np.where(mid > 0, mid, 1.0)))


def _mean_s(
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


def _flusher(big: np.ndarray, nbytes: int = 96 << 20) -> Callable[[], None]:
    """Reads ``nbytes`` of ``big`` (more than any last-level cache), evicting what the last call left there."""
    part = big[: nbytes // big.itemsize]
    return lambda: float(part.sum())


@contextlib.contextmanager
def _as_training(threads: int):
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


def _with_threads(n: int, fn: Callable[[], float]) -> float:
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        return fn()
    finally:
        numba.set_num_threads(before)


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

            secs.append(_mean_s(one, repeats=_REPEATS, warmup=2, flush=flush))
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
    flush = _flusher(big)
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

        return nbytes / _mean_s(one, repeats=_REPEATS, warmup=2, flush=flush) / 1e9

    return (lambda: timed(gather_rows)), (lambda: timed(scatter_rows))


def _memcpy_gbps() -> float:
    src = np.ones(32 << 20, np.float32)  # 128 MiB
    dst = np.empty_like(src)
    return src.nbytes / _mean_s(lambda: np.copyto(dst, src), repeats=3) / 1e9


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


def _pass(
    rng: np.random.Generator, B: int, T: int, D: int, bot, top, arch: dict | None = None, L: int = 1
) -> tuple[Callable, Callable, Workload, object]:
    """A non-popular micro-batch's forward and backward as the tiered step runs it on a CPU (its rows put
    together by the Numba kernel from a hot table and a working buffer, then DLRM's forward and backward), and
    the row assembly alone; with the matching workload and the model. ``arch``: the interaction's TrainConfig
    fields (default: dot); ``L``: lookups per table per sample (summed bags)."""
    import torch

    from hotline.kernels.gather import assemble_rows
    from hotline.models.dlrm import DLRM
    from hotline.tiers.base import loss_and_backward, sum_pool
    from hotline.training.config import TrainConfig

    cfg = TrainConfig(
        embedding_dim=D, bottom_mlp=list(bot), top_mlp=list(top), mini_batch_size=B, **(arch or {})
    )
    model = DLRM(cfg.model_config([1000] * T), seed=0)
    dense = torch.randn(B, 13)
    labels = torch.from_numpy((rng.random(B) < 0.25).astype(np.float32))
    N = B * T * L
    hot = rng.standard_normal((100_000, D), dtype=np.float32)
    work = rng.standard_normal((max(1, N // 3), D), dtype=np.float32)
    order = rng.permutation(N)
    hot_pos, cold_pos = np.sort(order[: N // 2]), np.sort(order[N // 2 :])
    hot_slot = rng.integers(0, hot.shape[0], hot_pos.shape[0])
    cold_slot = rng.integers(0, work.shape[0], cold_pos.shape[0])

    def assemble() -> torch.Tensor:
        rows = torch.empty((N, D), dtype=torch.float32)
        assemble_rows(rows.numpy(), hot, hot_pos, hot_slot, work, cold_pos, cold_slot)
        return rows

    def one() -> None:
        rows = assemble().requires_grad_(True)
        loss_and_backward(model, dense, sum_pool(rows, T, L), labels, B)
        model.zero_grad(set_to_none=True)

    return one, assemble, Workload(B, T, L, D, **arch_of(cfg)), model


def overlapped_pass(rng: np.random.Generator) -> Callable[[], None]:
    """One forward and backward of a small tiered DLRM step on this CPU (batch 1024, 26 tables, dim 64): the
    compute the overlap penalties time host work and disk I/O beside."""
    return _pass(rng, 1024, 26, 64, (13, 64, 64), (64, 1))[0]


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
    t_d = _mean_s(device_work, repeats=3, warmup=0)
    t_one = _mean_s(lambda: host_work(4), repeats=3, warmup=0) / 4
    n_host = max(1, int(0.5 * t_d / max(t_one, 1e-6)))
    t_h = _mean_s(lambda: host_work(n_host), repeats=3, warmup=0)

    share = CoreShare(worker_threads=1)
    share.busy_share = t_h / max(t_h, t_d)  # what the executor would have measured

    def together() -> None:
        worker = threading.Thread(target=host_work, args=(n_host,))
        worker.start()
        with share.lowered():
            device_work()
        worker.join()

    t_both = _mean_s(together, repeats=3, warmup=1)
    return t_both, t_d, t_h


def _pooled_overlap(rounds: list[tuple[float, float, float]]) -> dict:
    """The overlap penalty the cost model prices, from each round's :func:`_overlap_timings`: pooled over the
    rounds (the sums of their timings), and a gain within the rounds' noise priced as none (1), as the disk
    calibration prices its penalties (:func:`~hotline.profiling.fitting.pooled_penalty`). One round's
    penalty is a small difference of two noisy times over a third: the median round priced 0.93, 1.30, 0.86
    and 0.03 in four calibrations of one hour on the 2-core host (the last with a spread of 6.3 between its
    rounds), and a K=2 step priced at 0.03 is its device work alone."""
    return pooled_penalty(rounds)


# Model shapes the dense compute is fitted over: (batch, tables, dim, bottom MLP, top MLP[, interaction]); the
# dot interaction unless a shape names another, so the fit sees every model the cost model prices.
_SHAPES = (
    (4096, 26, 64, (13, 64, 64), (64, 1)),
    (2048, 26, 64, (13, 64, 64), (64, 1)),
    (1024, 26, 64, (13, 64, 64), (64, 1)),
    (4096, 26, 32, (13, 128, 32), (128, 1)),
    (2048, 26, 16, (13, 512, 256, 64, 16), (512, 256, 1)),
    (1024, 26, 16, (13, 512, 256, 64, 16), (512, 256, 1)),
    (512, 26, 16, (13, 512, 256, 64, 16), (512, 256, 1)),
    (64, 26, 16, (13, 64, 16), (64, 1)),
    (4096, 8, 32, (13, 256, 32), (256, 1)),
    (8, 4, 8, (13, 8), (8, 1)),
    (2048, 26, 16, (13, 64, 16), (64, 1), {"interaction": "cat"}),
    (1024, 26, 16, (13, 64, 16), (64, 1), {"interaction": "dcn", "dcn_num_layers": 2, "dcn_low_rank_dim": 64}),
    (2048, 8, 32, (13, 64, 32), (256, 1), {"interaction": "dcn", "dcn_num_layers": 3, "dcn_low_rank_dim": 128}),
)  # fmt: skip


def _dense_timer(
    rng: np.random.Generator,
) -> tuple[Callable[[bool], np.ndarray], Callable[[np.ndarray], dict]]:
    """The tiered forward and backward over :data:`_SHAPES`: ``(time, fit)``. ``time(first)`` times one turn
    over every shape (its pass and, apart, its row assembly: :data:`_REPEATS` calls each after one untimed call,
    three in the ``first`` turn), so that a machine that speeds up or slows down while it is calibrated moves
    every shape alike, not the shapes timed last; it returns the passes' seconds, then the assemblies'. ``fit``
    of a turn's (or the turns' median) figures: the assembly is the cost model's ``assemble`` phase, the rest
    fitted to MLP FLOPs, interaction FLOPs, bytes and a cost per pass; and the dense optimizer's step (timed in
    ``fit``), fitted to a cost per parameter tensor beyond streaming its parameters."""
    passes = [_pass(rng, B, T, D, bot, top, *arch) for B, T, D, bot, top, *arch in _SHAPES]

    def time_turn(first: bool) -> np.ndarray:
        total = [_mean_s(one, repeats=_REPEATS, warmup=3 if first else 1) for one, _, _, _ in passes]
        asm = [_mean_s(assemble, repeats=_REPEATS, warmup=2 if first else 1) for _, assemble, _, _ in passes]
        return np.asarray(total + asm)

    def fit(timed: np.ndarray) -> dict:
        from hotline.tiers.sparse_optim import SparseOptimizer

        total, t_asm = timed[: len(passes)], timed[len(passes) :]
        feats, secs, assembled, dense_upd = [], [], [], []
        for (B, T, D, *_), (_, _, w, model), tot, ta in zip(_SHAPES, passes, total, t_asm, strict=True):
            assembled.append((B * T * D * 4, ta))
            secs.append(max(tot - ta, 1e-7))
            feats.append([*compute_terms(w, B), 1.0])
            if B >= 1024:  # the dense optimizer's step over the same model
                import torch

                params = list(model.parameters())
                for q in params:
                    q.grad = torch.randn_like(q)
                opt = SparseOptimizer("sgd", 0.01).dense_optimizer(params)
                dense_upd.append((w, _mean_s(opt.step, repeats=20, warmup=3)))
        inv_mlp, inv_inter, inv_bw, overhead = nnls(feats, secs)
        predicted = np.asarray(feats) @ np.array([inv_mlp, inv_inter, inv_bw, overhead])
        mem_gbps = 1e-9 / max(inv_bw, 1e-18)
        # the dense step: what streaming its parameters (the cost model's 12 bytes each) does not explain, per tensor
        per_tensor = [max(0.0, t - 12.0 * w.dense_params() / (mem_gbps * 1e9)) / len(w.param_tensors())
                      for w, t in dense_upd]  # fmt: skip
        return {
            "dense_gflops": 1e-9 / max(inv_mlp, 1e-18),
            "interaction_gflops": 1e-9 / max(inv_inter, 1e-18),
            "mem_gbps": mem_gbps,
            "pass_overhead_us": 1e6 * overhead,
            "dense_fit_max_rel_error": float(np.max(np.abs(predicted / np.asarray(secs) - 1))),
            "assemble_gbps": sum(b for b, _ in assembled) / sum(t for _, t in assembled) / 1e9,
            "dense_update_us_per_tensor": 1e6 * float(np.median(per_tensor)),
        }

    return time_turn, fit


_REFERENCE = 2
"""The shape of :data:`_SHAPES` (batch 1024, 26 tables, dim 64, 13-64-64 / 64-1: about 20 ms here) whose pass
:func:`calibrate` keeps (``device.reference_pass_us``, its median round) and :func:`time_pass` times beside the
run's own, to tell this machine's speed at that moment from the run's model."""


def _reference_pass(rng: np.random.Generator) -> Callable[[], None]:
    """One forward and backward, with its row assembly, of the calibration's reference shape
    (:data:`_REFERENCE`; timed as ``device.reference_pass_us``)."""
    B, T, D, bot, top, *extra = _SHAPES[_REFERENCE]
    return _pass(rng, B, T, D, bot, top, *extra)[0]


def _run_pass(rng: np.random.Generator, w: Workload) -> tuple[Callable[[], None], Callable[[], object]]:
    """The forward and backward (with its row assembly) of the model ``w`` prices at its batch size, and the
    assembly alone; multi-hot bags of mean size L as uniform bags of round(L)."""
    arch = {k: getattr(w, k) for k in ("interaction", "dcn_num_layers", "dcn_low_rank_dim")}
    L = max(1, int(round(w.pooling_factor)))
    one, assemble, _, _ = _pass(rng, w.batch_size, w.num_tables, w.embedding_dim, w.bottom_mlp, w.top_mlp, arch,
                                L=L)  # fmt: skip
    return one, assemble


def speed_probe(
    threads: int | None = None, seed: int = 0, calls: int = 3, workload: Workload | None = None
) -> Callable[[], float]:
    """A probe of this CPU's speed now: a function that times a pass ``calls`` times (each call alone) and
    returns the median in microseconds: the calibration's reference pass, comparable with its
    ``device.reference_pass_us``, or the pass of the model ``workload`` prices (with its assembly, comparable
    with :func:`time_pass`'s ``pass_us + assemble_us``). Threads as :func:`calibrate` (default: all cores). A
    benchmark times it beside each run it prices, so that a spell of a VM between the timing and the run is
    seen."""
    threads = int(threads or os.cpu_count() or 1)
    rng = np.random.default_rng(seed)
    with _as_training(threads):
        ref = _reference_pass(rng) if workload is None else _run_pass(rng, workload)[0]
        ref()  # the first call allocates and, for Numba, compiles

    def probe() -> float:
        with _as_training(threads):
            return 1e6 * float(np.median([_mean_s(ref, repeats=1, warmup=0) for _ in range(calls)]))

    return probe


def time_pass(
    w: Workload,
    threads: int | None = None,
    seed: int = 0,
    budget_s: float = 2.0,
    reference_us: float | None = None,
) -> dict:
    """The dense pass of the model ``w`` prices, timed on this CPU at its batch size (the tiered forward and
    backward of :func:`_pass`, its row assembly timed apart), for the cost model's ``device.passes`` (see
    :func:`hotline.profiling.costmodel.pass_key`).

    The fit of :func:`_dense_timer` spans 13 shapes with four coefficients, and on this 2-core host it misses
    single shapes by up to 40%; anchored to this timing, the model keeps the fit's shape over batch sizes and
    passes but takes its scale from the run's own model. A timing of a second or two, though, lands on
    whatever speed this machine has then (a VM's speed moved 20-30% within minutes here), where the
    calibration's figures are medians of three rounds. So, given the calibration's ``reference_us`` (the pass
    of shape :data:`_REFERENCE`), the run's pass and that reference are timed in alternation, each call
    timed alone, and the run's pass is the calibration's reference scaled by the ratio of their medians: a slow
    spell slows both. Without ``reference_us`` the run's median is taken as it is.

    Multi-hot bags of mean size L are timed as uniform bags of round(L). Threads as :func:`calibrate`
    (default: all cores); takes about ``budget_s`` seconds (3 to 24 timed pairs, after 2 untimed)."""
    threads = int(threads or os.cpu_count() or 1)
    L = max(1, int(round(w.pooling_factor)))
    rng = np.random.default_rng(seed)
    with _as_training(threads):
        one, assemble = _run_pass(rng, w)
        ref = _reference_pass(rng)
        for fn in (one, ref, one, ref, assemble, assemble):
            fn()

        def once(fn) -> float:
            return _mean_s(fn, repeats=1, warmup=0)

        pair = once(one) + once(ref)
        runs, refs, asms = [], [], []
        for i in range(int(min(24, max(3, budget_s / max(pair, 1e-6))))):
            if i % 2:  # alternate which of the two goes first
                runs.append(once(one))
                refs.append(once(ref))
            else:
                refs.append(once(ref))
                runs.append(once(one))
            asms.append(once(assemble))
    t_run, t_ref, t_asm = (float(np.median(x)) for x in (runs, refs, asms))
    scale = reference_us * 1e-6 / t_ref if reference_us else 1.0
    return {
        "batch": int(w.batch_size),
        "pooling_factor": L,
        "pass_us": 1e6 * max(t_run - t_asm, 1e-7) * scale,
        "assemble_us": 1e6 * t_asm * scale,
        "threads": threads,
        "measured_pass_us": 1e6 * t_run,
        "measured_reference_us": 1e6 * t_ref,
        "reference_scale": scale,
        "source": f"timed {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {_load()}",
    }


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
    flush = _flusher(big)
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
        return np.asarray([_mean_s(one, repeats=_REPEATS, warmup=1, flush=flush) for one in calls])

    def fit(secs: np.ndarray) -> dict:
        per_lookup, per_lookup_float, per_row_float, overhead = nnls(feats, list(secs))
        return {
            "update_ns_per_lookup": 1e9 * per_lookup,
            "update_ns_per_lookup_float": 1e9 * per_lookup_float,
            "update_ns_per_row_float": 1e9 * per_row_float,
            "update_overhead_us": 1e6 * overhead,
        }

    return time_round, fit


def _load() -> str:
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
    with _as_training(threads):
        # 1 GiB: tables far larger than any cache (the values do not matter)
        big = np.ones(256 << 20, np.float32)
        say("setting up")
        flush = _flusher(big)
        dispatch_time, dispatch_fit = _dispatch_timer(rng, flush)
        gather, scatter = _gather_scatter_gbps(rng, big)
        update_time, update_fit = _update_timer(rng, big)
        dense_time, dense_fit = _dense_timer(rng)
        # Every figure is timed once per round, ROUNDS rounds over, and the median round of each counts: a
        # slow spell of this machine (a VM's neighbours) that lasts a part of the calibration moves one round's
        # figures, not the description (a single pass once timed a whole phase 2-3x slow).
        timed: dict[str, list] = {}
        for r in range(ROUNDS):
            say(
                f"round {r + 1} of {ROUNDS}: dispatch, gather and scatter, copies, overlap, sparse update, dense compute"
            )
            for key, fn in (
                ("dispatch_1", lambda: _with_threads(1, dispatch_time)),
                ("dispatch_n", dispatch_time),
                ("gather_1", lambda: _with_threads(1, gather)),
                ("gather_n", gather),
                ("scatter_1", lambda: _with_threads(1, scatter)),
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
        device["reference_pass_us"] = 1e6 * float(mid["dense"][_REFERENCE])  # its pass with its assembly
        spread = {k: _spread(v) for k, v in timed.items()}
        spread["overlap"] = _spread([overlap_penalty(*t) for t in timed["overlap"]])  # the penalty's rounds
    return {
        "format": "hotline-hardware",
        "version": VERSION,
        "name": f"{platform.node() or 'this host'} ({platform.processor() or platform.machine()}, {threads} threads)",
        "source": f"hotline calibrate, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, "
        f"load average {_load()} (timings on a loaded machine are not this host's figures)",
        "calibration_s": time.perf_counter() - t0,
        "rounds": ROUNDS,
        "rounds_spread": spread,
        "host": host,
        "device": device,
        "link": {"shared_memory": True, "h2d_gbps": host["memcpy_gbps"], "d2h_gbps": host["memcpy_gbps"]},
    }
