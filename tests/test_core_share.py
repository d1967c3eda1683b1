"""The look-ahead pipeline's core sharing: every producer kernel releases the GIL, torch keeps the cores the
producer was measured not to use (one rule, in hotline.pipeline.threads, that the cost model prices too), and
the hand-over from the producer to the step copies nothing on a CPU."""

from __future__ import annotations

import importlib
import json
import pkgutil

import numpy as np
import pytest
import torch

import hotline.kernels
from hotline import costmodel as cm
from hotline.datasets.synthetic import generate
from hotline.pipeline.threads import (
    BETWEEN_STEPS_THREADS,
    BUSY_CORE_SLACK,
    CoreShare,
    compute_threads,
    numba_threads,
)


def test_every_compiled_kernel_releases_the_gil():
    """A kernel the look-ahead producer (or any thread) runs must not hold the GIL: checked on every Numba
    kernel of hotline.kernels (helpers inlined into their callers have no entry point of their own)."""
    kernels = []
    for info in pkgutil.iter_modules(hotline.kernels.__path__):
        module = importlib.import_module(f"hotline.kernels.{info.name}")
        for name, fn in vars(module).items():
            if hasattr(fn, "py_func") and getattr(fn, "targetoptions", None) is not None:
                if fn.targetoptions.get("inline", "never") != "always":
                    kernels.append((info.name, name, fn.targetoptions.get("nogil", False)))
    assert (
        len(kernels) >= 25
    )  # dispatch, gather, sparse_update, reuse, profile, probe, criteo_parse, synthetic
    holding = [f"{m}.{n}" for m, n, nogil in kernels if not nogil]
    assert holding == []


@pytest.mark.parametrize(
    "cores, workers, share, expect",
    [
        (2, 1, 1.0, 1),  # a producer busy the whole step takes its core
        (2, 1, 0.5, 1),
        (2, 1, BUSY_CORE_SLACK, 2),  # up to the slack it takes nothing
        (2, 1, 0.0, 2),
        (1, 1, 1.0, 1),  # never below one thread
        (16, 4, 0.5, 14),  # 2 busy cores of 16
        (16, 4, 0.6, 13),  # 2.4 busy cores: past the slack, a third core
        (8, 2, 3.0, 6),  # a share above 1 counts as 1
    ],
)
def test_compute_threads_golden(cores, workers, share, expect):
    assert compute_threads(cores, workers, share) == expect


def test_core_share_follows_measurement_and_restores():
    before = torch.get_num_threads()
    share = CoreShare(worker_threads=1, cores=2)
    assert share.threads == 1  # the producer fills its queue first: taken as fully busy
    with share.lowered() as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    share.record(busy_s=0.030, step_s=0.010)  # the first step holds the queue's fill: left out
    assert share.busy_share == 1.0 and share.threads == 1
    share.record(busy_s=0.001, step_s=0.010)  # the second step's share is taken as it is
    assert share.busy_share == pytest.approx(0.1) and share.threads == 2
    for _ in range(40):  # the producer stays busy 10% of each step: torch keeps its cores
        share.record(busy_s=0.001, step_s=0.010)
    assert share.busy_share == pytest.approx(0.1, abs=0.01) and share.threads == 2
    share.record(busy_s=0.009, step_s=0.010)  # one slow step does not flip it
    assert share.threads == 2


def test_core_share_leaves_torch_threads_alone_when_the_compute_runs_on_cuda(monkeypatch):
    """On CUDA the step's compute is the device's: no change of torch's thread count per step (the rule needs
    only the device's type, so this runs without a GPU)."""
    calls, real = [], torch.set_num_threads
    monkeypatch.setattr(
        torch, "set_num_threads", lambda n: (calls.append(n), real(n))
    )  # a spy: still sets it
    before = torch.get_num_threads()
    with CoreShare(worker_threads=1, cores=2).lowered():  # on the CPU: the rule's count, then restored
        pass
    assert calls == [1, before]
    calls.clear()
    share = CoreShare(worker_threads=1, cores=2, device="cuda")
    with share.lowered() as n:
        assert n == before and torch.get_num_threads() == before
    assert calls == [] and share.on_device
    assert not CoreShare(worker_threads=1, cores=2, device="cpu").on_device


def test_core_share_averages_the_first_steps_then_runs_an_average():
    """The share is the mean of the steps after the fill until there are 1 / smoothing of them, then a running
    average with weight ``smoothing`` (golden values by hand)."""
    share = CoreShare(worker_threads=1, cores=4, smoothing=0.25)
    share.record(busy_s=1.0, step_s=1.0)  # the fill
    for busy in (0.1, 0.3, 0.2, 0.4):  # 4 = 1 / smoothing records: their mean
        share.record(busy_s=busy, step_s=1.0)
    assert share.busy_share == pytest.approx(0.25)
    share.record(busy_s=0.65, step_s=1.0)  # then weight 0.25: 0.25 + 0.25 * (0.65 - 0.25)
    assert share.busy_share == pytest.approx(0.35)
    share.record(busy_s=0.5, step_s=0.0)  # a step of no time is not a measurement
    assert share.busy_share == pytest.approx(0.35) and share.records == 6


def test_cost_model_prices_the_executor_rule():
    """The look-ahead step on a CPU device: torch threads by the same rule, device work stretched to them
    without a calibration, the calibrated penalty with one."""
    host = {"cores": 2, "threads": 2}
    n, step = cm.shared_cores_lane(1.0, 1.0, host, 1)  # the producer busy half the step: torch on 1 thread
    assert n == compute_threads(2, 1, 1.0 / step) == 1 and step == pytest.approx(2.0)
    n, step = cm.shared_cores_lane(0.1, 1.0, host, 1)  # busy 10%: torch keeps both
    assert n == 2 and step == pytest.approx(1.0)
    n, step = cm.shared_cores_lane(0.5, 1.0, {**host, "overlap_penalty": 0.4}, 1)
    assert step == pytest.approx(1.2) and n == compute_threads(2, 1, 0.5 / 1.2)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from hotline.datasets.format import Dataset

    root = tmp_path_factory.mktemp("share")
    return Dataset(generate(root / "ds", 2000, seed=3, table_sizes=[40, 30, 500], zipf=1.2, progress=False))


def _trainer(dataset, tmp_path, lookahead, share_cores=False):
    from hotline import TrainConfig, Trainer
    from hotline.placement import Placement

    hot = [np.arange(n // 3) for n in dataset.table_sizes]
    path = tmp_path / "p.npz"
    Placement.from_hot_ids(
        dataset.table_sizes, hot, dataset_fingerprint=dataset.fingerprint, embedding_dim=8
    ).save(path)
    cfg = TrainConfig(mode="hotline", placement_path=str(path), lookahead=lookahead, embedding_dim=8,
                      bottom_mlp=[13, 16, 8], top_mlp=[16, 1], mini_batch_size=32, progress=False,
                      num_batches=12, share_cores=share_cores)  # fmt: skip
    return Trainer(cfg, dataset)


@pytest.mark.parametrize("share_cores", [False, True])
def test_lookahead_run_reports_its_threads_and_restores_them(dataset, tmp_path, share_cores):
    """With --share-cores the compute runs on the rule's threads (the first steps: the producer taken as
    busy); without, on torch's own (bit-identical to device mode). Either way torch's count is restored."""
    before = torch.get_num_threads()
    trainer = _trainer(dataset, tmp_path, lookahead=2, share_cores=share_cores)
    try:
        stats = list(trainer.progress(trainer.batches()))
    finally:
        trainer.close()
    assert len(stats) == 12
    for s in stats:
        assert 1 <= s.counters["compute_threads"] <= before
        assert 0.0 <= s.counters["producer_busy_share"] <= 1.0
    first = stats[0].counters["compute_threads"]
    assert first == (compute_threads(before, 1, 1.0) if share_cores else before)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("forward_stale", [True, False])
def test_the_refresh_of_stale_rows_runs_on_the_between_steps_threads(
    dataset, tmp_path, monkeypatch, forward_stale
):
    """The main thread's refresh (stale rows forwarded from a live step, or read after the write-back) runs
    its copies on BETWEEN_STEPS_THREADS Numba threads, and the main thread's count is back after each step; the
    run equals the same run with the refresh on two threads (the copies do not depend on the count)."""
    import numba

    import hotline.pipeline.executor as executor
    import hotline.pipeline.threads as threads

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba has one thread here: nothing to lower")
    init = executor.Executor.__init__
    monkeypatch.setattr(executor.Executor, "__init__",
                        lambda self, *a, **k: init(self, *a, **{**k, "forward_stale": forward_stale}))  # fmt: skip
    runs = {}
    for between in (2, BETWEEN_STEPS_THREADS):
        monkeypatch.setattr(threads, "BETWEEN_STEPS_THREADS", between)
        (tmp_path / str(between)).mkdir()
        trainer = _trainer(dataset, tmp_path / str(between), lookahead=2)
        refresh, seen, after = trainer.mode.refresh, [], []

        def counted(prep, live=None, refresh=refresh, seen=seen):
            seen.append(numba.get_num_threads())
            return refresh(prep, live)

        trainer.mode.refresh = counted
        try:
            with numba_threads(2):
                for _ in trainer.progress(trainer.batches()):
                    after.append(numba.get_num_threads())
            runs[between] = [p.detach().clone() for p in trainer.model.parameters()]
        finally:
            trainer.close()
        assert len(seen) >= 3 and set(seen) == {between}  # the run had stale rows, refreshed on those threads
        assert set(after) == {2}
    assert all(torch.equal(a, b) for a, b in zip(runs[2], runs[BETWEEN_STEPS_THREADS]))


def test_numba_threads_restores_the_count_on_an_error():
    import numba

    before = numba.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"):
        with numba_threads(1) as n:
            assert n == numba.get_num_threads() == 1
            raise RuntimeError("inside")
    assert numba.get_num_threads() == before
    with numba_threads(10**6) as n:  # clipped to Numba's pool
        assert n == numba.config.NUMBA_NUM_THREADS


def test_hand_over_copies_nothing_on_cpu(dataset, tmp_path):
    """The prepared step's index tensors and working rows are views of the dispatcher's and the staging
    buffers: the queue hands over references, and the step reads them in place."""
    trainer = _trainer(dataset, tmp_path, lookahead=2)
    try:
        batch = next(iter(trainer.batches()))
        prep = trainer.mode.prepare(batch)
        for name in ("hot_pos", "hot_slot", "cold_pos", "cold_slot"):
            assert prep.index[name].data_ptr() == getattr(prep.micro, name).ctypes.data, name
        assert prep.work.data_ptr() == prep.fetch.values.ctypes.data
    finally:
        trainer.close()


_SPIN_RUN = """
import sys, warnings
{first}
from hotline import TrainConfig, Trainer
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate

ds = Dataset(generate(sys.argv[1], 600, seed=1, table_sizes=[40, 300], progress=False))
warnings.simplefilter("always")
for run in range(2):  # two look-ahead runs in one process: one warning at most
    cfg = TrainConfig(mode="hotline", hbm_budget=2000, lookahead=2, embedding_dim=8, bottom_mlp=[13, 8],
                      top_mlp=[8, 1], mini_batch_size=64, progress=False, num_batches=4)
    trainer = Trainer(cfg, ds)
    try:
        print(len(list(trainer.progress(trainer.batches()))), "steps")
    finally:
        trainer.close()
"""


@pytest.mark.parametrize(
    "first, env, warned",
    [
        ("import torch\nimport hotline", {}, True),  # torch's OpenMP read the spinning default
        ("import hotline\nimport torch", {}, False),  # hotline set the passive policy first
        ("import torch\nimport hotline", {"OMP_WAIT_POLICY": "ACTIVE"}, False),  # the user's own choice
    ],
)
def test_lookahead_warns_once_when_torch_was_imported_first(tmp_path, first, env, warned):
    """A Python user who imports torch before hotline gets torch's spinning OpenMP threads beside the
    look-ahead producer; the run says so in one line, once per process (two runs here), and not otherwise."""
    import os
    import subprocess
    import sys

    import hotline

    base = {k: v for k, v in os.environ.items() if k not in hotline._WAIT_POLICY_VARS}
    out = subprocess.run(
        [sys.executable, "-c", _SPIN_RUN.format(first=first), str(tmp_path / "ds")],
        capture_output=True, text=True, env={**base, **env}, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("4 steps") == 2
    lines = [line for line in out.stderr.splitlines() if "imported before hotline" in line]
    assert len(lines) == (1 if warned else 0), out.stderr[-2000:]
    if warned:
        assert "RuntimeWarning" in lines[0] and "OMP_WAIT_POLICY=PASSIVE" in lines[0]


@pytest.mark.parametrize(
    "env, seen",
    [
        ({}, ["PASSIVE", "3000"]),  # hotline's: a short spin, then a passive wait
        ({"OMP_WAIT_POLICY": "ACTIVE"}, ["ACTIVE", None]),  # the user's policy, with nothing added
        ({"OMP_WAIT_POLICY": "PASSIVE"}, ["PASSIVE", None]),  # the user's: no spin at all
        ({"GOMP_SPINCOUNT": "50"}, ["PASSIVE", "50"]),  # the user's spin count
    ],
)
def test_import_sets_the_wait_policy_unless_the_user_did(env, seen):
    """``import hotline`` sets the wait policy torch and Numba read when they load (a fresh process each:
    the runtimes read it once), and leaves a user's own policy alone."""
    import os
    import subprocess
    import sys

    import hotline

    base = {k: v for k, v in os.environ.items() if k not in hotline._WAIT_POLICY_VARS}
    probe = (
        "import json, os, hotline; print(json.dumps([os.environ.get(k) for k in hotline._WAIT_POLICY_VARS]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env={**base, **env}, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == seen
