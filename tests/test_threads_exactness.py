"""What docs/exactness.md says about thread counts: device mode trains the same parameters, bit for bit, at 1 and
2 torch/numba threads, for the default model and the tests' small one.

Two parts make that hold. Hotline's own reductions (the Numba sums of duplicate rows' gradients in the sparse
updates) add in input order whatever the thread count: tested here kernel by kernel, in one process. torch's
reductions over the batch are split over their outputs, not over the batch; its matrix products go to the BLAS
(MKL in torch's CPU wheels), whose partition of a product over threads decides the order of its sums: at 1 and
2 threads it gives the same bits for every shape these models use on the machines this was measured on, at 8
some shapes differ (docs/exactness.md has the figures). So each thread count trains in its own process, with
its thread settings, as a user's run would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numba
import numpy as np
import pytest

from hotline.datasets.synthetic import generate
from hotline.kernels import sparse_update

MODELS = {  # name -> (architecture, table sizes of its dataset)
    "default": (
        {"embedding_dim": 16, "bottom_mlp": [13, 512, 256, 64, 16], "top_mlp": [512, 256, 1]},
        None,  # the Kaggle table sizes, capped (26 tables: the default model's interaction width)
    ),
    "small": (
        {"embedding_dim": 8, "bottom_mlp": [13, 32, 8], "top_mlp": [32, 1]},
        [30, 200, 12, 500, 60, 5, 90, 40],
    ),
}
STEPS = 30

_WORKER = r"""
import json, sys
import numpy as np
from hotline.pipeline.threads import configure_threads
from hotline.training.config import TrainConfig
from hotline.training.trainer import Trainer

threads, jobs = json.loads(sys.argv[1])
configure_threads(threads)
for fields, data, out in jobs:
    trainer = Trainer(TrainConfig(**fields), data)
    np.savez(out[: -len(".npz")] + "-init.npz", **trainer.named_arrays())  # where training starts
    losses = [float(s.loss_sum) for s in trainer.progress(trainer.batches())]
    np.savez(out, losses=np.asarray(losses), **trainer.named_arrays())
    trainer.close()
"""


def _train(threads: int, jobs: list, tmp_path) -> None:
    """Trains every ``(config fields, dataset, out)`` job in one fresh process at ``threads`` torch and numba
    threads (numba may start up to 2 whatever the cores)."""
    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-c", _WORKER, json.dumps([threads, jobs])], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("model", MODELS)
def test_device_mode_is_bit_identical_at_1_and_2_threads(model, tmp_path):
    arch, tables = MODELS[model]
    data = generate(tmp_path / "data", 128 * STEPS * 7 // 6 + 300, seed=3, table_sizes=tables,
                    max_rows_per_table=1000, zipf=1.3, progress=False)  # fmt: skip
    cases = [(opt, batch) for opt in ("sgd", "rowwise-adagrad") for batch in (64, 128)]
    for threads in (1, 2):
        jobs = [
            ({"mode": "device", "optimizer": opt, "learning_rate": 0.1, "mini_batch_size": batch,
              "num_batches": STEPS, "progress": False, **arch}, str(data), str(tmp_path / f"{opt}-{batch}-t{threads}.npz"))
            for opt, batch in cases
        ]  # fmt: skip
        _train(threads, jobs, tmp_path)
    for opt, batch in cases:
        one, two = (np.load(tmp_path / f"{opt}-{batch}-t{t}.npz") for t in (1, 2))
        assert one.files == two.files and len(one["losses"]) == STEPS
        for name in one.files:
            a, b = one[name], two[name]
            assert np.array_equal(a, b), (
                f"{model} {opt} batch {batch}: {name} differs at 2 threads by "
                f"{float(np.abs(a.astype(np.float64) - b).max()):.3e} (max |x| {float(np.abs(a).max()):.3e})"
            )


def test_every_optimizer_and_interaction_at_1_and_2_threads_within_the_noise_floor(tmp_path):
    """The small model in device mode with every optimizer that normalises its steps (row-wise Adagrad, Adagrad,
    Adam: a rounding difference in a near-zero gradient, which SGD's small step hides, becomes a full-size step)
    and every interaction (``dot``, ``cat``, ``dcn``), one-hot and multi-hot (3 ids a bag), at 1 and 2 threads.

    On the AMD EPYC these were measured on the two give the same bits; on another CPU the BLAS may partition a
    product over its threads otherwise (a pass on another machine measured up to 4.8e-6 with Adam), so the bound
    is the float32 noise floor of the same training (tests/reference.py: ``NOISE_FACTOR`` times the largest
    distance of a float32 run of the reference from its float64 run), not the bits of one CPU."""
    from reference import NOISE_FACTOR, max_rel_diff, noise_floor

    arch, tables = MODELS["small"]
    data = {
        "onehot": generate(tmp_path / "onehot", 64 * STEPS * 7 // 6 + 300, seed=5, table_sizes=tables,
                           zipf=1.3, progress=False),
        "multihot": generate(tmp_path / "multihot", 64 * STEPS * 7 // 6 + 300, seed=6, table_sizes=tables,
                             zipf=1.3, pooling_factor=3, progress=False),
    }  # fmt: skip
    cases = [
        (opt, op, "onehot") for opt in ("rowwise-adagrad", "adagrad", "adam") for op in ("dot", "cat", "dcn")
    ]
    cases += [(opt, "dot", "multihot") for opt in ("rowwise-adagrad", "adam")]
    rate = {"adam": 0.01}
    for threads in (1, 2):
        jobs = [
            ({"mode": "device", "optimizer": opt, "learning_rate": rate.get(opt, 0.1), "mini_batch_size": 64,
              "num_batches": STEPS, "progress": False, "interaction": op, **arch},
             str(data[d]), str(tmp_path / f"{opt}-{op}-{d}-t{threads}.npz"))
            for opt, op, d in cases
        ]  # fmt: skip
        _train(threads, jobs, tmp_path)
    exact = 0
    for opt, op, d in cases:
        one, two = (dict(np.load(tmp_path / f"{opt}-{op}-{d}-t{t}.npz")) for t in (1, 2))
        assert one.keys() == two.keys() and len(one["losses"]) == STEPS
        exact += all(np.array_equal(one[k], two[k]) for k in one)
        init = dict(np.load(tmp_path / f"{opt}-{op}-{d}-t1-init.npz"))
        floor = noise_floor(init, op, opt, rate.get(opt, 0.1), data[d], 64, num_batches=STEPS)
        params = {k: v for k, v in one.items() if k != "losses"}
        err, where = max_rel_diff(params, {k: two[k] for k in params})
        assert err <= NOISE_FACTOR * floor.param_floor, (
            f"{opt} {op} {d}: {where} differs at 2 threads by {err:.2e} of its scale, more than "
            f"{NOISE_FACTOR:g} x the float32 noise floor {floor.param_floor:.2e}"
        )
    print(f"{exact} of {len(cases)} cases bit-identical at 1 and 2 threads on this CPU")


def _at_threads(threads: int, fn):
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        return fn()
    finally:
        numba.set_num_threads(before)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="numba was started with 1 thread")
def test_sparse_update_sums_do_not_depend_on_numba_threads():
    """Every sparse-update kernel gives the same bits at 1 and 2 numba threads: many duplicate ids, gradients of
    mixed magnitude (any other order of the sums rounds differently)."""
    rng = np.random.default_rng(0)
    rows, dim = 50, 16
    ids = rng.integers(0, rows, 4000)  # about 80 lookups of every row
    scale = 10.0 ** rng.integers(-4, 4, (ids.size, 1))
    grads = (rng.standard_normal((ids.size, dim)) * scale).astype(np.float32)
    table0 = rng.standard_normal((rows, dim)).astype(np.float32)
    split = 1500
    parts = [(ids[:split], grads, None), (ids[split:], grads, np.arange(split, ids.size))]

    def run():
        out = {"coalesce": sparse_update.coalesce(ids, grads, rows=rows)[1]}
        t = table0.copy()
        sparse_update.sparse_sgd_(t, ids, grads, 0.1)
        out["sgd"] = t
        t, s = table0.copy(), np.zeros(rows, np.float32)
        sparse_update.sparse_rowwise_adagrad_(t, s, ids, grads, 0.1, 1e-8)
        out["rowwise-adagrad"], out["rowwise-adagrad state"] = t, s
        t, s = table0.copy(), np.zeros((rows, dim), np.float32)
        sparse_update.sparse_adagrad_(t, s, ids, grads, 0.1, 1e-8)
        out["adagrad"] = t
        t, s = table0.copy(), np.zeros((rows, 2 * dim + 1), np.float32)
        sparse_update.sparse_adam_(t, s, ids, grads, 0.01, 0.9, 0.999, 1e-8)
        out["adam"] = t
        for kind in ("sgd", "rowwise-adagrad"):
            t, s = table0.copy(), np.zeros(rows, np.float32)
            sparse_update.sparse_update_parts_(kind, t, s, parts, 0.1, 1e-8, sparse_update.new_scratch(rows))
            out[f"parts {kind}"] = t
        return out

    one, two = _at_threads(1, run), _at_threads(2, run)
    for name, a in one.items():
        assert np.array_equal(a, two[name]), f"{name}: differs at 2 numba threads"
    # the same sums as one pass in input order (float32, left to right)
    want = np.zeros((rows, dim), np.float32)
    for i, g in zip(ids, grads):
        want[i] += g
    uniq = sparse_update.coalesce(ids, grads, rows=rows)[0]
    assert np.array_equal(one["coalesce"], want[uniq])


def test_a_trainer_computes_on_the_threads_its_config_gives_and_restores_them(tmp_path):
    """``Trainer(TrainConfig(threads=n))`` through the Python API runs torch (and numba) on ``n`` threads for
    its steps, and its ``close`` gives the process its counts back; ``threads=0`` leaves them as they are; a
    Trainer that fails to start restores them too."""
    import torch

    from hotline.training.config import TrainConfig
    from hotline.training.trainer import Trainer

    arch, tables = MODELS["small"]
    data = generate(tmp_path / "data", 600, seed=3, table_sizes=tables, zipf=1.3, progress=False)
    before = (torch.get_num_threads(), numba.get_num_threads())
    for threads in (1 if before[0] != 1 else 2, 0):
        want = (threads, min(threads, numba.config.NUMBA_NUM_THREADS)) if threads else before
        trainer = Trainer(TrainConfig(mode="device", mini_batch_size=64, num_batches=3, progress=False,
                                      threads=threads, **arch), data)  # fmt: skip
        seen: list[tuple[int, int]] = []
        trainer.model.register_forward_pre_hook(
            lambda *_, seen=seen: seen.append((torch.get_num_threads(), numba.get_num_threads()))
        )
        try:
            assert len(list(trainer.progress(trainer.batches()))) == 3
        finally:
            trainer.close()
        assert len(seen) == 3 and set(seen) == {want}, (threads, seen)
        assert (torch.get_num_threads(), numba.get_num_threads()) == before
    wrong = {**arch, "bottom_mlp": [12, *arch["bottom_mlp"][1:]]}  # the data have 13 dense features
    with pytest.raises(ValueError, match="dense features"):  # a start that fails gives the counts back too
        Trainer(TrainConfig(mode="device", threads=1 if before[0] != 1 else 2, progress=False, **wrong), data)
    assert (torch.get_num_threads(), numba.get_num_threads()) == before
