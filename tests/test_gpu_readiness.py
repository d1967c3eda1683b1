"""The CUDA path's logic, tested where a CPU twin can test it: device mode's host-side distinct rows (no
torch.unique on the device), the Numba threading-layer preflight of look-ahead, pinning only in place."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from hotline.tiers.cold_store import HostRows
from hotline.tiers.pinning import pin_in_place
from hotline.tiers.sparse_optim import SparseOptimizer
from tests.test_equivalence import STEPS, _device, _run, assert_equivalent, datasets  # noqa: F401


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise-adagrad"])
def test_device_mode_host_distinct_path_equals_kernel_path(datasets, optimizer):  # noqa: F811
    """Device mode on CUDA feeds the torch update with distinct rows found on the host (run here on CPU)."""
    ds = datasets[3]
    ref = _device(ds, optimizer)
    got = _run(ds, "device", optimizer, device_updates=True)
    assert len(got[0]) == STEPS
    assert_equivalent(ref, got)
    # and it really took the host-distinct path: touched rows are counted from the distinct set
    assert all(s.counters["rows_touched"] > 0 for s in got[2])


def _layer_in_fresh_process(env_layer: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    if env_layer:
        env["NUMBA_THREADING_LAYER"] = env_layer
    code = "from hotline.pipeline.threads import check_concurrent_kernels as c; print(c())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_workqueue_threading_layer_is_refused_before_look_ahead():
    bad = _layer_in_fresh_process("workqueue")
    assert bad.returncode != 0 and "workqueue" in bad.stderr and "--lookahead 0" in bad.stderr
    good = _layer_in_fresh_process(None)
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip() in ("omp", "tbb")


def test_cold_rows_are_never_copied_to_be_pinned():
    """HostRows keeps the caller's memory (numpy views stay valid); without CUDA nothing is registered."""
    weights = np.random.default_rng(0).random((50, 4), dtype=np.float32)
    rows = HostRows(weights, SparseOptimizer("rowwise-adagrad", 0.1), pin=True)
    assert rows.weight.data_ptr() == weights.ctypes.data
    if not torch.cuda.is_available():
        assert pin_in_place(rows.weight) is None
    rows.close()


@pytest.mark.parametrize("lookahead", [0, 2])
def test_packed_copies_path_equals_device(datasets, tmp_path, lookahead):  # noqa: F811
    """The copy path CUDA takes (index arrays and dense inputs packed, device tensors as views) is exact."""
    from tests.test_equivalence import _placement

    ds = datasets[3]
    path = _placement(ds, "profiled", "rowwise-adagrad", tmp_path / "p.npz")
    got = _run(ds, "hotline", "rowwise-adagrad", path, lookahead, device_updates=True, pack_copies=True)
    assert_equivalent(_device(ds, "rowwise-adagrad"), got)


def test_copy_pack_round_trips_and_grows():
    from hotline.tiers.packing import CopyPack

    rng = np.random.default_rng(1)
    pack = CopyPack(pin=False, int_capacity=3)
    arrays = {
        "a": rng.integers(0, 1 << 40, 17).astype(np.int64),
        "empty": np.zeros(0, np.int64),
        "dense": rng.random((5, 13), dtype=np.float32),
        "b": rng.integers(-5, 5, 9).astype(np.int64),
        "labels": rng.random(5, dtype=np.float32),
    }
    out = pack.copy(arrays, torch.device("cpu"), non_blocking=False)
    assert out.keys() == arrays.keys()
    for k, a in arrays.items():
        assert out[k].shape == a.shape and np.array_equal(out[k].numpy(), a), k
    with pytest.raises(TypeError, match="int32"):
        pack.copy({"x": np.zeros(3, np.int32)}, torch.device("cpu"), non_blocking=False)


@pytest.mark.parametrize("forward", [True, False])
def test_stale_rows_forwarded_from_live_steps_or_refreshed_from_host(datasets, tmp_path, forward):  # noqa: F811
    """Look-ahead with stale rows: taken from the live working buffer of the step that last held them (no
    wait for its write-back), or, with forwarding off, re-read from host memory after it. Both equal device."""
    from hotline import TrainConfig, Trainer
    from hotline.pipeline.executor import Executor
    from tests.test_equivalence import ARCH, BATCH, _placement

    ds = datasets[1]
    path = _placement(ds, "profiled", "rowwise-adagrad", tmp_path / "p.npz")
    cfg = TrainConfig(mode="hotline", optimizer="rowwise-adagrad", learning_rate=0.05, mini_batch_size=BATCH,
                      num_batches=STEPS, progress=False, placement_path=path, lookahead=2, **ARCH)  # fmt: skip
    tr = Trainer(cfg, ds)
    try:
        ex = Executor(tr.mode, tr._compute_prepared, lookahead=2, forward_stale=forward)
        stats = list(ex.progress(tr.batches()))
        got = (np.array([s.loss_sum for s in stats]), tr.named_arrays(), stats)
    finally:
        tr.close()
    stale = sum(s.counters["stale_rows"] for s in stats)
    forwarded = sum(s.counters["stale_forwarded"] for s in stats)
    assert stale > 0
    assert (forwarded > 0) if forward else (forwarded == 0)
    assert forwarded <= stale
    assert_equivalent(_device(ds, "rowwise-adagrad"), got)


def test_the_loss_is_read_late_and_a_diverged_step_still_stops_the_run(tmp_path):
    """On a device a step's loss is copied to the host on the side and read one step later (no sync per
    step); a NaN is still caught, named with its own step, before anything of it is reported or saved."""
    from hotline import TrainConfig, Trainer
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate
    from hotline.tiers.base import DeferredLoss, step_loss

    assert step_loss(torch.tensor(2.5)) == 2.5 and float(DeferredLoss(torch.tensor(1.25))) == 1.25
    ds = Dataset(generate(tmp_path / "ds", 3000, seed=1, table_sizes=[30, 50], progress=False))
    cfg = TrainConfig(embedding_dim=4, bottom_mlp=[13, 4], top_mlp=[4, 1], mini_batch_size=32, learning_rate=1e30,
                      print_freq=10**6, num_batches=40, progress=False, eval_max_samples=32)  # fmt: skip
    tr = Trainer(cfg, ds)
    try:
        with pytest.raises(FloatingPointError, match=r"loss became nan at step (\d+)"):
            tr.fit()
        assert not [r for r in tr.history if r["kind"] == "train"]  # nothing of a diverged step reported
    finally:
        tr.close()


def test_modes_of_one_benchmark_share_one_computed_set_of_initial_tables():
    from hotline.table_layout import TableLayout
    from hotline.tiers.base import initial_tables, reusing_initial_tables

    layout = TableLayout([30, 7])
    plain = initial_tables(layout, 4, 3)
    with reusing_initial_tables():
        a, b = initial_tables(layout, 4, 3), initial_tables(layout, 4, 3)
        a[0, 0] += 1.0  # each mode updates its own copy
        c = initial_tables(layout, 4, 3)
    assert np.array_equal(b, plain) and np.array_equal(c, plain) and b is not c
