"""The dense pass timed on this CPU: a tiered forward and backward of a DLRM (its rows put together by the
Numba kernel, then the model's forward and backward), over the shapes the calibration fits the cost model's
compute formula to (:func:`dense_timer`), for a run's own model (:func:`time_pass`), and as a probe of this
CPU's speed at a moment (:func:`speed_probe`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

from hotline.costmodel.fitting import nnls
from hotline.costmodel.phases import compute_terms
from hotline.costmodel.timing import REPEATS, as_training, load_average, mean_s
from hotline.costmodel.workload import Workload, arch_of


def _tiered_pass(
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
    return _tiered_pass(rng, 1024, 26, 64, (13, 64, 64), (64, 1))[0]


# Model shapes the dense compute is fitted over: (batch, tables, dim, bottom MLP, top MLP[, interaction]); the
# dot interaction unless a shape names another, so the fit sees every model the cost model prices.
SHAPES = (
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


def dense_timer(
    rng: np.random.Generator,
) -> tuple[Callable[[bool], np.ndarray], Callable[[np.ndarray], dict]]:
    """The tiered forward and backward over :data:`SHAPES`: ``(time, fit)``. ``time(first)`` times one turn
    over every shape (its pass and, apart, its row assembly: :data:`REPEATS` calls each after one untimed call,
    three in the ``first`` turn), so that a machine that speeds up or slows down while it is calibrated moves
    every shape alike, not the shapes timed last; it returns the passes' seconds, then the assemblies'. ``fit``
    of a turn's (or the turns' median) figures: the assembly is the cost model's ``assemble`` phase, the rest
    fitted to MLP FLOPs, interaction FLOPs, bytes and a cost per pass; and the dense optimizer's step (timed in
    ``fit``), fitted to a cost per parameter tensor beyond streaming its parameters."""
    passes = [_tiered_pass(rng, B, T, D, bot, top, *arch) for B, T, D, bot, top, *arch in SHAPES]

    def time_turn(first: bool) -> np.ndarray:
        total = [mean_s(one, repeats=REPEATS, warmup=3 if first else 1) for one, _, _, _ in passes]
        asm = [mean_s(assemble, repeats=REPEATS, warmup=2 if first else 1) for _, assemble, _, _ in passes]
        return np.asarray(total + asm)

    def fit(timed: np.ndarray) -> dict:
        from hotline.tiers.sparse_optim import SparseOptimizer

        total, t_asm = timed[: len(passes)], timed[len(passes) :]
        feats, secs, assembled, dense_upd = [], [], [], []
        for (B, T, D, *_), (_, _, w, model), tot, ta in zip(SHAPES, passes, total, t_asm, strict=True):
            assembled.append((B * T * D * 4, ta))
            secs.append(max(tot - ta, 1e-7))
            feats.append([*compute_terms(w, B), 1.0])
            if B >= 1024:  # the dense optimizer's step over the same model
                import torch

                params = list(model.parameters())
                for q in params:
                    q.grad = torch.randn_like(q)
                opt = SparseOptimizer("sgd", 0.01).dense_optimizer(params)
                dense_upd.append((w, mean_s(opt.step, repeats=20, warmup=3)))
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


REFERENCE = 2
"""The shape of :data:`SHAPES` (batch 1024, 26 tables, dim 64, 13-64-64 / 64-1) whose pass
:func:`calibrate` keeps (``device.reference_pass_us``, its median round) and :func:`time_pass` times beside the
run's own, to tell this machine's speed at that moment from the run's model."""


def reference_pass(rng: np.random.Generator) -> Callable[[], None]:
    """One forward and backward, with its row assembly, of the calibration's reference shape
    (:data:`REFERENCE`; timed as ``device.reference_pass_us``)."""
    B, T, D, bot, top, *extra = SHAPES[REFERENCE]
    return _tiered_pass(rng, B, T, D, bot, top, *extra)[0]


def run_pass(rng: np.random.Generator, w: Workload) -> tuple[Callable[[], None], Callable[[], object]]:
    """The forward and backward (with its row assembly) of the model ``w`` prices at its batch size, and the
    assembly alone; multi-hot bags of mean size L as uniform bags of round(L)."""
    arch = {k: getattr(w, k) for k in ("interaction", "dcn_num_layers", "dcn_low_rank_dim")}
    L = max(1, int(round(w.pooling_factor)))
    one, assemble, _, _ = _tiered_pass(rng, w.batch_size, w.num_tables, w.embedding_dim, w.bottom_mlp, w.top_mlp, arch,
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
    with as_training(threads):
        ref = reference_pass(rng) if workload is None else run_pass(rng, workload)[0]
        ref()  # the first call allocates and, for Numba, compiles

    def probe() -> float:
        with as_training(threads):
            return 1e6 * float(np.median([mean_s(ref, repeats=1, warmup=0) for _ in range(calls)]))

    return probe


def time_pass(
    w: Workload,
    threads: int | None = None,
    seed: int = 0,
    budget_s: float = 2.0,
    reference_us: float | None = None,
) -> dict:
    """The dense pass of the model ``w`` prices, timed on this CPU at its batch size (the tiered forward and
    backward of :func:`_tiered_pass`, its row assembly timed apart), for the cost model's ``device.passes`` (see
    :func:`hotline.costmodel.phases.pass_key`).

    The fit of :func:`dense_timer` spans 13 shapes with four coefficients and can miss a single shape by far
    more than the timings' noise; anchored to this timing, the model keeps the fit's shape over batch sizes and
    passes but takes its scale from the run's own model. A timing of a second or two, though, lands on
    whatever speed this machine has then (a VM's speed moves within minutes), where the
    calibration's figures are medians of three rounds. So, given the calibration's ``reference_us`` (the pass
    of shape :data:`REFERENCE`), the run's pass and that reference are timed in alternation, each call
    timed alone, and the run's pass is the calibration's reference scaled by the ratio of their medians: a slow
    spell slows both. Without ``reference_us`` the run's median is taken as it is.

    Multi-hot bags of mean size L are timed as uniform bags of round(L). Threads as :func:`calibrate`
    (default: all cores); takes about ``budget_s`` seconds (3 to 24 timed pairs, after 2 untimed)."""
    threads = int(threads or os.cpu_count() or 1)
    L = max(1, int(round(w.pooling_factor)))
    rng = np.random.default_rng(seed)
    with as_training(threads):
        one, assemble = run_pass(rng, w)
        ref = reference_pass(rng)
        for fn in (one, ref, one, ref, assemble, assemble):
            fn()

        def once(fn) -> float:
            return mean_s(fn, repeats=1, warmup=0)

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
        "source": f"timed {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {load_average()}",
    }
