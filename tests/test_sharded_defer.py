"""The sharded cold tier's deferred update (hotline.tiers.sharded_store, ``defer=True``, the training modes'):
``update`` only sums the gradients and stages them (no collective, no row changes); ``write_back`` sends them to
the owners, who update their rows to the same bits as the immediate store (``defer=False``, the torchrec
bridge's) with the rate of the step even when the schedule changed it since, and the bytes are counted once,
with the step. On 2 gloo ranks, with look-ahead's groups open (the
writer's group carries the exchange) and without. A look-ahead left open until the exit closes quietly.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from ranks import spawn

from hotline.tiers.sharded_store import ShardedColdStore
from hotline.tiers.sparse_optim import SparseOptimizer

ROWS, DIM = 40, 4


def _steps(comm, out: str, kind: str, lookahead: bool) -> None:
    N, r = comm.world_size, comm.rank
    opt = SparseOptimizer(kind, 0.1, dim=DIM)
    start = np.random.default_rng(0).normal(size=(ROWS, DIM)).astype(np.float32)
    stores = {d: ShardedColdStore(comm, start[r::N].copy(), opt, ROWS, defer=d) for d in (False, True)}
    sent = {}
    for defer, store in stores.items():
        with store.lookahead() if lookahead else _nothing():
            for step in range(4):
                rng = np.random.default_rng(10 * step + r)
                rows = np.unique(rng.integers(0, ROWS, 12))
                w = np.empty((rows.shape[0], DIM), np.float32)
                fetch = store.fetch(rows, w, np.empty(opt.state_shape(rows.shape[0]), np.float32))
                n = 30
                slot, pos = rng.integers(0, rows.shape[0], n), np.arange(n)
                grads = torch.from_numpy(rng.normal(size=(n, DIM)).astype(np.float32))
                before = store.host.all()[0].copy()
                comm.take_bytes()
                opt.set_lr(0.1 * (step + 1))  # the schedule's rate for this step
                store.update(fetch, opt, torch.from_numpy(w), torch.empty(0), slot, grads, pos)
                opt.set_lr(9.0)  # the next step's rate, set before this step's write-back
                sent.setdefault(defer, []).append(comm.take_bytes().get("cold_grads", 0.0))
                if defer:  # staged only: nothing exchanged, no row changed yet
                    assert np.array_equal(store.host.all()[0], before)
                    assert fetch.route.grads is not None
                store.write_back(fetch, None, None)
                assert fetch.route.grads is None
                comm.take_bytes()
                comm.barrier()
    np.savez(f"{out}.{r}.npz", immediate=stores[False].host.all()[0], deferred=stores[True].host.all()[0],
             sent_immediate=sent[False], sent_deferred=sent[True])  # fmt: skip


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _all(comm, root: str) -> None:
    for kind in ("sgd", "rowwise-adagrad", "adam"):
        for lookahead in (False, True):
            _steps(comm, f"{root}/{kind}-{lookahead}", kind, lookahead)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("defer")
    spawn(2, _all, str(root))
    return root


@pytest.mark.parametrize("lookahead", [False, True])
@pytest.mark.parametrize("kind", ["sgd", "rowwise-adagrad", "adam"])
def test_the_deferred_update_equals_the_immediate_one(two_ranks, kind, lookahead):
    for rank in (0, 1):
        z = np.load(two_ranks / f"{kind}-{lookahead}.{rank}.npz")
        assert np.array_equal(z["immediate"], z["deferred"])
        assert not np.array_equal(z["deferred"], np.zeros_like(z["deferred"]))
        np.testing.assert_array_equal(z["sent_deferred"], z["sent_immediate"])  # counted once, with the step
        assert z["sent_deferred"].sum() > 0


def _look_ahead_left_open(comm) -> None:
    """A rank whose look-ahead is never closed (a prefetch pipeline that never calls ``stop_prefetching``)."""
    opt = SparseOptimizer("sgd", 0.1, dim=DIM)
    store = ShardedColdStore(comm, np.zeros((ROWS // 2, DIM), np.float32), opt, ROWS, defer=True)
    stack = contextlib.ExitStack()
    stack.enter_context(store.lookahead())
    stack.cycle = stack  # collected only after the ranks' teardown destroyed the default group


def test_a_look_ahead_left_open_closes_quietly_at_exit(capfd):
    """Its groups went with the default group: the exit prints no "Exception ignored"."""
    spawn(2, _look_ahead_left_open)
    err = capfd.readouterr().err
    assert "Exception ignored" not in err and "Invalid process group" not in err, err
