"""Calibration: times this host's dispatch, gather, scatter, sparse update, memory copy and dense compute, and
writes the hardware description the cost model reads (the CPU as its own device: the link is shared memory).

Every figure is timed with Hotline's own code paths (the dispatcher, the gather / scatter kernels, the sparse
optimizer, the DLRM forward and backward), as the median of a few repeats after a warm-up, at one thread and
at ``threads`` (host work of a look-ahead runs on the producer's threads; compute on all of them). The dense
compute is fitted, by non-negative least squares over several model shapes, to the cost model's own formula
(FLOPs at a rate, bytes at a bandwidth, a fixed cost per pass), so predictions use the same units it measured.
"""

from __future__ import annotations

import os
import platform
import queue
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np

from hotline.profiling.costmodel import Workload, compute_features

VERSION = 1


def _median_s(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def _nnls(features: list[list[float]], seconds: list[float]) -> np.ndarray:
    """Non-negative least squares (active set: drop the most negative coefficient, solve again), each row
    weighted by 1/seconds so relative errors count, not absolute ones. numpy only: the GPU image has no scipy."""
    a = np.asarray(features, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    w = 1.0 / y
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    a = a / scale * w[:, None]
    b = y * w
    free = np.ones(a.shape[1], dtype=bool)
    coef = np.zeros(a.shape[1])
    while free.any():
        sol = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
        if (sol >= 0).all():
            coef[free] = sol
            break
        idx = np.flatnonzero(free)
        free[idx[np.argmin(sol)]] = False
    return coef / scale


def _with_threads(n: int, fn: Callable[[], float]) -> float:
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        return fn()
    finally:
        numba.set_num_threads(before)


def _dispatch_ns_per_lookup(
    rng: np.random.Generator, batch: int = 4096, tables: int = 26
) -> Callable[[], float]:
    from hotline.dispatch import Dispatcher
    from hotline.placement import Placement

    sizes = [200_000] * tables
    ranks = np.minimum(rng.zipf(1.1, size=(batch * 8, tables)), sizes[0]) - 1
    hot = [np.arange(int(0.02 * n), dtype=np.int64) for n in sizes]  # the most popular 2% of each table
    placement = Placement.from_hot_ids(sizes, hot, dataset_fingerprint="", embedding_dim=16, bytes_per_row=64,
                                       hbm_budget_bytes=64 * sum(h.size for h in hot))  # fmt: skip
    d = Dispatcher(placement, 1, batch)
    ids = ranks.astype(np.int32)[:, :, None]
    i = [0]

    def one() -> None:
        b = i[0] % 8
        i[0] += 1
        d.split(ids[b * batch : (b + 1) * batch])

    return lambda: _median_s(one, repeats=7, warmup=2) / (batch * tables) * 1e9


def _gather_scatter_gbps(rng: np.random.Generator, dim: int = 64) -> tuple[Callable, Callable]:
    from hotline.kernels.gather import gather_rows, scatter_rows

    table = rng.standard_normal((1_000_000, dim), dtype=np.float32)
    rows = np.unique(rng.integers(0, table.shape[0], 120_000)).astype(np.int64)
    rng.shuffle(rows)
    out = np.empty((rows.shape[0], dim), np.float32)
    nbytes = rows.shape[0] * dim * 4

    def gather() -> float:
        return nbytes / _median_s(lambda: gather_rows(table, rows, out)) / 1e9

    def scatter() -> float:
        return nbytes / _median_s(lambda: scatter_rows(table, rows, out)) / 1e9

    return gather, scatter


def _memcpy_gbps() -> float:
    src = np.ones(32 << 20, np.float32)  # 128 MiB
    dst = np.empty_like(src)
    return src.nbytes / _median_s(lambda: np.copyto(dst, src)) / 1e9


def _handover_us(rounds: int = 2000) -> float:
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


def _overlap_penalty(rng: np.random.Generator, threads: int) -> float:
    """How much of the shorter of two overlapped lanes still costs time when host work (a Numba gather on a
    worker thread, one Numba thread, holding the GIL as the producer's kernels do) runs beside the dense
    compute (torch on ``threads`` threads) on this CPU: (together - longer) / shorter, 0 = free overlap,
    1 = none. The look-ahead step on a CPU device is priced with it."""
    import numba
    import torch

    from hotline.kernels.gather import gather_rows
    from hotline.tiers.base import loss_and_backward, sum_pool
    from hotline.training.config import TrainConfig
    from hotline.training.model import DLRM

    cfg = TrainConfig(embedding_dim=64, bottom_mlp=[13, 64, 64], top_mlp=[64, 1], mini_batch_size=1024)
    model = DLRM(cfg.model_config([1000] * 26), seed=0)
    table = torch.randn(50_000, 64)
    ids = torch.from_numpy(rng.integers(0, 50_000, 1024 * 26))
    dense, labels = torch.randn(1024, 13), torch.zeros(1024)

    def device_work(n: int = 12) -> None:
        for _ in range(n):
            rows = table.index_select(0, ids).requires_grad_(True)
            loss_and_backward(model, dense, sum_pool(rows, 26, 1), labels, 1024)
            model.zero_grad(set_to_none=True)

    host_table = rng.standard_normal((400_000, 64), dtype=np.float32)
    host_rows = rng.integers(0, 400_000, 40_000).astype(np.int64)
    out = np.empty((host_rows.shape[0], 64), np.float32)

    def host_work(n: int) -> None:
        numba.set_num_threads(1)  # thread-local, as in the producer
        for _ in range(n):
            gather_rows(host_table, host_rows, out)

    device_work(2)
    host_work(2)
    t_d = _median_s(device_work, repeats=3, warmup=0)
    t_one = _median_s(lambda: host_work(1), repeats=5, warmup=0)
    n_host = max(1, int(0.6 * t_d / max(t_one, 1e-6)))
    t_h = _median_s(lambda: host_work(n_host), repeats=3, warmup=0)

    def together() -> None:
        worker = threading.Thread(target=host_work, args=(n_host,))
        worker.start()
        device_work()
        worker.join()

    t_both = _median_s(together, repeats=3, warmup=1)
    return float(min(1.5, max(0.0, (t_both - max(t_d, t_h)) / min(t_d, t_h))))


# Model shapes the dense compute is fitted over: (batch, tables, dim, bottom MLP, top MLP).
_SHAPES = (
    (4096, 26, 64, (13, 64, 64), (64, 1)),
    (1024, 26, 64, (13, 64, 64), (64, 1)),
    (2048, 26, 16, (13, 512, 256, 64, 16), (512, 256, 1)),
    (512, 26, 16, (13, 512, 256, 64, 16), (512, 256, 1)),
    (64, 26, 16, (13, 64, 16), (64, 1)),
    (4096, 8, 32, (13, 256, 32), (256, 1)),
    (8, 4, 8, (13, 8), (8, 1)),
)


def _dense_fit(rng: np.random.Generator) -> dict:
    import torch

    from hotline.tiers.base import loss_and_backward, sum_pool
    from hotline.training.config import TrainConfig
    from hotline.training.model import DLRM

    feats, secs = [], []
    for B, T, D, bot, top in _SHAPES:
        w = Workload(B, T, 1, D, bot, top)
        cfg = TrainConfig(embedding_dim=D, bottom_mlp=list(bot), top_mlp=list(top), mini_batch_size=B)
        model = DLRM(cfg.model_config([1000] * T), seed=0)
        table = torch.randn(50_000, D)
        ids = torch.from_numpy(rng.integers(0, 50_000, B * T))
        dense = torch.randn(B, 13)
        labels = torch.from_numpy((rng.random(B) < 0.25).astype(np.float32))

        def one(model=model, table=table, ids=ids, dense=dense, labels=labels, T=T, B=B) -> None:
            rows = table.index_select(0, ids).requires_grad_(True)
            loss_and_backward(model, dense, sum_pool(rows, T, 1), labels, B)
            model.zero_grad(set_to_none=True)

        secs.append(_median_s(one, repeats=5, warmup=2))
        feats.append([*compute_features(w, B), 1.0])
    inv_rate, inv_bw, overhead = _nnls(feats, secs)
    predicted = np.asarray(feats) @ np.array([inv_rate, inv_bw, overhead])
    return {
        "dense_gflops": 1e-9 / max(inv_rate, 1e-18),
        "mem_gbps": 1e-9 / max(inv_bw, 1e-18),
        "pass_overhead_us": 1e6 * overhead,
        "dense_fit_max_rel_error": float(np.max(np.abs(predicted / np.asarray(secs) - 1))),
    }


def _update_fit(rng: np.random.Generator) -> dict:
    """Sparse SGD update (coalesce + row update) over shapes of lookups n, distinct rows u, dim D and table
    sizes; fitted to n, n*D, u*D and a fixed cost."""
    import torch

    from hotline.kernels import sparse_update
    from hotline.tiers.sparse_optim import SparseOptimizer

    opt = SparseOptimizer("sgd", 0.01)
    feats, secs = [], []
    shapes = ((100_000, 1_000_000, 64), (100_000, 5_000, 64), (20_000, 200_000, 16), (200_000, 2_000_000, 16),
              (50_000, 20_000, 64), (50_000, 2_000_000, 16))  # fmt: skip
    for n, rows, D in shapes:
        table = torch.randn(rows, D)
        state = torch.zeros(0)
        ids = torch.from_numpy(np.minimum(rng.zipf(1.05, n), rows) - 1)  # skewed, as lookups are
        ids = torch.from_numpy(rng.permutation(rows)[ids.numpy()])  # popular rows scattered over the table
        grads = torch.randn(n, D)
        scratch = sparse_update.new_scratch(rows)
        unique = int(np.unique(ids.numpy()).shape[0])
        secs.append(_median_s(lambda t=table, s=state, i=ids, g=grads, sc=scratch: opt.step(t, s, i, g, sc)))
        feats.append([n, n * D, unique * D, 1.0])
    per_lookup, per_lookup_float, per_row_float, overhead = _nnls(feats, secs)
    return {
        "update_ns_per_lookup": 1e9 * per_lookup,
        "update_ns_per_lookup_float": 1e9 * per_lookup_float,
        "update_ns_per_row_float": 1e9 * per_row_float,
        "update_overhead_us": 1e6 * overhead,
    }


def _load() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "unknown"


def calibrate(
    threads: int | None = None, seed: int = 0, progress: Callable[[str], None] | None = None
) -> dict:
    """Times this host (at ``threads`` torch/numba threads; default: all cores) and returns its hardware
    description: the CPU is its own device, the link shared memory. Takes well under a minute."""
    import numba
    import torch

    cores = os.cpu_count() or 1
    threads = int(threads or cores)
    torch_before, numba_before = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    say = progress or (lambda _: None)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    try:
        say("dispatch")
        dispatch = _dispatch_ns_per_lookup(rng)
        host = {"dispatch_ns_per_lookup": {"1": _with_threads(1, dispatch), "n": dispatch()}}
        say("gather and scatter")
        gather, scatter = _gather_scatter_gbps(rng)
        host["gather_gbps"] = {"1": _with_threads(1, gather), "n": gather()}
        host["scatter_gbps"] = {"1": _with_threads(1, scatter), "n": scatter()}
        say("memory copy")
        host["memcpy_gbps"] = _memcpy_gbps()
        host["handover_us"] = _handover_us()
        host.update(threads=threads, cores=cores)
        say("overlap of host work and compute")
        host["overlap_penalty"] = _overlap_penalty(rng, threads)
        say("sparse update")
        # The device is this CPU: device mode reads its rows out of host memory at the gather bandwidth.
        device = {"kind": "cpu", "gather_gbps": host["gather_gbps"]["n"], **_update_fit(rng)}
        say("dense compute")
        device.update(_dense_fit(rng))
    finally:
        torch.set_num_threads(torch_before)
        numba.set_num_threads(numba_before)
    return {
        "format": "hotline-hardware",
        "version": VERSION,
        "name": f"{platform.node() or 'this host'} ({platform.processor() or platform.machine()}, {threads} threads)",
        "source": f"hotline calibrate, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, "
        f"load average {_load()} (timings on a loaded machine are not this host's figures)",
        "calibration_s": time.perf_counter() - t0,
        "host": host,
        "device": device,
        "link": {"shared_memory": True, "h2d_gbps": host["memcpy_gbps"], "d2h_gbps": host["memcpy_gbps"]},
    }
