"""Look-ahead ordering races, with their windows held wide open: the executor stays exact.

Two orderings in hotline/pipeline/executor.py keep look-ahead exact and no timing pins them down:
1. a step is registered as live before its write-back is submitted (else the writer may finish and
   unregister it first, the late registration outlives the write-back, and a later step copies a stale row
   from that step's staging buffer after the producer reused the slot);
2. a staging slot is reused only after the write-back of the step that last used it finished (else the
   producer overwrites rows the writer has not stored yet).
The executor's test hook (``hook(point, step)``, None in production) lets these tests block one thread at
the named points until another has moved on, so each window is as wide as the pipeline allows. The runs
must equal device mode bit for bit (as an undisturbed look-ahead run does here; note that on this small
model the sequential executor, ``lookahead 0``, is not bit-identical to device mode: up to 1.2e-7).
"""

import threading

import numpy as np
import pytest

from hotline import TrainConfig, Trainer
from hotline.datasets.format import Dataset
from hotline.datasets.synthetic import generate
from hotline.pipeline.executor import Executor
from hotline.placement import Placement

K = 2
STEPS = 24


class Gate:
    """Records which (point, step) the executor's threads passed; lets a thread wait for another's point."""

    def __init__(self, hooks: dict):
        self.cond = threading.Condition()
        self.seen: set[tuple[str, int]] = set()
        self.hooks = hooks  # point -> fn(gate, step), run before the point is recorded

    def __call__(self, point: str, step: int) -> None:
        if point in self.hooks:
            self.hooks[point](self, step)
        with self.cond:
            self.seen.add((point, step))
            self.cond.notify_all()

    def wait(self, point: str, step: int, timeout: float | None = None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: (point, step) in self.seen, timeout)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("races")
    ds = Dataset(generate(root / "ds", 2000, seed=7, table_sizes=[50, 20, 300], zipf=1.2, progress=False))
    hot = [np.arange(n // 3) for n in ds.table_sizes]
    Placement.from_hot_ids(ds.table_sizes, hot, dataset_fingerprint=ds.fingerprint, embedding_dim=8).save(
        root / "p.npz"
    )

    def trainer(mode, lookahead=0):
        cfg = TrainConfig(
            mode=mode,
            placement_path=str(root / "p.npz") if mode != "device" else None,
            lookahead=lookahead,
            optimizer="rowwise-adagrad",
            learning_rate=0.05,
            embedding_dim=8,
            bottom_mlp=[13, 16, 8],
            top_mlp=[16, 1],
            mini_batch_size=32,
            progress=False,
            num_batches=STEPS,
        )
        return Trainer(cfg, ds)

    def reference(mode, lookahead=0):
        tr = trainer(mode, lookahead)
        try:
            list(tr.progress(tr.batches()))
            return tr.named_arrays()
        finally:
            tr.close()

    return trainer, reference("device")


def _run_with(trainer, hooks):
    tr = trainer("hotline", K)
    gate = Gate(hooks)
    try:
        ex = Executor(tr.mode, tr._compute_prepared, lookahead=K, hook=gate)
        stats = list(ex.progress(tr.batches()))
        assert len(stats) == STEPS
        return tr.named_arrays(), stats, gate, ex.ring
    finally:
        tr.close()


def _assert_equal(ref, got, what):
    for name, a in ref.items():
        assert np.array_equal(a, got[name]), (
            f"{name} differs from {what}: max {np.abs(a - got[name]).max():.3e}"
        )


def test_step_is_live_before_its_write_back(setup):
    """The writer stores step i only once step i + K + 1 was fetched (its rows claimed while step i was still
    in flight: flagged stale, forwarded from step i's buffer), and the main thread goes on only after step i
    was written back; a registration after the submit would then outlive the write-back."""
    trainer, device = setup
    last = STEPS - 1
    hooks = {
        "write_back": lambda g, i: g.wait("prepared", min(i + K + 1, last)),
        "submitted": lambda g, i: g.wait("written", i),
    }
    got, stats, gate, _ = _run_with(trainer, hooks)
    assert all(("written", i) in gate.seen for i in range(STEPS))
    # the window was used: rows were flagged stale, and their holders were written back (no longer live) by
    # the time they were read again, so none may be forwarded from a staging buffer
    assert sum(s.counters["stale_rows"] for s in stats) > 0
    assert sum(s.counters["stale_forwarded"] for s in stats) == 0
    _assert_equal(device, got, "device mode")


def test_slot_reused_only_after_its_write_back(setup):
    """The writer holds step i's rows until the producer has prepared the step that reuses step i's slot, or
    for HOLD_S when (as it must) the producer waits for this write-back. The hold only widens the window: a
    slow machine narrows it and never fails a correct executor."""
    trainer, device = setup
    hold_s = 0.3
    reused = []

    def write_back(g, i):
        if g.wait("prepared", i + ring[0], hold_s):
            reused.append(i)

    ring = [0]
    hooks = {"write_back": write_back}

    tr = trainer("hotline", K)
    ring[0] = len(tr.mode._staging)
    tr.close()
    got, stats, gate, _ = _run_with(trainer, hooks)
    assert reused == []  # no slot was prepared into before its last step's write-back
    assert sum(s.counters["stale_rows"] for s in stats) > 0
    _assert_equal(device, got, "device mode")
