"""The N-rank look-ahead step without host waits of its own (gloo, CPU): what each rank exchanges per step runs
off the main thread or overlapped with compute, and the result stays the sequential step's, bit for bit.

- The counts of distinct hot rows each rank sends are exchanged by the look-ahead thread (its group): the
  main thread runs no collective of sizes or counts during the steps (every collective's thread is recorded).
- The cold gradients go to their owners on the writer thread, started once the step's sparse update is done;
  the next step waits for them only after its popular micro-batch, before it first reads its working rows.
  With the writer held back on every step, the refresh of step j still runs only after steps < j were
  written back on that rank, rows of one rank's step t are in another rank's step t + 1, and the trained
  rows and dense parameters equal (``np.array_equal``) those of the same run whose every write-back finished
  before the next step started, on 2 and 3 ranks, on the CPU's update path and on CUDA's (run on the CPU). (Look-ahead 0 differs from look-ahead K in the last bits
  of the dense parameters on N ranks, as it did before the overlap.)
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from ranks import spawn
from small_data import hot_placement, zipf_dataset

from hotline import TrainConfig, Trainer
from hotline.datasets.format import Dataset

TABLES = [30, 200, 12, 500, 60, 5, 90, 40]
STEPS, BATCH, K = 16, 64, 2
HOLD_S = 0.02  # the writer's delay before each write-back: the next step's refresh must wait for it


def _config(placement: str, optimizer: str, lookahead: int) -> TrainConfig:
    return TrainConfig(mode="hotline", optimizer=optimizer, learning_rate=0.05, mini_batch_size=BATCH,
                       num_batches=STEPS, progress=False, placement_path=placement, lookahead=lookahead,
                       embedding_dim=8, bottom_mlp=[13, 32, 8], top_mlp=[32, 1])  # fmt: skip


class Recorder:
    """Records the thread and kind of every collective torch.distributed runs while ``on`` (calls go through)."""

    def __init__(self):
        import torch.distributed as dist

        self.on = False
        self.calls: list[tuple[str, str]] = []
        self._saved = {}
        for name in ("all_gather", "all_to_all_single", "all_reduce", "barrier"):
            self._saved[name] = fn = getattr(dist, name)
            setattr(dist, name, self._wrap(name, fn))

    def _wrap(self, name, fn):
        def recorded(*args, **kwargs):
            if self.on:
                self.calls.append((threading.current_thread().name, _kind(name, args, kwargs)))
            return fn(*args, **kwargs)

        return recorded

    def close(self) -> None:
        import torch.distributed as dist

        for name, fn in self._saved.items():
            setattr(dist, name, fn)


def _kind(name: str, args, kwargs) -> str:
    """``sizes`` (an all-gather of one int64 per rank), ``counts`` (an all-to-all of int64 counts, no splits) or
    the collective's name."""
    import torch

    if name == "all_gather" and args[1].dtype == torch.int64 and args[1].numel() == 1:
        return "sizes"
    if name == "all_to_all_single" and args[0].dtype == torch.int64 and len(args) < 3:
        if kwargs.get("output_split_sizes") is None:
            return "counts"
    return name


def _run(comm, tr: Trainer, hook) -> tuple[Trainer, list]:
    """Trains with look-ahead K through an Executor with the test ``hook``; returns the steps' stats."""
    from hotline.pipeline.executor import Executor

    ex = Executor(tr.mode, tr._compute_prepared, lookahead=K, hook=lambda point, step: hook(ex, point, step))
    stats = list(ex.progress(tr.batches()))
    assert len(stats) == STEPS
    return ex, stats


def _hold_writer(ex, point: str, step: int) -> None:
    if point == "write_back":
        time.sleep(HOLD_S)


def _serial(ex, point: str, step: int) -> None:
    if (
        point == "submitted"
    ):  # the main thread goes on once the step's write-back is done: nothing to wait for
        ex._wait_written(step + 1)


def _trainer(comm, placement: str, ds: Dataset, case: str) -> Trainer:
    """``case``: an optimizer, ``+device`` for CUDA's update path run on the CPU (distinct hot rows found on the
    host, torch ops, packed copies)."""
    optimizer, _, path = case.partition("+")
    tr = Trainer(_config(placement, optimizer, K), ds, comm)
    tr.mode.device_updates = tr.mode.pack_copies = path == "device"
    return tr


def _held_back(comm, placement: str, dataset: str, case: str, out: str) -> None:
    """Spawned rank: look-ahead K with the writer held back, recorded; then with each write-back done before
    the next step starts (the reference: the same arithmetic, no wait left to get wrong)."""
    ds = Dataset(dataset)
    tr = _trainer(comm, placement, ds, case)
    refreshes, fetched, recorder, ex = [], {}, Recorder(), None
    try:
        cold, refresh, fetch = tr.mode.cold, tr.mode.cold.refresh, tr.mode.cold.fetch

        def recorded_refresh(f, slots=None):
            refreshes.append((f.step, ex._written))  # steps written back on this rank when the refresh runs
            return refresh(f, slots)

        def recorded_fetch(rows, w, s, step=-1):
            if step >= 0:
                fetched[step] = rows.copy()
            return fetch(rows, w, s, step)

        def hook(executor, point, step):
            nonlocal ex
            ex = executor
            _hold_writer(executor, point, step)

        cold.refresh, cold.fetch = recorded_refresh, recorded_fetch
        recorder.on = True
        _, stats = _run(comm, tr, hook)
        recorder.on = False
        stale = sum(s.counters["stale_rows"] for s in stats)
        held = tr.named_arrays()
    finally:
        recorder.close()
        tr.close()
    ref = _trainer(comm, placement, ds, case)
    try:
        _run(comm, ref, _serial)
        serial = ref.named_arrays()
    finally:
        ref.close()
    rows = np.concatenate([fetched[j] for j in range(STEPS)])
    np.savez(f"{out}.{comm.rank}.npz", refreshes=np.asarray(refreshes), stale=stale, rows=rows,
             row_steps=np.repeat(np.arange(STEPS), [fetched[j].shape[0] for j in range(STEPS)]),
             threads=np.asarray([t for t, _ in recorder.calls]), kinds=np.asarray([k for _, k in recorder.calls]),
             **{f"held/{k}": v for k, v in held.items()}, **{f"serial/{k}": v for k, v in serial.items()})  # fmt: skip


def _all(comm, placement: str, dataset: str, root: str, optimizers: tuple[str, ...]) -> None:
    for optimizer in optimizers:
        _held_back(comm, placement, dataset, optimizer, f"{root}/{optimizer}-{comm.world_size}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("overlap")
    ds = zipf_dataset(root / "ds", BATCH * STEPS + 200, 3, TABLES)
    hot_placement(ds, root / "p.npz", 0.4, BATCH * 8, bytes_per_row=36)
    spawn(2, _all, str(root / "p.npz"), str(ds.path), str(root), ("sgd", "rowwise-adagrad", "adam+device"))
    spawn(3, _all, str(root / "p.npz"), str(ds.path), str(root), ("rowwise-adagrad",))
    return root


CASES = [("sgd", 2), ("rowwise-adagrad", 2), ("adam+device", 2), ("rowwise-adagrad", 3)]


@pytest.mark.parametrize("optimizer,world", CASES, ids=[f"{o}-{n}" for o, n in CASES])
def test_held_back_write_backs_train_like_serial_ones(runs, optimizer, world):
    for rank in range(world):
        z = np.load(runs / f"{optimizer}-{world}.{rank}.npz")
        held = sorted(k for k in z.files if k.startswith("held/"))
        assert any("embedding.table_" in k for k in held) and any("model." in k for k in held)
        for k in held:
            assert np.array_equal(z[k], z[k.replace("held/", "serial/")]), (rank, k)
        assert z["stale"] > 0  # the owners flagged rows an earlier step was still to update
        steps, written = z["refreshes"].T
        np.testing.assert_array_equal(steps, np.arange(STEPS))
        assert (written >= steps).all(), z["refreshes"]  # every earlier update landed before the re-read


@pytest.mark.parametrize("optimizer,world", CASES, ids=[f"{o}-{n}" for o, n in CASES])
def test_a_row_of_one_ranks_step_is_in_anothers_next_step(runs, optimizer, world):
    z = [np.load(runs / f"{optimizer}-{world}.{r}.npz") for r in range(world)]
    shared = 0
    for a in range(world):
        for b in range(world):
            if a != b:
                for t in range(STEPS - 1):
                    now = z[a]["rows"][z[a]["row_steps"] == t]
                    shared += np.intersect1d(now, z[b]["rows"][z[b]["row_steps"] == t + 1]).size
    assert shared > 0


@pytest.mark.parametrize("optimizer,world", CASES, ids=[f"{o}-{n}" for o, n in CASES])
def test_the_main_thread_exchanges_no_sizes_during_the_steps(runs, optimizer, world):
    for rank in range(world):
        z = np.load(runs / f"{optimizer}-{world}.{rank}.npz")
        main = z["kinds"][z["threads"] == "MainThread"]
        assert main.size and not set(main) & {"sizes", "counts"}, sorted(set(main))
        ahead = z["kinds"][z["threads"] == "hotline-prepare"]
        assert (ahead == "sizes").sum() == STEPS  # the hot rows' counts, once per step, ahead
