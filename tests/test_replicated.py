"""The replicated rows' update on N ranks (hotline.tiers.replicated): every replica the same bits, nothing read
back from the device.

- ``sum_in_rank_order`` equals a plain float32 sum in rank order bit for bit, whatever the slots' order;
- on 3 gloo ranks ``update_replicas``' torch path leaves bit-identical tables on every rank for every optimizer
  and stays within float32 reassociation of the CPU kernels' path;
- two and three ranks training device and hotline mode with the torch update (the CUDA path, run on the CPU)
  hold bit-identical replicas and equal one process;
- the torch path on meta tensors (any ``.item()``, ``.tolist()``, ``.cpu()``, ``torch.unique`` or ``nonzero``
  raises there) makes no read back and no copy to the host.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ranks import spawn

from hotline import TrainConfig, Trainer
from hotline.distributed.comm import Comm
from hotline.tiers.replicated import sum_in_rank_order, update_replicas
from hotline.tiers.sparse_optim import SparseOptimizer
from tests.test_distributed import ARCH, BATCH, _placement, assert_close

OPTIMIZERS = ("sgd", "rowwise-adagrad", "adagrad", "adam")
ROWS, DIM = 50, 4


def _parts(seed: int, ranks: int, padded: bool):
    """Per rank: distinct rows (or, ``padded``, rows with repeats whose extra slots carry zero gradients, as
    ``local_sums`` without host rows lays them out) and gradients."""
    rng = np.random.default_rng(seed)
    ids, grads = [], []
    for _ in range(ranks):
        u = rng.choice(ROWS, size=int(rng.integers(0, 30)), replace=False)
        g = rng.normal(size=(u.shape[0], DIM)).astype(np.float32) * 10.0 ** rng.integers(
            -3, 3, (u.shape[0], 1)
        )
        if padded and u.shape[0]:
            extra = rng.choice(u, size=int(rng.integers(0, 10)))
            u, g = (
                np.concatenate([u, extra]),
                np.concatenate([g, np.zeros((extra.shape[0], DIM), np.float32)]),
            )
        ids.append(u.astype(np.int64))
        grads.append(g.astype(np.float32))
    return ids, grads


@pytest.mark.parametrize("padded", [False, True])
def test_sum_in_rank_order_is_the_plain_rank_order_sum(padded):
    for seed in range(20):
        ids, grads = _parts(seed, 3, padded)
        want = {}
        for u, g in zip(ids, grads):  # rank order, one float32 add at a time
            for i, row in zip(u, g):
                want[int(i)] = want.get(int(i), np.zeros(DIM, np.float32)) + row
        all_ids, all_g = torch.from_numpy(np.concatenate(ids)), torch.from_numpy(np.concatenate(grads))
        sorted_ids, number, gsum = sum_in_rank_order(all_ids, all_g, [u.shape[0] for u in ids])
        U = len(want)
        assert int(number.max()) + 1 == U if U else True
        got_rows = sorted_ids.clone().index_copy_(0, number, sorted_ids)[:U].numpy()
        assert np.array_equal(got_rows, sorted(want))
        assert np.array_equal(gsum[:U].numpy(), np.stack([want[r] for r in sorted(want)]) if U else gsum[:0])
        assert not gsum[U:].any()


def _update_on_ranks(comm: Comm, out: str, kind: str, torch_update: bool, padded: bool) -> None:
    """5 updates of the same table on every rank, each rank with lookups of its own; saves this rank's table."""
    opt = SparseOptimizer(kind, 0.05, dim=DIM)
    table = torch.from_numpy(np.random.default_rng(0).normal(size=(ROWS, DIM)).astype(np.float32))
    state = opt.new_state(ROWS)
    for step in range(5):
        rng = np.random.default_rng(100 * step + comm.rank)
        n = int(rng.integers(0, 60)) if step else 0  # an empty rank in the first step
        ids = torch.from_numpy(rng.integers(0, ROWS, n))
        grads = torch.from_numpy(rng.normal(size=(n, DIM)).astype(np.float32))
        distinct = None
        if not padded:
            u, inv = np.unique(ids.numpy(), return_inverse=True)
            distinct = (torch.from_numpy(u), torch.from_numpy(inv.reshape(-1)))
        got = update_replicas(comm, opt, table, state, [ids] if n else [], [grads] if n else [], "t", distinct,
                              torch_update)  # fmt: skip
        assert got is None if torch_update and padded else isinstance(got, int)
    np.savez(f"{out}.{comm.rank}.npz", table=table.numpy(), state=state.numpy())


def _all_updates(comm: Comm, root: str) -> None:
    for kind in OPTIMIZERS:
        for torch_update, padded in ((True, False), (True, True), (False, False)):
            _update_on_ranks(comm, f"{root}/{kind}-{torch_update}-{padded}", kind, torch_update, padded)


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("replicated")
    spawn(3, _all_updates, str(root))
    return root


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_replicas_are_bit_identical_on_three_ranks(three_ranks, kind):
    def load(torch_update, padded, rank):
        z = np.load(three_ranks / f"{kind}-{torch_update}-{padded}.{rank}.npz")
        return z["table"], z["state"]

    kernel = load(False, False, 0)
    for padded in (False, True):
        mine = load(True, padded, 0)
        for rank in (1, 2):
            other = load(True, padded, rank)
            assert np.array_equal(mine[0], other[0]) and np.array_equal(mine[1], other[1]), (padded, rank)
        for a, b in zip(mine, kernel):  # the torch ops against the CPU kernels: float32 reassociation
            assert np.abs(a - b).max(initial=0) <= 1e-5 * max(1.0, float(np.abs(b).max(initial=0))), padded
    assert np.array_equal(load(True, False, 0)[0], load(True, True, 0)[0])  # host rows or a sort: same sums


def _train_torch_updates(comm: Comm, jobs) -> None:
    """Trains each job with the torch update (the CUDA path) on the CPU; every rank saves its replica."""
    for config, dataset, out in jobs:
        tr = Trainer(config, dataset, comm)
        try:
            tr.mode.device_updates = True
            for _ in tr.progress(tr.batches()):
                pass
            table = tr.mode.weight if config.mode == "device" else tr.mode.hot_w
            np.save(f"{out}.{comm.rank}.npy", table.detach().numpy())
            arrays = tr.named_arrays()  # a collective (the sharded tier's export)
            if comm.rank == 0:
                np.savez(f"{out}.npz", **arrays)
        finally:
            tr.close()


# (mode, optimizer, look-ahead, compared with one process within 1e-5 as tests/test_distributed.py does; Adam
# and Adagrad amplify rounding beyond that in a way tests/test_distributed_optimizers.py measures)
TRAIN_CASES = [
    ("device", "adam", 0, False),
    ("device", "sgd", 0, True),
    ("hotline", "rowwise-adagrad", 2, True),
    ("hotline", "adagrad", 0, False),
]


@pytest.mark.parametrize("ranks", [2, 3])
def test_training_with_the_torch_update_keeps_replicas_identical(tmp_path, ranks):
    from hotline.datasets.format import Dataset
    from hotline.datasets.synthetic import generate

    tables = [30, 200, 12, 500, 60, 5, 90, 40]
    ds = Dataset(generate(tmp_path / "ds", BATCH * 13, seed=3, table_sizes=tables, zipf=1.3, progress=False))
    place = _placement(ds, tmp_path / "p.npz")
    jobs = []
    for mode, opt, k, _ in TRAIN_CASES:
        config = TrainConfig(mode=mode, optimizer=opt, learning_rate=0.05, mini_batch_size=BATCH, num_batches=12,
                             progress=False, placement_path=place if mode == "hotline" else None, lookahead=k,
                             **ARCH)  # fmt: skip
        jobs.append((config, str(ds.path), str(tmp_path / f"{mode}-{opt}")))
    spawn(ranks, _train_torch_updates, jobs)
    for (*_, compare), (config, _, out) in zip(TRAIN_CASES, jobs):
        replicas = [np.load(f"{out}.{r}.npy") for r in range(ranks)]
        assert all(np.array_equal(replicas[0], r) for r in replicas[1:]), out
        if not compare:
            continue
        one = Trainer(config, ds)
        try:
            for _ in one.progress(one.batches()):
                pass
            ref = one.named_arrays()
        finally:
            one.close()
        got = np.load(f"{out}.npz")
        assert_close(ref, {k: got[k] for k in ref})


@pytest.mark.parametrize("kind", OPTIMIZERS)
@pytest.mark.parametrize("host_rows", [True, False])
def test_the_torch_update_reads_nothing_back(kind, host_rows):
    """With the device-side tensors on the meta device, any read back raises (``.item()``, ``.tolist()``,
    ``.cpu()``, ``torch.unique``, ``nonzero``, a boolean mask): the update runs through. The exchange runs with
    one rank here (a collective cannot carry meta tensors); its sizes travel on the host group
    (``Comm.all_gather_sizes``), as the tests above use on 3 ranks."""
    opt = SparseOptimizer(kind, 0.05, dim=DIM)
    u, inv = np.unique(np.array([3, 7, 3, 9, 7, 3]), return_inverse=True)
    dev = torch.device("meta")
    table = torch.zeros((ROWS, DIM), device=dev)
    state = torch.zeros(opt.state_shape(ROWS), device=dev)
    ids = torch.tensor([3, 7, 3, 9, 7, 3], device=dev)
    grads = torch.ones((6, DIM), device=dev)
    distinct = (
        (torch.tensor(u.tolist(), device=dev), torch.tensor(inv.tolist(), device=dev)) if host_rows else None
    )
    for _ in range(2):
        got = update_replicas(Comm(), opt, table, state, [ids], [grads], "t", distinct)
        assert got == (3 if host_rows else None)
