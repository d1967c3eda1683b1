"""The training modes on CUDA: device vs hybrid vs hotline K=0 / K=2, SGD and row-wise Adagrad, with stale
rows in the look-ahead runs; in-place pinning of the cold tier. Skipped without CUDA (CI has none).

On the GPU the sparse updates use ``index_add_`` (atomics: summation order varies between runs), so the
modes agree within a tolerance, not bit for bit."""

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from hotline import TrainConfig, Trainer  # noqa: E402
from hotline.datasets.format import Dataset  # noqa: E402
from hotline.datasets.synthetic import generate  # noqa: E402
from tests.test_equivalence import ARCH, BATCH, STEPS, TABLES, _placement, assert_equivalent  # noqa: E402

RTOL = 2e-5  # float32 atomics reorder sums; measured well below this on the CPU twin of every path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuda")
    rows = BATCH * STEPS * 7 // 6 + 200
    return Dataset(generate(root / "ds", rows, seed=3, table_sizes=TABLES, zipf=1.3, progress=False))


def _run_cuda(ds, mode, optimizer, placement=None, lookahead=0):
    cfg = TrainConfig(mode=mode, optimizer=optimizer, learning_rate=0.05, mini_batch_size=BATCH,
                      num_batches=STEPS, progress=False, placement_path=placement, lookahead=lookahead,
                      device="cuda", **ARCH)  # fmt: skip
    tr = Trainer(cfg, ds)
    try:
        stats = list(tr.progress(tr.batches()))
        return np.array([s.loss_sum for s in stats]), tr.named_arrays(), stats
    finally:
        tr.close()


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise-adagrad"])
@pytest.mark.parametrize("mode,lookahead", [("hybrid", 0), ("hotline", 0), ("hotline", 2)])
def test_modes_equal_device_on_cuda(dataset, tmp_path, optimizer, mode, lookahead):
    path = _placement(dataset, "profiled", optimizer, tmp_path / "p.npz") if mode == "hotline" else None
    ref = _run_cuda(dataset, "device", optimizer)
    got = _run_cuda(dataset, mode, optimizer, path, lookahead)
    if lookahead:
        assert sum(s.counters["stale_rows"] for s in got[2]) > 0
    assert_equivalent(ref, got, rtol=RTOL)


def test_cold_tier_is_pinned_in_place():
    from hotline.tiers.cold_store import HostRows
    from hotline.tiers.sparse_optim import SparseOptimizer

    weights = np.random.default_rng(0).random((1000, 16), dtype=np.float32)
    before = weights.copy()
    rows = HostRows(weights, SparseOptimizer("rowwise-adagrad", 0.1), pin=True)
    try:
        assert rows.weight.is_pinned() and rows.weight.data_ptr() == weights.ctypes.data
        assert np.array_equal(rows.w, before)
        dev = rows.weight.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(dev.cpu(), torch.from_numpy(before))
    finally:
        rows.close()
    assert not rows.weight.is_pinned()
